"""A simulated device's record (``$EDGEKIT_HOME/sim/NAME/state.json``), readable without the
simulator itself: `devices check` reads a device's simulator limits from it, and the simulator
(``devices/sim_device.py``, which builds inventory entries) writes it."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from ..paths import sim_root


class SimState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    mode: Literal["netns", "loopback"]
    target: str
    host: str
    port: int
    pid: int
    sshd_config: str
    index: int | None = None
    netns: dict | None = None
    cgroups: list[str] = []
    cpu_quota: float | None = None
    memory_bytes: int | None = None
    notes: list[str] = []
    arch: Literal["native", "arm64"] = "native"  # arm64: a chroot'd Debian arm64 twin (edgekit/devices/sim_arm64.py)
    rootfs: str | None = None  # the cached rootfs an arm64 twin runs on


def state_file(name: str) -> Path:
    return sim_root() / name / "state.json"


def load_states() -> list[SimState]:
    out = []
    if sim_root().is_dir():
        for f in sorted(sim_root().glob("*/state.json")):
            try:
                out.append(SimState.model_validate_json(f.read_text(encoding="utf-8")))
            except ValueError:
                continue  # half-written by a crashed `sim up`: `sim down NAME` still cleans the folder
    return out


def find_state(name: str) -> SimState | None:
    return next((s for s in load_states() if s.name == name), None)


__all__ = ["SimState", "state_file", "load_states", "find_state", "sim_root"]
