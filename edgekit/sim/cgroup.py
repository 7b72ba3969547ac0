"""CPU and memory limits for a simulated device through cgroup v1 (this machine has no cgroup v2
``cpu.max``): ``cpu.cfs_quota_us`` over a 20 ms period, ``memory.limit_in_bytes``. Processes
join by PID before they exec, and their children inherit the group."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DeviceError
from .procs import kill_tree

CGROUP_ROOT = Path(os.environ.get("EDGEKIT_CGROUP_ROOT", "/sys/fs/cgroup"))
# A short period (20 ms, not the default 100 ms) spreads the quota finely, so an inference of a few ms is
# slowed by about 1/quota instead of running at full speed and then stalling for most of a long period.
PERIOD_US = 20_000


def parse_size(text: str) -> int:
    """'1G', '512M', '1048576' -> bytes."""
    t = text.strip().upper().removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        if t and t[-1] in mult:
            return int(float(t[:-1]) * mult[t[-1]])
        return int(t)
    except ValueError:
        raise DeviceError(f"cannot read memory size {text!r}", hint="use e.g. 512M or 1G") from None


@dataclass
class Cgroups:
    name: str
    paths: list[str] = field(default_factory=list)  # the group folders made, to join and remove

    def join(self, pid: int | None = None) -> None:
        for p in self.paths:
            Path(p, "cgroup.procs").write_text(str(pid or os.getpid()))

    def remove(self) -> None:
        """Stop what is still inside (by PID) and remove the groups."""
        for p in self.paths:
            d = Path(p)
            if not d.is_dir():
                continue
            for _ in range(50):
                try:
                    pids = [int(x) for x in (d / "cgroup.procs").read_text().split()]
                except OSError:
                    pids = []
                if not pids:
                    break
                for pid in pids:
                    kill_tree(pid, wait_s=1.0)
                time.sleep(0.05)
            try:
                d.rmdir()
            except OSError:
                time.sleep(0.2)
                d.rmdir()


def available() -> bool:
    return os.geteuid() == 0 and (CGROUP_ROOT / "cpu" / "cpu.cfs_quota_us").is_file()


def create(name: str, *, cpu_quota: float | None, memory_bytes: int | None) -> Cgroups:
    """``cpu_quota`` is in cores (0.25 = a quarter of one core)."""
    cg = Cgroups(name)
    try:
        if cpu_quota is not None:
            d = CGROUP_ROOT / "cpu" / name
            d.mkdir(exist_ok=True)
            cg.paths.append(str(d))
            (d / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (d / "cpu.cfs_quota_us").write_text(str(max(1000, int(cpu_quota * PERIOD_US))))  # kernel minimum 1 ms
        if memory_bytes is not None:
            d = CGROUP_ROOT / "memory" / name
            d.mkdir(exist_ok=True)
            cg.paths.append(str(d))
            (d / "memory.limit_in_bytes").write_text(str(memory_bytes))
    except OSError as exc:
        cg.remove()
        raise DeviceError(f"cannot set up cgroup {name}: {exc}",
                          hint="needs root and cgroup v1 cpu/memory controllers under /sys/fs/cgroup") from exc
    return cg
