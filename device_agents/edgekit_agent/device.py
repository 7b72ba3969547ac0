"""What the device is and how it is doing: CPU, cores and the CPU this process may use now (affinity,
cgroup quota, run queue), clocks, temperatures, throttling (x86 counters, the Pi's vcgencmd), load."""

from __future__ import annotations

import hashlib
import os
import platform
import time

from .protocol import Doc


def read_text(path: str, default: str | None = None) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return default


def _cpu_model() -> str | None:
    text = read_text("/proc/cpuinfo", "") or ""
    for line in text.splitlines():
        key = line.split(":", 1)[0].strip().lower()
        if key in ("model name", "hardware", "cpu model", "processor") and ":" in line:
            value = line.split(":", 1)[1].strip()
            if value and not value.isdigit():
                return value
    return platform.processor() or None


def temperatures_c(root: str = "/") -> dict[str, float]:
    """Every thermal zone's temperature in degrees C (kernel reports millidegrees)."""
    base = os.path.join(root, "sys/class/thermal")
    temps: dict[str, float] = {}
    try:
        zones = sorted(z for z in os.listdir(base) if z.startswith("thermal_zone"))
    except OSError:
        return temps
    for z in zones:
        raw = read_text(os.path.join(base, z, "temp"))
        if raw is None:
            continue
        try:
            kind = read_text(os.path.join(base, z, "type"), z) or z
            temps[kind] = int(raw) / 1000.0
        except ValueError:
            continue
    return temps


def _cpu_dirs(root: str = "/") -> list[str]:
    base = os.path.join(root, "sys/devices/system/cpu")
    try:
        names = os.listdir(base)
    except OSError:
        return []
    cpus = [n for n in names if n.startswith("cpu") and n[3:].isdigit()]
    return [os.path.join(base, n) for n in sorted(cpus, key=lambda n: int(n[3:]))]


def _throttle_events(root: str = "/") -> int | None:
    """x86 thermal throttle event counters summed over CPUs (None where the kernel has none)."""
    total, seen = 0, False
    for d in _cpu_dirs(root):
        for f in ("core_throttle_count", "package_throttle_count"):
            raw = read_text(os.path.join(d, "thermal_throttle", f))
            if raw is not None and raw.isdigit():
                total += int(raw)
                seen = True
    return total if seen else None


# vcgencmd get_throttled bits (Raspberry Pi firmware): 0-3 now, 16-19 since boot.
THROTTLE_BITS = {0: "under-voltage", 1: "arm frequency capped", 2: "throttled", 3: "soft temperature limit"}


def decode_throttled(value: int) -> dict[str, list[str]]:
    """{'now': [...], 'since_boot': [...]} from the get_throttled bit field."""
    return {
        "now": [name for b, name in THROTTLE_BITS.items() if value & (1 << b)],
        "since_boot": [name for b, name in THROTTLE_BITS.items() if value & (1 << (b + 16))],
    }


def _vcgencmd() -> Doc | None:
    """The Pi firmware's view (throttle flags, SoC temperature, ARM clock); None off a Pi."""
    import shutil
    import subprocess

    exe = shutil.which("vcgencmd")
    if not exe:
        return None
    out: Doc = {}
    for key, args in (
        ("throttled", ["get_throttled"]),
        ("temp", ["measure_temp"]),
        ("arm_clock", ["measure_clock", "arm"]),
    ):
        try:
            res = subprocess.run([exe] + args, capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.SubprocessError) as exc:
            out.setdefault("errors", []).append(f"vcgencmd {' '.join(args)}: {exc}")
            continue
        text = res.stdout.strip()
        if res.returncode != 0 or "=" not in text:
            out.setdefault("errors", []).append(
                f"vcgencmd {' '.join(args)}: exit {res.returncode} {(res.stderr or text).strip()[:120]}"
            )
            continue
        value = text.split("=", 1)[1].strip()
        try:
            if key == "throttled":
                bits = int(value, 16)
                out["throttled"] = hex(bits)
                out["throttled_flags"] = decode_throttled(bits)
            elif key == "temp":
                out["temperature_c"] = float(value.rstrip("'C").rstrip("C").rstrip("'"))
            else:
                out["arm_mhz"] = int(value) / 1e6
        except ValueError:
            out.setdefault("errors", []).append(f"vcgencmd {' '.join(args)}: cannot parse {text!r}")
    return out


def _cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies over all CPUs from /proc/stat, or None where it is not readable."""
    line = (read_text("/proc/stat", "") or "").split("\n", 1)[0].split()
    if not line or line[0] != "cpu":
        return None
    vals = [int(v) for v in line[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    return sum(vals[:8]) - idle, sum(vals[:8])


class BusyMeter:
    """How much CPU *other* processes used while we measured: a busy device inflates latency."""

    def __init__(self) -> None:
        self.j0 = _cpu_jiffies()
        self.self0 = sum(os.times()[:2])
        self.t0 = time.perf_counter()

    def other_cpu_fraction(self) -> float | None:
        j1 = _cpu_jiffies()
        if self.j0 is None or j1 is None:
            return None
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        busy_s = (j1[0] - self.j0[0]) / float(hz)
        mine_s = sum(os.times()[:2]) - self.self0
        wall = time.perf_counter() - self.t0
        cores = os.cpu_count() or 1
        if wall * cores * hz < 100:
            return None  # under ~100 ticks the jiffy counters are too coarse to say anything
        return max(0.0, (busy_s - mine_s) / (wall * cores))


def device_state(root: str = "/") -> Doc:
    """Governor, clocks, temperatures, throttle counters and load: taken before and after a run."""
    cpu0 = os.path.join(root, "sys/devices/system/cpu/cpu0/cpufreq")
    freq = read_text(os.path.join(cpu0, "scaling_cur_freq"))
    temps = temperatures_c(root)
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    freqs = {}
    for d in _cpu_dirs(root):
        f = read_text(os.path.join(d, "cpufreq", "scaling_cur_freq"))
        if f and f.isdigit():
            freqs[os.path.basename(d)] = int(f) / 1000.0
    vc = _vcgencmd()
    if vc and vc.get("temperature_c") is not None:
        temps.setdefault("vcgencmd", vc["temperature_c"])
    return {
        "governor": read_text(os.path.join(cpu0, "scaling_governor")),
        "frequency_mhz": int(freq) / 1000.0 if freq and freq.isdigit() else None,
        "frequencies_mhz": freqs,
        "temperature_c": max(temps.values()) if temps else None,
        "temperatures_c": temps,
        "loadavg": list(load) if load else None,
        "throttle_events": _throttle_events(root),
        "vcgencmd": vc,
    }


def state_warnings(before: Doc | None, after: Doc | None, other_cpu: float | None) -> list[str]:
    """Plain-language warnings when the device throttled or was busy during the run."""
    out = []
    vb, va = (before or {}).get("vcgencmd") or {}, (after or {}).get("vcgencmd") or {}
    fa = va.get("throttled_flags") or {}
    fb = vb.get("throttled_flags") or {}
    new_since = [f for f in fa.get("since_boot", []) if f not in fb.get("since_boot", [])]
    if fa.get("now") or new_since:
        out.append(
            f"the device throttled during the run (vcgencmd get_throttled {va.get('throttled')}: "
            f"{', '.join(sorted(set(fa.get('now', []) + new_since)))}); latency is not representative"
        )
    tb, ta = (before or {}).get("throttle_events"), (after or {}).get("throttle_events")
    if tb is not None and ta is not None and ta > tb:
        out.append(f"the CPU recorded {ta - tb} thermal throttle event(s) during the run")
    if other_cpu is not None and other_cpu > BUSY_OTHER_CPU:
        out.append(
            f"the device was busy: other processes used {other_cpu:.0%} of its CPU during the run; "
            "latency may be inflated"
        )
    return out


BUSY_OTHER_CPU = 0.15  # other processes' share of all CPUs above which the device counts as busy


def _cgroup_quota_cores(root: str = "/") -> float | None:
    """This process's CPU quota in cores (cgroup v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``), None when
    unlimited or unreadable: a container or a sim board held to 25% of a core has 0.25, whatever
    os.cpu_count() says."""
    rel = {}
    for line in (read_text(os.path.join(root, "proc/self/cgroup")) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for ctrl in parts[1].split(",") if parts[1] else [""]:
                rel[ctrl] = parts[2].lstrip("/")
    base = os.path.join(root, "sys/fs/cgroup")
    best: float | None = None
    v2 = rel.get("")
    if v2 is not None and os.path.isfile(os.path.join(base, "cgroup.controllers")):
        parts = v2.split("/") if v2 else []
        for i in range(len(parts), -1, -1):  # every level up to the root limits it
            raw = read_text(os.path.join(base, *parts[:i], "cpu.max"))
            if raw and not raw.startswith("max"):
                quota, _, per = raw.partition(" ")
                try:
                    c = int(quota) / float(per or 100000)
                except ValueError:
                    continue
                best = c if best is None else min(best, c)
        return best
    v1 = rel.get("cpu") if "cpu" in rel else rel.get("cpu,cpuacct")
    if v1 is None:
        return None
    parts = v1.split("/") if v1 else []
    for d in ("cpu", "cpu,cpuacct"):
        if not os.path.isdir(os.path.join(base, d)):
            continue
        for i in range(len(parts), -1, -1):
            try:
                q = int(read_text(os.path.join(base, d, *parts[:i], "cpu.cfs_quota_us")) or "")
                period = int(read_text(os.path.join(base, d, *parts[:i], "cpu.cfs_period_us")) or "")
            except ValueError:
                continue
            if q > 0 and period > 0:
                best = q / float(period) if best is None else min(best, q / float(period))
        return best
    return best


def _procs_running(root: str = "/") -> int | None:
    """Runnable tasks on the machine right now (``procs_running`` in /proc/stat), this one included."""
    for line in (read_text(os.path.join(root, "proc/stat")) or "").splitlines():
        if line.startswith("procs_running "):
            try:
                return int(line.split()[1])
            except ValueError:
                return None
    return None


def cpu_budget(root: str = "/", samples: int = 5, interval: float = 0.01) -> Doc:
    """The CPU this process may use now: the cores of its affinity mask, capped by its cgroup quota
    (``usable``), and the other runnable tasks competing for them (the run queue less this process,
    median of a few quick samples). ``free`` = usable - others, never below 1 core's worth of work:
    threads beyond it spin-wait for cores other processes hold (the busy-host collapse)."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count() or 1
    quota = _cgroup_quota_cores(root)
    usable = min(float(affinity), quota) if quota else float(affinity)
    runs = []
    for i in range(max(1, samples)):
        r = _procs_running(root)
        if r is not None:
            runs.append(r)
        if i + 1 < samples:
            time.sleep(interval)
    others = None
    if runs:
        runs.sort()
        others = max(0, runs[len(runs) // 2] - 1)
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        load1 = None
    free = usable if others is None else max(0.0, usable - others)
    return {
        "affinity": affinity,
        "quota_cores": quota,
        "usable_cores": round(usable, 3),
        "others_running": others,
        "load1": round(load1, 2) if load1 is not None else None,
        "free_cores": round(free, 3),
        "threads": max(1, int(free + 1e-9)),
    }


def device_facts() -> Doc:
    return {
        "arch": platform.machine(),
        # Python < 3.13 on Android (Termux, boards) says "linux"; the system image gives it away
        "os": "android" if os.path.isfile("/system/build.prop") else platform.system().lower(),
        "os_release": platform.release(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        # what this agent may really use (affinity, cgroup quota) and how busy it is now: the search
        # tunes thread counts up to the free cores, not the target file's nominal count
        "cpu_budget": cpu_budget(),
        "hostname": platform.node(),
        "machine_id": _machine_id(),
    }


def _machine_id() -> str | None:
    """A stable, non-reversible id of this machine (keys the host's measurement cache)."""
    for p in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        raw = read_text(p)
        if raw:
            return hashlib.sha256(raw.encode()).hexdigest()[:16]
    return None
