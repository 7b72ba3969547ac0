#!/usr/bin/env python3
"""edgekit's on-device agent.

Runs ON the device with only Python 3 (stdlib) and the runtime it drives (onnxruntime, or the
LiteRT interpreter; both bring numpy). It never imports edgekit.

    python3 edgekit_agent.py REQUEST.json          # measure one model variant
    python3 edgekit_agent.py --probe               # what this device is and can run
    python3 edgekit_agent.py --sha256 FILE...      # hashes of files (content-addressed delivery)

It prints exactly one JSON document on stdout; logs go to stderr. Raw per-run timings and every
output of the eval pass (an .npz, ``output_0``...) are returned; the host computes the statistics
and scores the task metric (the device needs nothing but Python and the runtime). Exit codes: 0 ok, 2 bad request or data,
4 runtime missing or model failed to load/run.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time

AGENT_VERSION = "0.1.0"
PROTOCOL = 2  # 2: every output comes back (an .npz); the host scores them

EXIT_BAD_REQUEST = 2
EXIT_RUNTIME = 4


class AgentFailure(Exception):
    def __init__(self, kind, message, exit_code):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.exit_code = exit_code


def _first_line(text, limit=300, prefer=()):
    """The first non-empty line of a runtime's message, or the first that names one of ``prefer``
    (LiteRT puts the failing node after lines about its internals)."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    telling = [ln for ln in lines if any(w in ln.lower() for w in prefer)]
    return ((telling or lines or [""])[0])[:limit]


def log(msg):
    print(f"[edgekit-agent] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- device facts
def _read(path, default=None):
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return default


def _cpu_model():
    text = _read("/proc/cpuinfo", "") or ""
    for line in text.splitlines():
        key = line.split(":", 1)[0].strip().lower()
        if key in ("model name", "hardware", "cpu model", "processor") and ":" in line:
            value = line.split(":", 1)[1].strip()
            if value and not value.isdigit():
                return value
    return platform.processor() or None


def _temperatures_c(root="/"):
    """Every thermal zone's temperature in degrees C (kernel reports millidegrees)."""
    base = os.path.join(root, "sys/class/thermal")
    temps = {}
    try:
        zones = sorted(z for z in os.listdir(base) if z.startswith("thermal_zone"))
    except OSError:
        return temps
    for z in zones:
        raw = _read(os.path.join(base, z, "temp"))
        if raw is None:
            continue
        try:
            kind = _read(os.path.join(base, z, "type"), z)
            temps[kind] = int(raw) / 1000.0
        except ValueError:
            continue
    return temps


def _cpu_dirs(root="/"):
    base = os.path.join(root, "sys/devices/system/cpu")
    try:
        names = os.listdir(base)
    except OSError:
        return []
    cpus = [n for n in names if n.startswith("cpu") and n[3:].isdigit()]
    return [os.path.join(base, n) for n in sorted(cpus, key=lambda n: int(n[3:]))]


def _throttle_events(root="/"):
    """x86 thermal throttle event counters summed over CPUs (None where the kernel has none)."""
    total, seen = 0, False
    for d in _cpu_dirs(root):
        for f in ("core_throttle_count", "package_throttle_count"):
            raw = _read(os.path.join(d, "thermal_throttle", f))
            if raw is not None and raw.isdigit():
                total += int(raw)
                seen = True
    return total if seen else None


# vcgencmd get_throttled bits (Raspberry Pi firmware): 0-3 now, 16-19 since boot.
THROTTLE_BITS = {0: "under-voltage", 1: "arm frequency capped", 2: "throttled", 3: "soft temperature limit"}


def decode_throttled(value):
    """{'now': [...], 'since_boot': [...]} from the get_throttled bit field."""
    return {"now": [name for b, name in THROTTLE_BITS.items() if value & (1 << b)],
            "since_boot": [name for b, name in THROTTLE_BITS.items() if value & (1 << (b + 16))]}


def _vcgencmd():
    """The Pi firmware's view (throttle flags, SoC temperature, ARM clock); None off a Pi."""
    import shutil
    import subprocess

    exe = shutil.which("vcgencmd")
    if not exe:
        return None
    out = {}
    for key, args in (("throttled", ["get_throttled"]), ("temp", ["measure_temp"]),
                      ("arm_clock", ["measure_clock", "arm"])):
        try:
            res = subprocess.run([exe] + args, capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.SubprocessError) as exc:
            out.setdefault("errors", []).append(f"vcgencmd {' '.join(args)}: {exc}")
            continue
        text = res.stdout.strip()
        if res.returncode != 0 or "=" not in text:
            out.setdefault("errors", []).append(f"vcgencmd {' '.join(args)}: exit {res.returncode} "
                                                f"{(res.stderr or text).strip()[:120]}")
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


def _cpu_jiffies():
    """(busy, total) jiffies over all CPUs from /proc/stat, or None where it is not readable."""
    line = (_read("/proc/stat", "") or "").split("\n", 1)[0].split()
    if not line or line[0] != "cpu":
        return None
    vals = [int(v) for v in line[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    return sum(vals[:8]) - idle, sum(vals[:8])


class BusyMeter:
    """How much CPU *other* processes used while we measured: a busy device inflates latency."""

    def __init__(self):
        self.j0 = _cpu_jiffies()
        self.self0 = sum(os.times()[:2])
        self.t0 = time.perf_counter()

    def other_cpu_fraction(self):
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


def device_state(root="/"):
    """Governor, clocks, temperatures, throttle counters and load: taken before and after a run."""
    cpu0 = os.path.join(root, "sys/devices/system/cpu/cpu0/cpufreq")
    freq = _read(os.path.join(cpu0, "scaling_cur_freq"))
    temps = _temperatures_c(root)
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    freqs = {}
    for d in _cpu_dirs(root):
        f = _read(os.path.join(d, "cpufreq", "scaling_cur_freq"))
        if f and f.isdigit():
            freqs[os.path.basename(d)] = int(f) / 1000.0
    vc = _vcgencmd()
    if vc and vc.get("temperature_c") is not None:
        temps.setdefault("vcgencmd", vc["temperature_c"])
    return {
        "governor": _read(os.path.join(cpu0, "scaling_governor")),
        "frequency_mhz": int(freq) / 1000.0 if freq and freq.isdigit() else None,
        "frequencies_mhz": freqs,
        "temperature_c": max(temps.values()) if temps else None,
        "temperatures_c": temps,
        "loadavg": list(load) if load else None,
        "throttle_events": _throttle_events(root),
        "vcgencmd": vc,
    }


def state_warnings(before, after, other_cpu):
    """Plain-language warnings when the device throttled or was busy during the run."""
    out = []
    vb, va = (before or {}).get("vcgencmd") or {}, (after or {}).get("vcgencmd") or {}
    fa = va.get("throttled_flags") or {}
    fb = vb.get("throttled_flags") or {}
    new_since = [f for f in fa.get("since_boot", []) if f not in fb.get("since_boot", [])]
    if fa.get("now") or new_since:
        out.append(f"the device throttled during the run (vcgencmd get_throttled {va.get('throttled')}: "
                   f"{', '.join(sorted(set(fa.get('now', []) + new_since)))}); latency is not representative")
    tb, ta = (before or {}).get("throttle_events"), (after or {}).get("throttle_events")
    if tb is not None and ta is not None and ta > tb:
        out.append(f"the CPU recorded {ta - tb} thermal throttle event(s) during the run")
    if other_cpu is not None and other_cpu > BUSY_OTHER_CPU:
        out.append(f"the device was busy: other processes used {other_cpu:.0%} of its CPU during the run; "
                   "latency may be inflated")
    return out


BUSY_OTHER_CPU = 0.15  # other processes' share of all CPUs above which the device counts as busy


def _cgroup_quota_cores(root="/"):
    """This process's CPU quota in cores (cgroup v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``), None when
    unlimited or unreadable: a container or a sim board held to 25% of a core has 0.25, whatever
    os.cpu_count() says."""
    rel = {}
    for line in (_read(os.path.join(root, "proc/self/cgroup")) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for ctrl in (parts[1].split(",") if parts[1] else [""]):
                rel[ctrl] = parts[2].lstrip("/")
    base = os.path.join(root, "sys/fs/cgroup")
    best = None
    v2 = rel.get("")
    if v2 is not None and os.path.isfile(os.path.join(base, "cgroup.controllers")):
        parts = v2.split("/") if v2 else []
        for i in range(len(parts), -1, -1):  # every level up to the root limits it
            raw = _read(os.path.join(base, *parts[:i], "cpu.max"))
            if raw and not raw.startswith("max"):
                q, _, period = raw.partition(" ")
                try:
                    c = int(q) / float(period or 100000)
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
            q, period = _read(os.path.join(base, d, *parts[:i], "cpu.cfs_quota_us")), \
                _read(os.path.join(base, d, *parts[:i], "cpu.cfs_period_us"))
            try:
                q, period = int(q), int(period)
            except (TypeError, ValueError):
                continue
            if q > 0 and period > 0:
                best = q / float(period) if best is None else min(best, q / float(period))
        return best
    return best


def _procs_running(root="/"):
    """Runnable tasks on the machine right now (``procs_running`` in /proc/stat), this one included."""
    for line in (_read(os.path.join(root, "proc/stat")) or "").splitlines():
        if line.startswith("procs_running "):
            try:
                return int(line.split()[1])
            except ValueError:
                return None
    return None


def cpu_budget(root="/", samples=5, interval=0.01):
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
    return {"affinity": affinity, "quota_cores": quota, "usable_cores": round(usable, 3),
            "others_running": others, "load1": round(load1, 2) if load1 is not None else None,
            "free_cores": round(free, 3), "threads": max(1, int(free + 1e-9))}


def device_facts():
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


def _machine_id():
    """A stable, non-reversible id of this machine (keys the host's measurement cache)."""
    for p in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        raw = _read(p)
        if raw:
            return hashlib.sha256(raw.encode()).hexdigest()[:16]
    return None


def available_runtimes():
    """{runtime name: version} of every runner in RUNNERS whose runtime imports on this device."""
    found = {}
    for name, cls in RUNNERS.items():
        version, reason = cls.probe()
        if version:
            found[name] = version
        elif reason and cls.log_missing:
            log(f"{name} unavailable: {reason}")
    return found


# --------------------------------------------------------------------------- memory
def memory_mb():
    """(current RSS, peak RSS) of this process in MB; VmHWM on Linux/Android, else getrusage."""
    status = _read("/proc/self/status")
    if status:
        vals = {}
        for line in status.splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                k, v = line.split(":", 1)
                vals[k] = int(v.split()[0]) / 1024.0
        if "VmHWM" in vals:
            return vals.get("VmRSS"), vals["VmHWM"], "VmHWM"
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak_mb = peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0
        return None, peak_mb, "ru_maxrss"
    except Exception:
        return None, None, None


def pss_mb():
    """Proportional set size (shared pages split between their users) from smaps_rollup: the
    figure Android's memory accounting uses. None where the kernel (< 4.14) or policy hides it."""
    text = _read("/proc/self/smaps_rollup")
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024.0
    return None


def runtime_arena(runner):
    """The runtime's own allocation figure when the runner exposes one (``arena_bytes()``);
    neither onnxruntime's nor LiteRT's Python API does today, so this is usually a reason."""
    fn = getattr(runner, "arena_bytes", None)
    if fn is None:
        return None, f"{getattr(runner, 'name', 'the runtime')}'s Python API does not expose its arena size"
    try:
        n = fn()
    except Exception as exc:  # a runner bug must not cost the whole measurement
        return None, f"arena_bytes() failed: {exc}"
    return (n / (1024.0 * 1024.0) if n is not None else None), None


# --------------------------------------------------------------------------- energy
# Readers of every energy source a device may have. A reader is "power" (read() -> watts now) or
# "energy" (read() -> cumulative joules). EnergyUnavailable carries the reason into the report.
ENERGY_SOURCES = ("rapl", "hwmon", "android_battery", "external_command")
DEFAULT_SAMPLE_HZ = 50.0
DEFAULT_BASELINE_S = 1.0


class EnergyUnavailable(Exception):
    pass


def _read_int_strict(path):
    with open(path, encoding="ascii") as fh:
        return int(fh.read().strip())


class _WrappingCounter:
    """A sysfs energy counter in µJ that wraps to 0 at max_energy_range_uj (RAPL)."""

    def __init__(self, path, max_range):
        self.path, self.max_range = path, max_range
        self.last, self.offset, self.wraps = None, 0, 0

    def read_uj(self):
        raw = _read_int_strict(self.path)
        if self.last is not None and raw < self.last:
            if not self.max_range:
                raise EnergyUnavailable(f"{self.path} went backwards and max_energy_range_uj is unknown")
            # One wrap between two samples; sampling at >= 1 Hz keeps that true (RAPL wraps after minutes).
            self.offset += self.max_range
            self.wraps += 1
        self.last = raw
        return raw + self.offset


class RaplReader:
    """Intel/AMD RAPL through powercap: package zones (+ DRAM), or psys when the platform has it."""

    name, kind = "rapl", "energy"

    def __init__(self, root="/", **_):
        base = os.path.join(root, "sys/class/powercap")
        try:
            entries = sorted(os.listdir(base))
        except OSError:
            raise EnergyUnavailable(f"{base} does not exist (no powercap RAPL driver on this kernel/CPU)")
        zones = []
        for e in entries:
            parts = e.split(":")
            if parts[0] != "intel-rapl" or len(parts) not in (2, 3):
                continue  # intel-rapl-mmio duplicates the package zone
            zname = _read(os.path.join(base, e, "name"), e)
            if len(parts) == 2 or zname == "dram":
                zones.append((e, zname))
        if any(z == "psys" for _, z in zones):
            zones = [(e, z) for e, z in zones if z == "psys"]  # psys already includes the packages
        if not zones:
            raise EnergyUnavailable(f"{base} has no intel-rapl zone")
        self.counters, self.domains = [], []
        for e, zname in zones:
            path = os.path.join(base, e, "energy_uj")
            try:
                _read_int_strict(path)
            except PermissionError:
                raise EnergyUnavailable(f"{path} is readable only by root (kernels since 5.10); run the agent "
                                        "as root or grant read access (chmod o+r)")
            except (OSError, ValueError) as exc:
                raise EnergyUnavailable(f"cannot read {path}: {exc}")
            rng = _read(os.path.join(base, e, "max_energy_range_uj"))
            self.counters.append(_WrappingCounter(path, int(rng) if rng and rng.isdigit() else None))
            self.domains.append(f"{e} ({zname})")

    def read(self):
        return sum(c.read_uj() for c in self.counters) / 1e6

    def details(self):
        return {"domains": self.domains, "wraps": sum(c.wraps for c in self.counters)}


# Labels of a sensor channel that measures the whole board's input (summing the rails would double count).
_TOTAL_LABELS = ("vdd_in", "pom_5v_in", "vin", "total", "sys_in")


class HwmonReader:
    """hwmon power sensors: power*_input (µW), or bus voltage in*_input (mV) x curr*_input (mA) by
    channel. INA3221 (Jetson) exposes channels 1-3 as in/curr pairs (in4-6 are shunt voltages);
    INA219/INA226 (ina2xx) expose power1_input. Channels: ``channels`` (labels) when given, else a
    board-input channel (VDD_IN...) when one exists, else all channels summed."""

    name, kind = "hwmon", "power"

    def __init__(self, root="/", sensor=None, channels=None, **_):
        base = os.path.join(root, "sys/class/hwmon")
        try:
            devs = sorted(d for d in os.listdir(base) if d.startswith("hwmon"))
        except OSError:
            raise EnergyUnavailable(f"{base} does not exist (no hwmon sensors)")
        found = []  # (label, kind, paths)
        names = []
        for d in devs:
            path = os.path.join(base, d)
            dname = _read(os.path.join(path, "name"), d)
            names.append(dname)
            if sensor and dname != sensor:
                continue
            try:
                files = set(os.listdir(path))
            except OSError:
                continue
            power = sorted(f for f in files if f.startswith("power") and f.endswith("_input"))
            chans = []
            for f in power:
                idx = f[len("power"):-len("_input")]
                label = _read(os.path.join(path, f"power{idx}_label")) or f"{dname}/power{idx}"
                chans.append((label, "uW", [os.path.join(path, f)]))
            if not chans:
                for f in sorted(files):
                    if not (f.startswith("curr") and f.endswith("_input")):
                        continue
                    idx = f[len("curr"):-len("_input")]
                    if dname == "ina3221" and idx not in ("1", "2", "3"):
                        continue  # curr4 is the summed-shunt channel; in4-6 are shunt voltages
                    if f"in{idx}_input" not in files:
                        continue
                    label = (_read(os.path.join(path, f"in{idx}_label")) or _read(os.path.join(path, f"curr{idx}_label"))
                             or f"{dname}/ch{idx}")
                    chans.append((label, "mV*mA", [os.path.join(path, f"in{idx}_input"), os.path.join(path, f)]))
            found += [(f"{dname}:{lab}" if not lab.startswith(dname) else lab, lab, k, p) for lab, k, p in chans]
        if not found:
            what = f"sensor '{sensor}'" if sensor else "sensor"
            raise EnergyUnavailable(f"no hwmon {what} with power*_input or in*/curr*_input pairs in {base} "
                                    f"(sensors: {', '.join(names) or 'none'})")
        if channels:
            want = set(channels)
            chosen = [c for c in found if c[1] in want or c[0] in want]
            if len(chosen) != len(want):
                raise EnergyUnavailable(f"hwmon channels {sorted(want)} not all found; available: "
                                        f"{[c[1] for c in found]}")
            rule = "channels named in the request"
        else:
            totals = [c for c in found if c[1].strip().lower() in _TOTAL_LABELS]
            chosen, rule = (totals, "board input channel") if totals else (found, "sum of all channels")
        self.channels = [(full, k, p) for full, _, k, p in chosen]
        self.rule = rule
        self.read()  # fail now, with the reason, rather than in the sampler

    def read(self):
        total = 0.0
        try:
            for _, k, paths in self.channels:
                if k == "uW":
                    total += _read_int_strict(paths[0]) / 1e6
                else:
                    total += _read_int_strict(paths[0]) * _read_int_strict(paths[1]) / 1e6
        except PermissionError as exc:
            raise EnergyUnavailable(f"{exc.filename} is not readable by this user")
        except (OSError, ValueError) as exc:
            raise EnergyUnavailable(f"cannot read hwmon sensor: {exc}")
        return total

    def details(self):
        return {"channels": [c[0] for c in self.channels], "rule": self.rule}


class AndroidBatteryReader:
    """Battery current x voltage from power_supply (current_now µA, voltage_now µV). Devices differ
    in the sign of a discharging current: it is calibrated from the idle baseline, taken while the
    battery reports Discharging (or set with ``sign``: "discharge_positive" | "discharge_negative")."""

    name, kind = "android_battery", "power"

    def __init__(self, root="/", sign=None, current_unit=None, **_):
        base = os.path.join(root, "sys/class/power_supply")
        try:
            supplies = sorted(os.listdir(base))
        except OSError:
            raise EnergyUnavailable(f"{base} does not exist (no power_supply class)")
        cands = [s for s in supplies if s == "battery"] + [
            s for s in supplies if s != "battery" and (_read(os.path.join(base, s, "type")) or "") == "Battery"]
        self.path = None
        for s in cands:
            p = os.path.join(base, s)
            if os.path.exists(os.path.join(p, "current_now")) and os.path.exists(os.path.join(p, "voltage_now")):
                self.path = p
                break
        if self.path is None:
            raise EnergyUnavailable(f"no battery with current_now and voltage_now in {base} "
                                    f"(supplies: {', '.join(supplies) or 'none'})")
        if sign not in (None, "discharge_positive", "discharge_negative"):
            raise EnergyUnavailable(f"android sign {sign!r}: use discharge_positive or discharge_negative")
        self.sign = {None: None, "discharge_positive": 1, "discharge_negative": -1}[sign]
        self.sign_source = "request" if sign else None
        if current_unit is None:
            # A phone awake draws >= 50 mA; |I| under 5000 only makes sense in mA (older kernels).
            try:
                i = abs(_read_int_strict(os.path.join(self.path, "current_now")))
            except (OSError, ValueError) as exc:
                raise EnergyUnavailable(f"cannot read the battery current: {exc}")
            current_unit = "mA" if 0 < i < 5000 else "uA"
        self.current_unit = current_unit
        self.status_before = self.status()
        if self.status_before in ("Charging", "Full"):
            raise EnergyUnavailable(
                f"the battery is {self.status_before.lower()}: the device runs on external power, so the battery "
                "current is not what it consumes; unplug USB (adb over Wi-Fi: `adb tcpip`) or use an external meter")
        if self.sign is None and self.status_before != "Discharging":
            raise EnergyUnavailable(f"battery status is {self.status_before!r}, not Discharging: the current's sign "
                                    "cannot be calibrated; set energy.android.sign in the request")
        self.read()

    def status(self):
        return _read(os.path.join(self.path, "status"), "Unknown")

    def read(self):
        """Signed raw power (W) as the device reports it; ``calibrate`` fixes the sign."""
        try:
            i = _read_int_strict(os.path.join(self.path, "current_now"))
            v = _read_int_strict(os.path.join(self.path, "voltage_now"))
        except (OSError, ValueError) as exc:
            raise EnergyUnavailable(f"cannot read the battery: {exc}")
        if v < 100000:  # some kernels report mV
            v *= 1000
        i_scale = 1000 if self.current_unit == "mA" else 1
        return i * i_scale * v / 1e12

    def calibrate(self, baseline_powers):
        """Fix the sign from the idle baseline (the battery discharges then); returns +1 or -1."""
        if self.sign is None:
            med = _median(baseline_powers) if baseline_powers else 0.0
            if med == 0:
                raise EnergyUnavailable("the battery current was 0 during the idle baseline: its sign cannot be "
                                        "calibrated (the device may be on external power)")
            self.sign = 1 if med > 0 else -1
            self.sign_source = "calibrated while Discharging"
        return self.sign

    def details(self):
        return {"supply": os.path.basename(self.path), "status": self.status_before,
                "sign": {1: "discharge_positive", -1: "discharge_negative"}.get(self.sign),
                "sign_source": self.sign_source, "current_unit": self.current_unit}


class ExternalCommandReader:
    """A user command (USB power meter, Joulescope script...) that prints cumulative joules as the
    first number on its last output line. Runs as an argv list, never through a shell."""

    name, kind = "external_command", "energy"
    default_hz = 1.0  # each read is a process start: sample slowly so the meter does not load the device

    def __init__(self, command=None, timeout=10.0, **_):
        import shlex

        if not command:
            raise EnergyUnavailable("no external meter command configured (energy.external_command in the request, "
                                    "`--energy-command` on the host)")
        self.argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
        self.timeout = float(timeout)
        self.read()

    def read(self):
        import subprocess

        try:
            res = subprocess.run(self.argv, capture_output=True, text=True, timeout=self.timeout)
        except (OSError, subprocess.SubprocessError) as exc:
            raise EnergyUnavailable(f"external meter command {self.argv[0]!r} failed to run: {exc}")
        lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
        if res.returncode != 0 or not lines:
            raise EnergyUnavailable(f"external meter command {self.argv[0]!r} exited {res.returncode} with "
                                    f"{'no output' if not lines else 'output'}: {(res.stderr or res.stdout).strip()[:200]}")
        try:
            return float(lines[-1].split()[0])
        except ValueError:
            raise EnergyUnavailable(f"external meter command printed {lines[-1][:80]!r}; expected cumulative "
                                    "joules as a number")

    def details(self):
        return {"command": self.argv[0]}


READERS = {"rapl": RaplReader, "hwmon": HwmonReader, "android_battery": AndroidBatteryReader,
           "external_command": ExternalCommandReader}


def open_energy_reader(cfg, root="/"):
    """The first source in the target's priority order that reads; (reader, reasons of the others)."""
    reasons = []
    sources = list(cfg.get("sources") or [])
    for src in sources:
        cls = READERS.get(src)
        if cls is None:
            reasons.append(f"{src}: unknown source (known: {', '.join(ENERGY_SOURCES)})")
            continue
        kwargs = {"root": root}
        if src == "hwmon":
            kwargs.update(sensor=cfg.get("hwmon_sensor"), channels=cfg.get("hwmon_channels"))
        elif src == "android_battery":
            a = cfg.get("android") or {}
            kwargs.update(sign=a.get("sign"), current_unit=a.get("current_unit"))
        elif src == "external_command":
            kwargs.update(command=cfg.get("external_command"), timeout=cfg.get("external_timeout", 10.0))
        try:
            return cls(**kwargs), reasons
        except EnergyUnavailable as exc:
            reasons.append(f"{src}: {exc}")
    return None, reasons


def _median(xs):
    s = sorted(xs)
    n = len(s)
    if not n:
        return None
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def _sem(xs):
    n = len(xs)
    if n < 2:
        return 0.0
    m = sum(xs) / n
    return (sum((x - m) ** 2 for x in xs) / (n - 1)) ** 0.5 / n ** 0.5


class EnergySampler:
    """Samples a reader in a background thread; ``mark()`` takes a synchronous sample at a phase
    boundary (baseline start, run start, run end) so every window has exact edges."""

    def __init__(self, reader, hz=DEFAULT_SAMPLE_HZ):
        import threading

        self.reader = reader
        self.period = 1.0 / max(0.1, float(hz))
        self.samples = []  # (t, value, read_seconds)
        self.error = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="edgekit-energy", daemon=True)

    def _sample(self):
        with self._lock:
            a = time.perf_counter()
            try:
                v = self.reader.read()
            except (OSError, ValueError) as exc:  # a sensor that vanishes mid-run costs the figure, not the run
                raise EnergyUnavailable(f"reading {self.reader.name} failed: {exc}") from exc
            b = time.perf_counter()
            self.samples.append(((a + b) / 2, v, b - a))
            return len(self.samples) - 1

    def _loop(self):
        while not self._stop.wait(self.period):
            try:
                self._sample()
            except EnergyUnavailable as exc:
                self.error = str(exc)
                return

    def start(self):
        self._thread.start()

    def mark(self):
        return self._sample()

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=30)


def window_energy(kind, samples):
    """(joules, seconds, per-sample or per-interval powers) over samples [(t, value, read_s)...]."""
    if len(samples) < 2:
        return None, None, []
    t = [s[0] for s in samples]
    v = [s[1] for s in samples]
    seconds = t[-1] - t[0]
    if kind == "energy":
        joules = v[-1] - v[0]
        powers = [(v[i + 1] - v[i]) / (t[i + 1] - t[i]) for i in range(len(v) - 1) if t[i + 1] > t[i]]
    else:
        joules = sum(0.5 * (v[i] + v[i + 1]) * (t[i + 1] - t[i]) for i in range(len(v) - 1))
        powers = v
    return joules, seconds, powers


def energy_result(kind, base, run, inferences, sign=1):
    """Net energy per inference over the run, above the idle baseline, with a 1-sigma uncertainty.

    The run's own uncertainty is the standard error of its mean power x its duration for sampled
    power; for a cumulative counter it is the counter's read time at the two edges x the mean
    power. The baseline's standard error scales with the run's duration. Samples are treated as
    independent, so the figure is a lower bound when power is autocorrelated."""
    if sign != 1:
        base = [(t, sign * v, d) for t, v, d in base] if kind == "power" else base
        run = [(t, sign * v, d) for t, v, d in run] if kind == "power" else run
    bj, bs, bp = window_energy(kind, base)
    rj, rs, rp = window_energy(kind, run)
    if kind == "power" and run and min(v for _, v, _ in run) < 0:
        return None, {"reason": "the power reading turned negative during the run (the device started "
                                "charging?): no energy figure"}
    if rj is None or not rs:
        return None, {"reason": f"only {len(run)} energy sample(s) during the run: raise min_seconds or sample_hz"}
    if bj is None or not bs:
        return None, {"reason": f"only {len(base)} energy sample(s) during the idle baseline"}
    base_w = bj / bs
    run_w = rj / rs
    net_j = rj - base_w * rs
    if kind == "power":
        s_run = _sem(rp) * rs
    else:
        s_run = abs(run_w) * 0.5 * (run[0][2] + run[-1][2])
    s_base = (_sem(bp) if len(bp) > 1 else abs(base_w) * 0.5 * (base[0][2] + base[-1][2]) / bs) * rs
    sigma = (s_run ** 2 + s_base ** 2) ** 0.5
    info = {"baseline_w": base_w, "run_w": run_w, "net_j": net_j, "run_seconds": rs, "baseline_seconds": bs,
            "samples": len(run), "baseline_samples": len(base), "uncertainty_j": sigma}
    if net_j <= 1e-9 * abs(rj):  # zero within float rounding counts as zero
        info["reason"] = (f"the run drew no more power than idle ({run_w:.3f} W vs baseline {base_w:.3f} W, "
                          f"uncertainty {sigma:.3g} J): energy per inference is below what this source resolves")
        return None, info
    info["uncertainty_mj"] = sigma / inferences * 1000.0
    info["significant"] = net_j > 2 * sigma
    return net_j / inferences * 1000.0, info


def no_energy(reasons, sources):
    if not sources:
        reason = "the target lists no energy source"
    else:
        reason = "no readable energy source: " + "; ".join(reasons)
    return {"energy_mj_per_inference": None, "source": None, "reason": reason, "checked": reasons}


def energy_unavailable_reason(sources, sysfs_root="/"):
    """Why no energy figure: each configured source's reason (kept for callers of the old API)."""
    _, reasons = open_energy_reader({"sources": sources}, sysfs_root)
    return no_energy(reasons, sources)["reason"]


# --------------------------------------------------------------------------- runners
def no_op_profile(reason):
    """The op_profile answer of a runtime that has no per-op profiler here, with the reason."""
    return {"source": None, "runs": 0, "total_us": None, "ops": [], "reason": reason}


def finish_op_profile(source, ops, runs_us):
    """The op_profile answer from per-node call times (``op["us"]``) and the runs' wall times: totals
    and medians (robust to a disturbed run on a shared device), slowest first."""
    for op in ops.values():
        op["median_us"] = _median(op.pop("us"))
    return {"source": source, "runs": len(runs_us), "total_us": float(sum(runs_us)),
            "median_run_us": _median(runs_us), "ops": sorted(ops.values(), key=lambda o: -o["total_us"]),
            "reason": None}


class Runner:
    """One runtime on the device. A subclass names its runtime (``name``, the request's ``runtime``),
    says how to find it (``probe``), loads a model (``load``) and runs one batch (``run``); the
    agent does the timing, memory, energy and eval bookkeeping around it. Adding a runtime is one
    subclass listed in RUNNERS (``--probe`` and requests both read that one dict).

    ``Runner(model_path, threads, input_specs=..., output_specs=...)`` loads at once (the host's
    in-process parity checks build runners that way); ``Runner.open(model_path, request)`` is what
    the agent calls with the request JSON (``threads``, ``inputs``, ``outputs``)."""

    name = None  # the runtime's name in requests, --probe and the report
    log_missing = True  # --probe logs why the runtime is unavailable (on stderr)

    def __init__(self, model_path=None, threads=1, input_specs=None, output_specs=None, runtime_options=None):
        self.threads = int(threads)
        self.version = None
        self.delegate = None  # the delegate that runs the graph when the runner knows it ("xnnpack")
        self.warnings = []  # what the report must say about how this model was run (a delegate fallback)
        if model_path is not None:
            self.load(model_path, {"threads": threads, "inputs": input_specs or [], "outputs": output_specs or [],
                                   "runtime_options": runtime_options})

    # Runtime options this runner takes (request "runtime_options"): name -> the allowed values (a
    # tuple), or None for a positive integer. Empty: the runner refuses any.
    OPTIONS = {}

    @classmethod
    def check_options(cls, opts):
        """The request's runtime options, checked against OPTIONS: an unknown name or value is a
        bad_request naming what this runner takes (a search must never measure a setting the
        runtime silently ignored)."""
        opts = dict(opts or {})
        if opts and not cls.OPTIONS:
            raise AgentFailure("bad_request", f"runtime {cls.name} takes no runtime options (got {sorted(opts)})",
                               EXIT_BAD_REQUEST)
        unknown = sorted(set(opts) - set(cls.OPTIONS))
        if unknown:
            raise AgentFailure("bad_request", f"unknown {cls.name} option(s) {unknown}; known: {sorted(cls.OPTIONS)}",
                               EXIT_BAD_REQUEST)
        for key, value in opts.items():
            allowed = cls.OPTIONS[key]
            if allowed is None:
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise AgentFailure("bad_request", f"{cls.name} option {key} must be a positive integer, "
                                       f"got {value!r}", EXIT_BAD_REQUEST)
            elif value not in allowed:
                raise AgentFailure("bad_request", f"{cls.name} option {key}={value!r} is not one of {list(allowed)}",
                                   EXIT_BAD_REQUEST)
        return opts

    @classmethod
    def open(cls, model_path, request):
        cls.check_options(request.get("runtime_options"))
        runner = cls()
        runner.load(model_path, request)
        return runner

    @classmethod
    def probe(cls):
        """(version string, None) when the runtime imports here, else (None, reason)."""
        raise NotImplementedError

    def load(self, model_path, request):
        """Load ``model_path``; ``request`` gives ``threads``, ``inputs`` and ``outputs`` (host specs).
        Sets ``self.version``; raises AgentFailure (runtime_missing / model_load_failed)."""
        raise NotImplementedError

    def run(self, inputs):
        """One inference: arrays in the model's input order -> its outputs, in the host's order."""
        raise NotImplementedError

    def batch_dynamic(self):
        """Whether the model's batch axis is dynamic (any chunk size may be fed)."""
        return False

    def static_batch(self):
        """The model's fixed batch size (None when the batch axis is dynamic)."""
        return None if self.batch_dynamic() else 1

    def profile(self, feeds, runs):
        """Per-op times of ``runs`` inferences from the runtime's OWN profiler (one more run first,
        left out): {"source", "runs", "total_us" (the profiled runs' wall time), "ops": [{"node",
        "op_type", "calls", "total_us", "provider"}], "reason"}. Without a profiler: source None and
        the reason (never a figure made up here)."""
        return no_op_profile(f"the {self.name} runner has no per-op profiler")


class OnnxRunner(Runner):
    name = "onnxruntime"

    @classmethod
    def probe(cls):
        try:
            import onnxruntime
        except Exception as exc:  # a broken install is reported, not fatal
            return None, str(exc)
        return onnxruntime.__version__, None

    def load(self, model_path, request):
        threads = request.get("threads", 1)
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise AgentFailure("runtime_missing", f"onnxruntime is not installed on this device ({exc})",
                               EXIT_RUNTIME) from exc
        self.version = ort.__version__
        so = ort.SessionOptions()
        so.intra_op_num_threads = int(threads)
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.log_severity_level = 3
        self.options = self._apply_options(ort, so, request.get("runtime_options"), int(threads))
        try:
            self.session = ort.InferenceSession(model_path, sess_options=so, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise AgentFailure("model_load_failed", f"onnxruntime cannot load {model_path}: {exc}",
                               EXIT_RUNTIME) from exc
        self.threads = int(threads)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.input_shapes = [list(i.shape) for i in self.session.get_inputs()]
        self.model_path, self.session_options = model_path, so  # the profiling session is built alike

    def profile(self, feeds, runs):
        """onnxruntime's own profiler: a second session with ``enable_profiling`` (same options, so
        the same optimized graph and node names), its JSON trace summed per node."""
        import shutil
        import tempfile

        import onnxruntime as ort

        tmp = tempfile.mkdtemp(prefix="edgekit-ort-profile-")
        try:
            so = self.session_options  # already copied into the timed session: changing it is safe
            so.enable_profiling = True
            so.profile_file_prefix = os.path.join(tmp, "ort")
            sess = ort.InferenceSession(self.model_path, sess_options=so, providers=["CPUExecutionProvider"])
            feed = dict(zip(self.input_names, feeds))
            for _ in range(int(runs) + 1):
                sess.run(None, feed)
            with open(sess.end_profiling(), encoding="utf-8") as fh:
                trace = json.load(fh)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return self.profile_from_trace(trace)

    @staticmethod
    def profile_from_trace(trace):
        """Kernel times per node from an onnxruntime trace, the first run (allocations, kernel
        selection) left out; ``total_us`` is the profiled runs' own wall time (model_run events)."""
        events = trace if isinstance(trace, list) else trace.get("traceEvents", [])
        model_runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                            key=lambda e: e["ts"])
        if not model_runs:
            return no_op_profile("onnxruntime's trace has no model_run events")
        start = model_runs[0]["ts"] + model_runs[0]["dur"] if len(model_runs) > 1 else 0
        ops = {}
        for e in events:
            name = e.get("name", "")
            if e.get("cat") != "Node" or not name.endswith("_kernel_time") or e.get("ts", 0) < start:
                continue
            args = e.get("args") or {}
            node = name[: -len("_kernel_time")]
            op = ops.setdefault(node, {"node": node, "op_type": args.get("op_name"), "calls": 0, "total_us": 0.0,
                                       "provider": args.get("provider"), "us": []})
            op["calls"] += 1
            op["total_us"] += float(e.get("dur", 0))
            op["us"].append(float(e.get("dur", 0)))
        timed = model_runs[1:] or model_runs
        return finish_op_profile("onnxruntime", ops, [float(e["dur"]) for e in timed])

    # Runtime options a search may vary (edgekit's "runtime options as a search dimension"), checked
    # against onnxruntime 1.32's SessionOptions. execution_mode "parallel" runs independent nodes
    # concurrently on an inter-op pool of inter_op_threads (default: the request's threads; the
    # intra-op pool keeps the request's threads); inter_op_threads means nothing in sequential mode
    # (one node at a time) and is refused there.
    OPTIONS = {"graph_optimization_level": ("disable_all", "basic", "extended", "all"),
               "execution_mode": ("sequential", "parallel"), "inter_op_threads": None}

    def _apply_options(self, ort, so, opts, threads=1):
        """Set the requested options on ``so``; returns them as applied (what the report carries)."""
        opts = self.check_options(opts)
        levels = {"disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                  "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                  "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                  "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
        applied = {}
        if "graph_optimization_level" in opts:
            so.graph_optimization_level = levels[opts["graph_optimization_level"]]
            applied["graph_optimization_level"] = opts["graph_optimization_level"]
        mode = opts.get("execution_mode")
        if mode == "parallel":
            so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
            so.inter_op_num_threads = int(opts.get("inter_op_threads") or threads)
            applied.update(execution_mode="parallel", inter_op_threads=so.inter_op_num_threads)
        elif "inter_op_threads" in opts:
            raise AgentFailure("bad_request", "onnxruntime option inter_op_threads only matters with execution_mode "
                               "'parallel' (sequential mode runs one node at a time)", EXIT_BAD_REQUEST)
        elif mode == "sequential":
            applied["execution_mode"] = "sequential"  # the default, asked for explicitly
        return applied

    def batch_dynamic(self):
        return all(not isinstance(s[0], int) for s in self.input_shapes if s)

    def static_batch(self):
        """The model's fixed batch size (None when the batch axis is dynamic)."""
        for s in self.input_shapes:
            if s and isinstance(s[0], int) and s[0] > 0:
                return s[0]
        return None

    def run(self, feeds):
        return self.session.run(None, dict(zip(self.input_names, feeds)))


_XNN = ("xnnpack", "failed to prepare")


class LiteRTRunner(Runner):
    """A .tflite model on the LiteRT interpreter (ai_edge_litert; tflite_runtime on older devices),
    or on ai_edge_litert's CompiledModel (runtime option ``api: compiled``)."""

    name = "litert"
    log_missing = False
    PACKAGES = ("ai_edge_litert", "tflite_runtime")
    # Runtime options a search may vary, checked against ai_edge_litert 2.3.0:
    # - xnnpack "off": the Interpreter built with OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    #   (LiteRT's own kernels); the default (AUTO, or BUILTIN asked for as "on") applies the XNNPACK
    #   delegate at allocate_tensors. On a CompiledModel: CpuOptions(kernel_mode=BUILTIN) instead of
    #   the XNNPACK kernel mode. XNNPACK's thread count is the request's threads either way
    #   (Interpreter(num_threads=...), CpuOptions(num_threads=...)).
    # - api "compiled": the file runs through ai_edge_litert.compiled_model.CompiledModel (LiteRT's
    #   newer API: TensorBuffers, CPU accelerator options) instead of the Interpreter, with the same
    #   output contract. tflite_runtime has no CompiledModel (refused with that reason), and a
    #   tflite_runtime without OpResolverType cannot turn XNNPACK off from Python (refused too).
    OPTIONS = {"xnnpack": ("on", "off"), "api": ("interpreter", "compiled")}

    @classmethod
    def probe(cls):
        errors = []
        for mod in cls.PACKAGES:
            try:
                m = __import__(mod)
            except Exception as exc:
                errors.append(f"{mod}: {exc}")
                continue
            return f"{mod} {getattr(m, '__version__', '?')}", None
        return None, "; ".join(errors)

    def load(self, model_path, request):
        threads = int(request.get("threads", 1))
        opts = self.check_options(request.get("runtime_options"))
        input_specs, output_specs = request.get("inputs"), request.get("outputs")
        interp_mod = None
        errors = []
        for mod in (f"{p}.interpreter" for p in self.PACKAGES):
            try:
                interp_mod = __import__(mod, fromlist=["Interpreter"])
                self.module = mod.split(".")[0]
                break
            except ImportError as exc:
                errors.append(f"{mod}: {exc}")
                continue
        if interp_mod is None:
            raise AgentFailure("runtime_missing",
                               "no LiteRT interpreter on this device (pip install ai-edge-litert, or tflite-runtime "
                               "on older devices): " + "; ".join(errors), EXIT_RUNTIME)
        top = sys.modules.get(self.module)
        self.version = f"{self.module} {getattr(top, '__version__', '?')}"
        compiled = opts.get("api") == "compiled"
        xnnpack_off = opts.get("xnnpack") == "off"
        resolver = getattr(interp_mod, "OpResolverType", None)
        if "xnnpack" in opts and resolver is None:
            raise AgentFailure("bad_request", f"{self.version} has no OpResolverType: XNNPACK cannot be turned on or "
                               "off from its Python API", EXIT_BAD_REQUEST)
        kwargs = {}
        if compiled and resolver is not None:
            # only the model's tensor metadata (names, indices, quantization: CompiledModel's details
            # have no quantization) from an interpreter that is never allocated and applies no delegate
            kwargs["experimental_op_resolver_type"] = resolver.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        elif "xnnpack" in opts:
            kwargs["experimental_op_resolver_type"] = (resolver.BUILTIN_WITHOUT_DEFAULT_DELEGATES if xnnpack_off
                                                       else resolver.BUILTIN)
        self.cm = None
        try:
            self.interp = interp_mod.Interpreter(model_path=model_path, num_threads=1 if compiled else threads,
                                                 **kwargs)
            if not compiled:
                self.interp.allocate_tensors()
        except Exception as exc:
            msg = str(exc)
            retry = not compiled and "xnnpack" not in opts and resolver is not None and self._delegate_failed(msg)
            if not retry:
                if "Select TensorFlow op" in msg or "Flex" in msg:
                    msg += " (the model uses TensorFlow 'Flex' ops, which the plain LiteRT interpreter cannot run)"
                raise AgentFailure("model_load_failed", f"LiteRT cannot load {model_path}: {msg}", EXIT_RUNTIME) from exc
            # XNNPACK (applied by default) refused the graph at prepare: run it on LiteRT's own kernels, said
            # in the report and in the options the measurement (and ship/runtime.json) carries
            try:
                self.interp = interp_mod.Interpreter(model_path=model_path, num_threads=threads,
                                                     experimental_op_resolver_type=resolver.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
                self.interp.allocate_tensors()
            except Exception as exc2:
                raise AgentFailure("model_load_failed", f"LiteRT cannot load {model_path}: with XNNPACK: "
                                   f"{_first_line(msg, prefer=_XNN)}; without it: {_first_line(str(exc2))}", EXIT_RUNTIME) from exc2
            opts = {**opts, "xnnpack": "off"}
            self.warnings.append(f"XNNPACK failed to prepare the model ({_first_line(msg, prefer=_XNN)}); measured with LiteRT's "
                                 "built-in kernels (xnnpack=off), which the application must set too")
        self.threads = threads
        self.inputs = self._in_spec_order(self.interp.get_input_details(), input_specs or [])
        # outputs in the host's order (the source model's), matched by the TFLite tensor names the host
        # recorded: the interpreter's own order can differ for a multi-output model
        self.outputs = self._in_spec_order(self.interp.get_output_details(), output_specs or [])
        if compiled:
            self.interp = None  # metadata read; the CompiledModel runs the graph
            self._load_compiled(model_path, threads, xnnpack_off)
            self.delegate = None if xnnpack_off else "xnnpack"
        else:
            self.delegated_nodes = self._delegated_nodes()
            self.delegate = "xnnpack" if self.delegated_nodes else None
        self.options = opts

    @staticmethod
    def _delegate_failed(msg):
        """Whether an Interpreter error is the XNNPACK delegate's ("Node number 7 (TfLiteXNNPackDelegate)
        failed to prepare", "Failed to apply XNNPACK delegate"), not the model's own."""
        low = msg.lower()
        return "xnnpack" in low and ("prepare" in low or "delegate" in low)

    def _delegated_nodes(self):
        """How many nodes of the allocated graph a delegate took (XNNPACK, the Interpreter's only
        default delegate); None where the interpreter cannot list its ops."""
        try:
            return sum(1 for op in self.interp._get_ops_details() if op.get("op_name") == "DELEGATE")
        except Exception:  # a private API (tflite_runtime builds differ): unknown, not a failure
            return None

    def _load_compiled(self, model_path, threads, xnnpack_off):
        import numpy as np

        if self.module != "ai_edge_litert":
            raise AgentFailure("bad_request", f"api 'compiled' needs ai_edge_litert's CompiledModel; {self.version} "
                               "has only the Interpreter", EXIT_BAD_REQUEST)
        try:
            import ai_edge_litert.compiled_model as cmm
        except ImportError as exc:
            raise AgentFailure("bad_request", f"api 'compiled' needs ai_edge_litert.compiled_model, which "
                               f"{self.version} does not have ({exc})", EXIT_BAD_REQUEST) from exc
        cpu = cmm.CpuOptions(num_threads=threads, kernel_mode=cmm.CpuKernelMode.BUILTIN if xnnpack_off else None)
        try:
            cm = cmm.CompiledModel.from_file(model_path, options=cmm.Options(
                hardware_accelerators=cmm.HardwareAccelerator.CPU, cpu_options=cpu))
            sigs = cm.get_signature_list()
            key = next(iter(sigs))
            self._sig = cm.get_signature_index(key)
            ins, outs = cm.get_input_tensor_details(key), cm.get_output_tensor_details(key)
            # the signature's keys are not the tensor names (onnx2tf: "x" vs "serving_default_x:0"):
            # its tensors are matched to the interpreter's by tensor index
            in_idx = [int(ins[k]["index"]) for k in sigs[key]["inputs"]]
            out_idx = [int(outs[k]["index"]) for k in sigs[key]["outputs"]]
            if sorted(in_idx) != sorted(int(d["index"]) for d in self.inputs) or \
                    sorted(out_idx) != sorted(int(d["index"]) for d in self.outputs):
                raise ValueError(f"its first signature {key!r} does not have the graph's inputs and outputs")
            self._in_pos = [in_idx.index(int(d["index"])) for d in self.inputs]
            self._reads = [(out_idx.index(int(d["index"])), int(np.prod(d["shape"])), np.dtype(d["dtype"]),
                            tuple(int(v) for v in d["shape"])) for d in self.outputs]
            self._in_bufs, self._out_bufs = cm.create_input_buffers(self._sig), cm.create_output_buffers(self._sig)
            for pos, n, dtype, _ in self._reads:  # a dtype TensorBuffer cannot carry fails here, not mid-run
                self._out_bufs[pos].read(n, dtype)
        except AgentFailure:
            raise
        except Exception as exc:
            raise AgentFailure("model_load_failed", f"LiteRT's CompiledModel cannot load {model_path}: {exc}",
                               EXIT_RUNTIME) from exc
        self.cm = cm
        self.fully_accelerated = bool(cm.is_fully_accelerated())

    @staticmethod
    def _in_spec_order(details, specs):
        """The interpreter's inputs in the order of the host's specs (user data order), matched by the
        TFLite tensor name the host recorded; interpreter order otherwise."""
        by_name = {d["name"]: d for d in details}
        names = [s.get("name") for s in specs]
        if len(names) == len(details) and all(n in by_name for n in names):
            return [by_name[n] for n in names]
        return list(details)

    def batch_dynamic(self):
        return False  # TFLite graphs have a fixed batch (1 is the norm)

    def static_batch(self):
        shape = list(self.inputs[0]["shape"]) if self.inputs else []
        return int(shape[0]) if shape and int(shape[0]) > 0 else 1

    @staticmethod
    def _quant(det):
        q = det.get("quantization") or (0.0, 0)
        return (float(q[0]), int(q[1])) if q and q[0] else (None, None)

    def _feed(self, np, det, x):
        want = np.dtype(det["dtype"])
        x = np.asarray(x)
        if want.kind in "iu" and x.dtype.kind == "f":
            # float data for an integer input that the host sent no scale for: use the tensor's own
            scale, zp = self._quant(det)
            if scale is None:
                raise AgentFailure("bad_request", f"input {det['name']} is {want} without quantization "
                                   "parameters; float data cannot be fed to it", EXIT_BAD_REQUEST)
            info = np.iinfo(want)
            x = np.clip(np.round(x / scale + zp), info.min, info.max)
        return np.ascontiguousarray(x.astype(want, copy=False))

    def run(self, feeds):
        import numpy as np

        if self.cm is not None:
            # CompiledModel: the same contract (host-order inputs in, copies of the outputs back),
            # through its TensorBuffers
            for pos, det, x in zip(self._in_pos, self.inputs, feeds):
                self._in_bufs[pos].write(self._feed(np, det, x))
            self.cm.run_by_index(self._sig, self._in_bufs, self._out_bufs)
            return [self._out_bufs[pos].read(n, dtype).reshape(shape) for pos, n, dtype, shape in self._reads]
        for det, x in zip(self.inputs, feeds):
            self.interp.set_tensor(det["index"], self._feed(np, det, x))
        self.interp.invoke()
        return [self.interp.get_tensor(o["index"]) for o in self.outputs]

    def output_quantization(self, i):
        """(scale, zero_point) of output ``i`` when it is an integer tensor, else (None, None)."""
        det = self.outputs[i]
        if det["dtype"] is not None and str(det["dtype"]).find("int") >= 0:
            return self._quant(det)
        return None, None

    def profile(self, feeds, runs):
        # Checked against ai_edge_litert 2.3.0: nothing in its Python API installs or reads a profiler.
        return no_op_profile(
            f"{self.version}: LiteRT's Python API exposes no per-op profiler (Interpreter has no profiler hook, "
            "its experimental_force_delegate_node_profiling only affects a profiler installed from C++; "
            "CompiledModel has none; profiling_info_pb2 is only the message schema of the C++ benchmark tool's "
            "output); per-op times need benchmark_model --enable_op_profiling=true")


def _aarch64_hwcap():
    """AT_HWCAP of this process on aarch64 Linux (from /proc/self/auxv), else None."""
    if platform.machine() not in ("aarch64", "arm64"):
        return None
    try:
        with open("/proc/self/auxv", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    import struct

    for i in range(0, len(data) - 15, 16):
        key, value = struct.unpack_from("<QQ", data, i)
        if key == 16:  # AT_HWCAP
            return value
    return None


def _dist_version(name):
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _probe_installed(dist, missing):
    """A runner's probe from package metadata only (importing the runtime can cost seconds): (version, None),
    or (None, why) when it is not installed."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec(dist) is None:
        return None, missing
    try:
        return importlib.metadata.version(dist), None
    except importlib.metadata.PackageNotFoundError as exc:
        return None, f"{dist} has no package metadata: {exc}"


def _version_tuple(v):
    out = []
    for part in (v or "").split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


class ExecuTorchRunner(Runner):
    """A .pte program (XNNPACK-delegated or portable kernels) on ExecuTorch's Python runtime. Its
    pybindings link libtorch, so the device needs torch beside executorch: on aarch64 the pair
    edgekit provisions is PyPI's CPU-only torch 2.10.0 + executorch 1.1.0 (its extension is
    ``_portable_lib``; 1.5.1's is ``_C``), which runs the .pte files the host's executorch 1.5.1 writes."""

    name = "executorch"
    log_missing = False
    # No runtime options: whether XNNPACK runs a node is decided when the program is lowered (the
    # .pte carries the delegate's blobs; there is no run-time switch), and XNNPACK's thread count is
    # the request's threads (the pool below). Checked against executorch 1.5.1's pybindings: the
    # pool is extension/threadpool's process-wide pthreadpool, sized by _unsafe_reset_threadpool
    # and read by _threadpool_get_thread_count; torch.set_num_threads does not touch it (measured:
    # the pool stays at the core count, CPU time/wall 1.9 at 2 threads either way).
    OPTIONS = {}
    _alive = None  # the runners of this process whose programs hold the pool (a WeakSet)
    # ExecuTorch ScalarType codes -> numpy dtype names (the ones a .pte's user I/O can have)
    DTYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32",
              7: "float64", 11: "bool"}

    @classmethod
    def probe(cls):
        # metadata only: importing the runtime costs seconds (torch); load() reports a broken install
        return _probe_installed("executorch", "executorch is not installed (pip install executorch; it needs torch)")

    def load(self, model_path, request):
        threads = int(request.get("threads", 1))
        self.check_options(request.get("runtime_options"))
        found = self.found()
        hwcap = _aarch64_hwcap()
        torch_v = _dist_version("torch")
        if hwcap is not None and not hwcap & (1 << 8) and torch_v and _version_tuple(torch_v) >= (2, 10):
            # measured: torch 2.10.0's aarch64 wheel executes an LSE atomic (ldaddal, libc10.so) while it
            # imports; without them the process dies of SIGILL and the host would only see a lost agent
            raise AgentFailure("runtime_missing", f"ExecuTorch needs torch on this device, and {found}: torch "
                               f"{torch_v}'s aarch64 wheel uses ARMv8.1 LSE atomics, which this CPU lacks "
                               f"(AT_HWCAP {hwcap:#x} has no 'atomics'; e.g. a Cortex-A72 / Raspberry Pi 4), so "
                               "`import torch` would die of SIGILL; torch 2.9.1 imports there, but executorch "
                               "1.0.1 (its pair) hit SIGILL on an SDOT in XNNPACK's int8 kernels", EXIT_RUNTIME)
        try:
            import torch  # first: the pybindings resolve libtorch from the loaded torch
            _C = self._extension()
        except ImportError as exc:
            raise AgentFailure("runtime_missing", f"ExecuTorch's runtime does not import on this device ({found}): "
                               f"{exc}; pip install executorch with the torch its extension was built against (on "
                               "aarch64: torch==2.10.0 + executorch==1.1.0, `edgekit devices provision NAME --runtime "
                               "executorch`)", EXIT_RUNTIME) from exc

        self.torch = torch
        self.version = _dist_version("executorch")
        self.pool_threads = self._size_pool(_C, threads)
        try:
            self.program = _C._load_program(str(model_path))
            self.method = self.program.load_method("forward")
        except Exception as exc:
            raise AgentFailure("model_load_failed", f"ExecuTorch cannot load {model_path} ({found}; a .pte "
                               f"whose flatbuffer or delegate blobs are newer than this runtime fails here): {exc}",
                               EXIT_RUNTIME) from exc
        ExecuTorchRunner._alive.add(self)
        meta = self.method.method_meta()
        self.input_shapes = [list(meta.input_tensor_meta(i).sizes()) for i in range(meta.num_inputs())]
        self.input_dtypes = [self.DTYPES.get(meta.input_tensor_meta(i).dtype()) for i in range(meta.num_inputs())]
        self.threads = self.pool_threads  # read back from the pool where the build can
        self.model_path = str(model_path)

    @staticmethod
    def found():
        """What the device has, for error messages: executorch's and torch's versions (metadata only)
        and the torch range the executorch wheel was built for."""
        import importlib.metadata

        et = _dist_version("executorch")
        built = ""
        if et:
            try:
                reqs = importlib.metadata.requires("executorch") or []
            except importlib.metadata.PackageNotFoundError:
                reqs = []
            pin = next((r.split(";")[0].strip() for r in reqs if r.replace(" ", "").startswith("torch") and
                        r.replace(" ", "")[5:6] in "<>=!~"), None)
            built = f" (built for {pin.replace(' ', '')})" if pin else ""
        torch_v = _dist_version("torch")
        return (f"found executorch {et or 'not installed'}{built}, torch {torch_v or 'not installed'}, "
                f"{platform.machine()}")

    @staticmethod
    def _extension():
        """The C extension that executorch.runtime wraps (the wrapper also imports the exir compiler
        stack: torchao, sympy; 4 of the 5.5 s an import takes on an x86 host, none of it needed here).
        executorch 1.5.1 names it ``_C``; 1.1.0 (the aarch64 device pair of torch 2.10) ``_portable_lib``."""
        import importlib

        try:
            return importlib.import_module("executorch.extension.pybindings._C")
        except ModuleNotFoundError as exc:
            if exc.name != "executorch.extension.pybindings._C":
                raise
            return importlib.import_module("executorch.extension.pybindings._portable_lib")

    @classmethod
    def _size_pool(cls, _C, threads):
        """Size the pool XNNPACK's delegate runs on (default: every core) to ``threads`` before the
        program loads; returns its size read back (None where this build cannot read it).

        The delegate keeps the pool it was loaded with: resizing the pool under a loaded program
        and running that program segfaulted here (executorch 1.5.1; a same-size reset keeps the
        pool's threads). So the pool is reset only when its size differs, and never while a program
        loaded at another size is alive in this process (an A/B pair shares one size)."""
        import weakref

        if ExecuTorchRunner._alive is None:
            ExecuTorchRunner._alive = weakref.WeakSet()
        count = getattr(_C, "_threadpool_get_thread_count", None)  # absent from older builds
        if count is not None and count() == threads:
            return threads
        others = sorted({r.pool_threads for r in ExecuTorchRunner._alive if r.pool_threads != threads})
        if others:
            raise AgentFailure("bad_request", f"ExecuTorch's XNNPACK thread pool is process-wide and a program "
                               f"loaded in this process runs on {others[0]} threads: resizing it to {threads} would "
                               "crash that program; load the two in separate processes", EXIT_BAD_REQUEST)
        _C._unsafe_reset_threadpool(threads)
        return count() if count is not None else threads

    def static_batch(self):
        # a .pte's memory plan is sized for its example shapes: the batch is fixed
        return int(self.input_shapes[0][0]) if self.input_shapes and self.input_shapes[0] else 1

    def run(self, feeds):
        import numpy as np

        xs = [self.torch.from_numpy(np.ascontiguousarray(x if d is None else np.asarray(x).astype(d, copy=False)))
              for x, d in zip(feeds, self.input_dtypes)]
        # the runtime copies outputs out of its memory plan on every call
        return [o.numpy() for o in self.method(xs) if isinstance(o, self.torch.Tensor)]

    def profile(self, feeds, runs):
        """ExecuTorch's event tracer: the program loaded again with ETDump on, the dump decoded to
        JSON by the flatc and schema that executorch ships (the devtools Inspector would import the
        whole exir stack). Without an ETRecord, delegated ops are named by the delegate (XNNPACK)."""
        import importlib.util
        import shutil
        import subprocess
        import tempfile

        _C = self._extension()
        program = _C._load_program(self.model_path, enable_etdump=True)
        if not program.has_etdump():
            return no_op_profile(f"executorch {self.version} was built without the event tracer (ETDump)")
        pkg = importlib.util.find_spec("executorch").submodule_search_locations[0]
        flatc = os.path.join(pkg, "data", "bin", "flatc")
        schemas = [os.path.join(pkg, "devtools", "etdump", f) for f in ("etdump_schema_flatcc.fbs", "scalar_type.fbs")]
        missing = [f for f in [flatc] + schemas if not os.path.isfile(f)]
        if missing:
            return no_op_profile(f"executorch {self.version} writes an ETDump but ships no {missing[0]} to decode it")
        saved = self.program, self.method
        tmp = tempfile.mkdtemp(prefix="edgekit-etdump-")
        try:
            self.program, self.method = program, program.load_method("forward")
            for _ in range(int(runs) + 1):
                self.run(feeds)
            dump = os.path.join(tmp, "run.etdp")
            program.write_etdump_result_to_file(dump, os.path.join(tmp, "debug.bin"))
            for f in schemas:
                shutil.copy(f, tmp)
            subprocess.run([flatc, "--size-prefixed", "--json", "--defaults-json", "--strict-json", "-o", tmp,
                            os.path.join(tmp, "etdump_schema_flatcc.fbs"), "--", dump],
                           check=True, capture_output=True, timeout=120)
            with open(os.path.join(tmp, "run.json"), encoding="utf-8") as fh:
                etdump = json.load(fh)
        finally:
            self.program, self.method = saved
            shutil.rmtree(tmp, ignore_errors=True)
        return self.profile_from_etdump(etdump)

    @staticmethod
    def profile_from_etdump(etdump):
        """Per-op times from a decoded ETDump: one "Execute" block a run (the first left out); an
        op is a delegate's own event (XNNPACK's "Convolution (NHWC, F32) IGEMM #1") or a portable
        kernel's; ticks are nanoseconds on the POSIX platform layer."""
        execs = [r for r in etdump.get("run_data", []) if r.get("name") == "Execute"]
        if not execs:
            return no_op_profile("the ETDump recorded no Execute run")
        timed = execs[1:] or execs
        ops, runs_us = {}, []
        for r in timed:
            run_us = []
            for ev in r.get("events", []):
                pe = ev.get("profile_event")
                if not pe:
                    continue
                us = (float(pe["end_time"]) - float(pe["start_time"])) / 1000.0
                name, delegated = pe.get("name"), pe.get("delegate_debug_id_str")
                if name == "Method::execute":
                    run_us.append(us)
                if not delegated and (not name or name in ("Method::execute", "DELEGATE_CALL")
                                      or name.startswith(("Method::", "Program::"))):
                    continue
                node = delegated or name
                op = ops.setdefault(node, {"node": node, "op_type": node.rsplit(" #", 1)[0], "calls": 0,
                                           "total_us": 0.0, "provider": "delegate" if delegated else "portable",
                                           "us": []})
                op["calls"] += 1
                op["total_us"] += us
                op["us"].append(us)
            runs_us.extend(t for t in run_us if t is not None)
        return finish_op_profile("executorch", ops, runs_us)


class OpenVINORunner(Runner):
    """An OpenVINO IR (``.xml`` beside its ``.bin`` weights) on OpenVINO's CPU plugin.

    What the CPU plugin computes in is an inference hint, not a property of the file: on a CPU with
    AVX-512 BF16/AMX its default is bf16 (fp16 on ARM cores with fp16 arithmetic), elsewhere f32. The
    hop records the precision a variant means in the IR's rt_info (``edgekit/inference_precision``:
    ``f32``, or ``auto`` for the plugin's default), the runner applies it, and reports the precision
    the compiled model runs at (``options.inference_precision``, read back), which ship/runtime.json
    then spells out. CPU pinning is off (hosts and boards are shared); one stream, latency hint,
    unless asked otherwise. Compile time is the load time the agent already measures."""

    name = "openvino"
    log_missing = False
    # Runtime options, checked against openvino 2026.4's CPU plugin properties:
    # - inference_precision: INFERENCE_PRECISION_HINT (overrides what the IR asks for)
    # - performance_hint: PERFORMANCE_HINT LATENCY (default here) or THROUGHPUT (streams by the plugin)
    # - num_streams: NUM_STREAMS (default 1: one request at a time is what the agent times)
    OPTIONS = {"inference_precision": ("f32", "bf16", "f16"), "performance_hint": ("latency", "throughput"),
               "num_streams": None}

    @classmethod
    def probe(cls):
        return _probe_installed("openvino", "openvino is not installed (pip install openvino)")

    @staticmethod
    def wanted_precision(model):
        """What the IR asks for (``edgekit/inference_precision``): "f32", or None for the plugin's default."""
        try:
            if model.has_rt_info(["edgekit", "inference_precision"]):
                v = model.get_rt_info(["edgekit", "inference_precision"])
                v = v.astype(str) if hasattr(v, "astype") else str(v)
                return None if v == "auto" else v
        except Exception:  # an IR edgekit did not write has no such entry
            pass
        return None

    def load(self, model_path, request):
        threads = int(request.get("threads", 1))
        opts = self.check_options(request.get("runtime_options"))
        # offline: openvino's usage telemetry (openvino_telemetry: Google Analytics, files under ~/intel) is made
        # unimportable for this process, so openvino falls back to its no-op stub
        sys.modules.setdefault("openvino_telemetry", None)
        try:
            import openvino as ov
        except ImportError as exc:
            raise AgentFailure("runtime_missing", f"openvino is not installed on this device ({exc}); "
                               "pip install openvino", EXIT_RUNTIME) from exc
        self.version = _dist_version("openvino") or ov.__version__
        core = ov.Core()
        # delivered by content hash, the .bin is not beside the .xml under its stem: the request says where
        weights = (request.get("companions") or {}).get(".bin") or os.path.splitext(str(model_path))[0] + ".bin"
        try:
            model = core.read_model(str(model_path), weights)
        except Exception as exc:
            raise AgentFailure("model_load_failed", f"openvino cannot read {model_path} with its weights "
                               f"{weights}: {exc}", EXIT_RUNTIME) from exc
        precision = opts.get("inference_precision") or self.wanted_precision(model)
        hint = opts.get("performance_hint", "latency")
        config = {"INFERENCE_NUM_THREADS": threads, "ENABLE_CPU_PINNING": False,
                  "PERFORMANCE_HINT": hint.upper(), "NUM_STREAMS": str(opts.get("num_streams", 1))}
        if precision:
            config["INFERENCE_PRECISION_HINT"] = precision
        cache = os.environ.get("EDGEKIT_OPENVINO_CACHE_DIR")
        if cache:  # OpenVINO's compiled-blob cache: a second load of the same IR skips compilation
            config["CACHE_DIR"] = cache
        try:
            self.compiled = core.compile_model(model, "CPU", config)
        except Exception as exc:
            raise AgentFailure("model_load_failed", f"openvino's CPU plugin cannot compile {model_path}: {exc}",
                               EXIT_RUNTIME) from exc
        self.request = self.compiled.create_infer_request()
        ran_at = self.compiled.get_property("INFERENCE_PRECISION_HINT")  # an openvino Type: bf16, f16, f32
        self.options = {"inference_precision": ran_at.get_type_name() if hasattr(ran_at, "get_type_name") else
                        str(ran_at), "performance_hint": hint, "num_streams": int(opts.get("num_streams", 1))}
        self.threads = int(self.compiled.get_property("INFERENCE_NUM_THREADS")) or threads
        self.input_shapes = [[d.get_length() if d.is_static else None for d in i.get_partial_shape()]
                             for i in self.compiled.inputs]
        self.model_path, self.weights_path = str(model_path), weights
        self.core = core

    def static_batch(self):
        for s in self.input_shapes:
            if s and s[0] is not None:
                return s[0]
        return None

    def batch_dynamic(self):
        return self.static_batch() is None

    def run(self, feeds):
        res = self.request.infer(list(feeds))
        return [res[o] for o in self.compiled.outputs]

    def profile(self, feeds, runs):
        """OpenVINO's own performance counters (PERF_COUNT): the model compiled again with them on, per
        executed node (the plugin's fused nodes, named after the IR's layers, with the kernel that ran).
        The CPU plugin's counters are each node's MEAN over every inference of the request so far
        (measured: the sum over nodes decays run after run from the first, slow one), so the timed runs'
        own mean is recovered from two readings: after the first run (left out) and after the last."""
        import time as _time

        config = {"INFERENCE_NUM_THREADS": self.threads, "ENABLE_CPU_PINNING": False, "PERF_COUNT": True,
                  "NUM_STREAMS": "1", "PERFORMANCE_HINT": "LATENCY",
                  "INFERENCE_PRECISION_HINT": self.compiled.get_property("INFERENCE_PRECISION_HINT")}
        compiled = self.core.compile_model(self.core.read_model(self.model_path, self.weights_path), "CPU", config)
        req = compiled.create_infer_request()

        def reading():
            return {(p.node_name, p.node_type, p.exec_type): p.real_time.total_seconds() * 1e6
                    for p in req.profiling_info if not str(p.status).endswith("NOT_RUN")}

        req.infer(list(feeds))
        first = reading()
        runs = int(runs)
        runs_us = []
        for _ in range(runs):
            t0 = _time.perf_counter()
            req.infer(list(feeds))
            runs_us.append((_time.perf_counter() - t0) * 1e6)
        ops = {}
        for (node, op_type, kernel), mean_all in reading().items():
            total = max(0.0, mean_all * (runs + 1) - first.get((node, op_type, kernel), 0.0))  # the timed runs' sum
            ops[node] = {"node": node, "op_type": op_type, "calls": runs, "total_us": total, "provider": kernel,
                         "us": [total / runs] * runs}
        return finish_op_profile("openvino", ops, runs_us)


class NCNNRunner(Runner):
    """An NCNN model (``.param`` graph beside its ``.bin`` weights, as pnnx writes them) on NCNN's CPU
    path (Vulkan off). NCNN's Mat has no batch axis: the model takes one sample (batch 1) per input,
    float32, and its inputs and outputs are pnnx's blobs ``in0, in1, ...`` / ``out0, out1, ...`` in the
    source model's order.

    What NCNN computes in is an option, not the file: by default it stores and computes in fp16 where the
    CPU can (``use_fp16_storage``/``_arithmetic``/``_packed``: on, on x86 too); ``fp16: off`` turns all of
    them (and bf16) off for fp32. The hop pins the setting its variant means (the artifact's
    ``runtime_options``); the runner reports what it applied."""

    name = "ncnn"
    log_missing = False
    # checked against the ncnn 1.0.20261020 Python binding's Option
    OPTIONS = {"fp16": ("on", "off")}
    _FP16 = ("use_fp16_storage", "use_fp16_arithmetic", "use_fp16_packed")

    @classmethod
    def probe(cls):
        return _probe_installed("ncnn", "ncnn is not installed (pip install ncnn)")

    def load(self, model_path, request):
        threads = int(request.get("threads", 1))
        opts = self.check_options(request.get("runtime_options"))
        try:
            import ncnn
        except ImportError as exc:
            raise AgentFailure("runtime_missing", f"ncnn is not installed on this device ({exc}); pip install ncnn",
                               EXIT_RUNTIME) from exc
        self.ncnn = ncnn
        self.version = _dist_version("ncnn") or getattr(ncnn, "__version__", None)
        weights = (request.get("companions") or {}).get(".bin") or os.path.splitext(str(model_path))[0] + ".bin"
        net = ncnn.Net()
        net.opt.num_threads = threads  # ncnn's default is every core
        net.opt.use_vulkan_compute = False
        fp16 = opts.get("fp16", "on") == "on"
        for key in self._FP16:
            setattr(net.opt, key, fp16 and getattr(net.opt, key))
        if not fp16:
            net.opt.use_bf16_storage = net.opt.use_bf16_packed = False
        if net.load_param(str(model_path)) != 0 or net.load_model(str(weights)) != 0:
            raise AgentFailure("model_load_failed", f"ncnn cannot load {model_path} with its weights {weights} "
                               "(a .param/.bin pair pnnx wrote)", EXIT_RUNTIME)
        self.net = net
        self.input_names = sorted(net.input_names(), key=self._index)
        self.output_names = sorted(net.output_names(), key=self._index)
        self.options = {"fp16": "on" if fp16 else "off"}
        self.threads = threads
        # NCNN drops unit axes (a (1, 1, 10) output comes back as 10 values): the host's output shapes restore them
        self.out_shapes = [tuple(s.get("shape") or ()) for s in request.get("outputs") or []]

    @staticmethod
    def _index(blob):
        digits = "".join(c for c in str(blob) if c.isdigit())
        return int(digits) if digits else 0

    def static_batch(self):
        return 1  # NCNN's Mat has no batch axis

    def run(self, feeds):
        import numpy as np

        ex = self.net.create_extractor()
        for name, x in zip(self.input_names, feeds):
            x = np.ascontiguousarray(np.asarray(x, dtype=np.float32)[0])  # one sample: the batch axis dropped
            ex.input(name, self.ncnn.Mat(x).clone())
        outs = []
        for name in self.output_names:
            rc, mat = ex.extract(name)
            if rc != 0:
                raise RuntimeError(f"ncnn could not compute blob {name} (error {rc})")
            y = np.array(mat)
            shape = self.out_shapes[len(outs)] if len(outs) < len(self.out_shapes) else ()
            if shape and all(isinstance(d, int) for d in shape) and int(np.prod(shape)) == y.size:
                outs.append(y.reshape(shape))
            else:
                outs.append(y[None])
        return outs

    def profile(self, feeds, runs):
        return no_op_profile("NCNN's per-layer timer (NCNN_BENCHMARK) is compiled out of the PyPI wheels")


# The one list of runtimes this agent drives: requests, --probe (available_runtimes) and the host's
# in-process checks all read it.
RUNNERS = {cls.name: cls for cls in (OnnxRunner, LiteRTRunner, ExecuTorchRunner, OpenVINORunner, NCNNRunner)}


# --------------------------------------------------------------------------- data
def _prepare(np, x, spec):
    """User data (as the source model takes it) -> what this runtime's tensor takes."""
    if spec.get("transpose"):
        x = np.transpose(x, spec["transpose"])
    dtype = np.dtype(spec["dtype"])
    if dtype.kind in "iu" and spec.get("scale"):
        info = np.iinfo(dtype)
        q = np.round(x / spec["scale"] + spec.get("zero_point", 0))
        x = np.clip(q, info.min, info.max)
    return np.asarray(x.astype(dtype, copy=False), order="C")  # a 0-d constant stays 0-d


def _restore_output(np, y, spec):
    y = np.asarray(y)
    if spec and spec.get("scale") and y.dtype.kind in "iu":
        y = (y.astype(np.float32) - spec.get("zero_point", 0)) * spec["scale"]
    if spec and spec.get("transpose"):
        inv = [0] * len(spec["transpose"])
        for i, p in enumerate(spec["transpose"]):
            inv[p] = i
        y = np.transpose(y, inv)
    return y.astype(np.float32, copy=False)


def load_eval(np, ev, input_specs):
    """The eval inputs as a list of shards, each a list of arrays in the model's input order: the
    .npz is one shard; a folder's .npy shards are memory-mapped and read one at a time, so a set
    larger than the device's memory is scored in bounded memory. Labels stay on the host."""
    x_keys = ev.get("x_keys") or ["x"]
    if ev.get("shards"):
        shards = []
        for sh in ev["shards"]:
            try:
                shards.append([np.load(sh[k], mmap_mode="r", allow_pickle=False) for k in x_keys])
            except (OSError, ValueError, KeyError) as exc:
                raise AgentFailure("bad_data", f"cannot read eval shard {sh}: {exc}", EXIT_BAD_REQUEST) from exc
    else:
        path = ev["path"]
        try:
            data = np.load(path, allow_pickle=False)
        except Exception as exc:
            raise AgentFailure("bad_data", f"cannot read eval data {path}: {exc}", EXIT_BAD_REQUEST) from exc
        missing = [k for k in x_keys if k not in data.files]
        if missing:
            raise AgentFailure("bad_data", f"eval data {path} has no key(s) {missing}; it has {data.files}",
                               EXIT_BAD_REQUEST)
        shards = [[np.asarray(data[k]) for k in x_keys]]
    for xs in shards:
        if len(xs) != len(input_specs):
            raise AgentFailure("bad_data", f"model takes {len(input_specs)} inputs, eval data gives {len(xs)}",
                               EXIT_BAD_REQUEST)
        if any(len(x) != len(xs[0]) for x in xs):
            raise AgentFailure("bad_data", "eval inputs have different sample counts", EXIT_BAD_REQUEST)
    return shards


def synthetic_inputs(np, input_specs):
    rng = np.random.default_rng(0)
    xs = []
    for spec in input_specs:
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in spec["shape"]]
        dt = np.dtype(spec.get("source_dtype") or "float32")
        if dt.kind == "f":
            xs.append(rng.standard_normal(shape).astype(dt))
        else:
            xs.append(rng.integers(0, 2, size=shape).astype(dt))
    return xs


# --------------------------------------------------------------------------- streaming inputs
# The request's ``stream`` (edgekit/stateful.py on the host): constant inputs fed unchanged with every
# run, and state inputs that start as zeros and take the named output after each run; the eval pass of
# a stateful model runs one sample at a time in eval-sample order, carrying the state.
def stream_plan(np, req, in_specs, out_specs):
    """The request's stream resolved to positions: {"n", "constants": {input: array}, "state": [(output,
    input, shape)], "data": [inputs the eval data feeds]}; None without one."""
    st = req.get("stream")
    if not st:
        return None
    ins, outs = [s.get("name") for s in in_specs], [s.get("name") for s in out_specs]

    def pos(names, name, what):
        if name not in names:
            raise AgentFailure("bad_request", f"stream {what} {name!r} is not one of the model's {what}s {names}",
                               EXIT_BAD_REQUEST)
        return names.index(name)

    consts = {}
    for name, c in (st.get("constants") or {}).items():
        try:
            consts[pos(ins, name, "input")] = np.asarray(c["values"], dtype=np.dtype(c["dtype"])).reshape(c["shape"])
        except (KeyError, TypeError, ValueError) as exc:
            raise AgentFailure("bad_request", f"stream constant {name!r}: {exc}", EXIT_BAD_REQUEST) from exc
    try:
        links = [(pos(outs, s["output"], "output"), pos(ins, s["input"], "input"), tuple(int(d) for d in s["shape"]))
                 for s in st.get("state") or []]
    except (KeyError, TypeError, ValueError) as exc:
        raise AgentFailure("bad_request", f"stream state {st.get('state')!r}: {exc}", EXIT_BAD_REQUEST) from exc
    fed = set(consts) | {i for _, i, _ in links}
    return {"n": len(in_specs), "constants": consts, "state": links,
            "data": [k for k in range(len(in_specs)) if k not in fed]}


def data_specs(plan, in_specs):
    """The specs of the inputs the eval data feeds (all of them without a stream)."""
    return list(in_specs) if plan is None else [in_specs[k] for k in plan["data"]]


def zero_state(np, plan, in_specs):
    if plan is None:
        return {}
    return {i: np.zeros(shape, np.dtype(in_specs[i].get("source_dtype") or in_specs[i]["dtype"]))
            for _, i, shape in plan["state"]}


def assemble(plan, data, state):
    """Every input in the model's order: the data's arrays, the constants, the current state."""
    if plan is None:
        return list(data)
    it = iter(data)
    return [plan["constants"][k] if k in plan["constants"] else state[k] if k in state else next(it)
            for k in range(plan["n"])]


def next_state(np, plan, outs, state, out_specs):
    new = {}
    for o, i, shape in plan["state"]:
        y = np.asarray(outs[o])
        if tuple(y.shape) != tuple(shape):
            name = out_specs[o].get("name") if o < len(out_specs) else o
            raise AgentFailure("inference_failed", f"state output {name!r} has shape {list(y.shape)}; the state "
                               f"input it feeds takes {list(shape)}", EXIT_RUNTIME)
        new[i] = y.astype(state[i].dtype, copy=False)
    return new


def join_samples(np, parts):
    """Per-sample outputs joined on the batch axis where each has one (a first axis of 1), else stacked on
    a new first axis (the same rule as the host's edgekit/stateful.py ``join_samples``)."""
    if all(p.ndim and p.shape[0] == 1 for p in parts):
        return np.concatenate(parts, axis=0)
    return np.stack(parts)


def stream_outputs(np, runner, shards, in_specs, out_specs, plan):
    """Every output of a stateful model on the eval set: one sample at a time, in order (shard after
    shard), each run fed the state the run before returned (zeros before the first)."""
    state = zero_state(np, plan, in_specs)
    parts = None
    try:
        for xs in shards:
            for i in range(len(xs[0])):
                feed = assemble(plan, [np.asarray(x[i:i + 1]) for x in xs], state)
                res = runner.run([_prepare(np, c, s) for c, s in zip(feed, in_specs)])
                res = [_restore_output(np, o, out_specs[k] if k < len(out_specs) else None) for k, o in enumerate(res)]
                state = next_state(np, plan, res, state, out_specs)
                parts = parts or [[] for _ in res]
                for k, o in enumerate(res):
                    parts[k].append(o)
    except AgentFailure:
        raise
    except Exception as exc:
        raise AgentFailure("inference_failed", f"{runner.name} failed on the eval set: {exc}", EXIT_RUNTIME) from exc
    return [join_samples(np, p) for p in parts or []]


# --------------------------------------------------------------------------- measurement loop
# Warmup (fixed count, or until latency stabilizes), the timed runs (until both a minimum count and
# a minimum time are met, or for N seconds in sustained mode), and the energy windows around them.
def _quantile(sorted_xs, q):
    """Linear-interpolation quantile (numpy's default) of an already sorted list."""
    if not sorted_xs:
        return None
    pos = (len(sorted_xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def summarize(xs):
    s = sorted(xs)
    if not s:
        return {"runs": 0}
    return {"runs": len(s), "mean": sum(s) / len(s), "min": s[0], "max": s[-1], "p50": _quantile(s, 0.5),
            "p90": _quantile(s, 0.9), "p99": _quantile(s, 0.99)}


def warmup_runs(run_once, req):
    """Untimed runs before measuring. ``warmup_mode`` "fixed" (default) runs ``warmup`` times;
    "auto" runs windows of ``warmup_window`` until two consecutive window medians agree within
    ``warmup_tolerance`` (and at least ``warmup`` runs), capped by ``max_warmup`` / ``max_warmup_seconds``."""
    mode = req.get("warmup_mode") or "fixed"
    n = int(req.get("warmup", 10))
    if mode == "fixed":
        for _ in range(n):
            run_once()
        return {"warmup": n, "warmup_mode": "fixed"}
    if mode != "auto":
        raise AgentFailure("bad_request", f"warmup_mode {mode!r}: use 'fixed' or 'auto'", EXIT_BAD_REQUEST)
    window = max(3, int(req.get("warmup_window", 10)))
    tol = float(req.get("warmup_tolerance", 0.05))
    max_n = max(window, int(req.get("max_warmup", 1000)))
    max_s = float(req.get("max_warmup_seconds", 30.0))
    clock = time.perf_counter_ns
    done, prev, medians, stable = 0, None, [], False
    started = time.perf_counter()
    while True:
        w = []
        for _ in range(window):
            a = clock()
            run_once()
            w.append((clock() - a) / 1e6)
        done += window
        med = _median(w)
        medians.append(med)
        if prev is not None and done >= n and abs(med - prev) <= tol * prev:
            stable = True
            break
        if done >= max_n or time.perf_counter() - started >= max_s:
            break
        prev = med
    return {"warmup": done, "warmup_mode": "auto", "warmup_stable": stable, "warmup_window": window,
            "warmup_tolerance": tol, "warmup_window_medians_ms": medians[-10:]}


def _bin_state(root):
    temps = _temperatures_c(root)
    f = _read(os.path.join(root, "sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq"))
    return {"temperature_c": max(temps.values()) if temps else None,
            "frequency_mhz": int(f) / 1000.0 if f and f.isdigit() else None}


def timed_runs(run_once, req, root="/"):
    """(raw timings in ms, sustained summary or None). Fixed mode stops when runs AND min_seconds
    are met (or max_runs / max_seconds is hit); sustained mode runs for ``sustained.seconds``."""
    clock = time.perf_counter_ns
    raw = []
    sus = req.get("sustained")
    if not sus:
        min_runs = int(req.get("runs", 50))
        min_s = float(req.get("min_seconds", 1.0))
        max_runs = int(req.get("max_runs", 5000))
        max_s = float(req.get("max_seconds", 120.0))
        started = time.perf_counter()
        while True:
            a = clock()
            run_once()
            raw.append((clock() - a) / 1e6)
            elapsed = time.perf_counter() - started
            if len(raw) >= max_runs or elapsed >= max_s:
                break
            if len(raw) >= min_runs and elapsed >= min_s:
                break
        return raw, None
    seconds = float(sus["seconds"])
    if seconds <= 0:
        raise AgentFailure("bad_request", f"sustained.seconds must be > 0, got {seconds}", EXIT_BAD_REQUEST)
    bin_s = float(sus.get("bin_s") or max(1.0, seconds / 30.0))
    seg_s = float(sus.get("segment_s") or min(60.0, seconds / 4.0))
    ends = []
    bins = []
    bin_start, next_bin = 0, bin_s
    t0 = clock()
    while True:
        a = clock()
        run_once()
        b = clock()
        raw.append((b - a) / 1e6)
        el = (b - t0) / 1e9
        ends.append(el)
        if el >= next_bin or el >= seconds:
            # between runs, outside the timed region: a cheap look at temperature and clock
            bins.append(dict(summarize(raw[bin_start:]), t_start_s=next_bin - bin_s, t_end_s=el, **_bin_state(root)))
            bin_start = len(raw)
            while next_bin <= el:
                next_bin += bin_s
            if el >= seconds:
                break
    total = ends[-1]
    first = [x for x, e in zip(raw, ends) if e <= seg_s]
    last = [x for x, e in zip(raw, ends) if e >= total - seg_s]
    fs, ls = summarize(first), summarize(last)
    summary = {"seconds": total, "bin_s": bin_s, "segment_s": seg_s, "bins": bins, "first": fs, "last": ls,
               "p50_ratio_last_first": (ls["p50"] / fs["p50"]) if fs.get("p50") and ls.get("p50") else None}
    return raw, summary


def decimate(raw, max_raw):
    """Every k-th timing when there are more than ``max_raw`` (a long sustained run), with k."""
    if max_raw and len(raw) > max_raw:
        k = -(-len(raw) // max_raw)
        return raw[::k], k
    return raw, 1


def measure_with_energy(run_once, req, root="/"):
    """Idle baseline, then the timed runs, with the energy source sampled in a background thread.
    Returns (raw, sustained, energy dict)."""
    ecfg = req.get("energy") or {}
    sources = list(ecfg.get("sources") or [])
    reader, reasons = open_energy_reader(ecfg, root)
    if reader is None:
        raw, sus = timed_runs(run_once, req, root)
        return raw, sus, no_energy(reasons, sources)
    hz = float(ecfg.get("sample_hz") or getattr(reader, "default_hz", DEFAULT_SAMPLE_HZ))
    baseline_s = float(ecfg.get("baseline_seconds", DEFAULT_BASELINE_S))
    sampler = EnergySampler(reader, hz)
    out = {"energy_mj_per_inference": None, "source": reader.name, "checked": reasons,
           "sample_hz_requested": hz}
    sampler.start()
    try:
        i0 = sampler.mark()
        time.sleep(baseline_s)  # idle: what the device draws without the model running
        i1 = sampler.mark()
    except EnergyUnavailable as exc:
        sampler.stop()
        out["reason"] = f"{reader.name}: {exc}"
        raw, sus = timed_runs(run_once, req, root)
        return raw, sus, out
    try:
        raw, sus = timed_runs(run_once, req, root)
        try:
            i2 = sampler.mark()
        except EnergyUnavailable as exc:
            sampler.error = sampler.error or str(exc)
            i2 = len(sampler.samples) - 1
    finally:
        sampler.stop()
    base, run = sampler.samples[i0:i1 + 1], sampler.samples[i1:i2 + 1]
    sign = 1
    try:
        if sampler.error:
            raise EnergyUnavailable(sampler.error)
        if hasattr(reader, "calibrate"):
            sign = reader.calibrate([v for _, v, _ in base])
        if hasattr(reader, "status") and reader.status() in ("Charging", "Full"):
            raise EnergyUnavailable("the battery started charging during the run")
        mj, info = energy_result(reader.kind, base, run, len(raw), sign)
    except EnergyUnavailable as exc:
        mj, info = None, {"reason": f"{reader.name}: {exc}"}
    out.update(info)
    out["energy_mj_per_inference"] = mj
    if len(run) > 1 and run[-1][0] > run[0][0]:
        out["sample_hz"] = (len(run) - 1) / (run[-1][0] - run[0][0])
    out["details"] = reader.details()
    return raw, sus, out


# --------------------------------------------------------------------------- eval pass
def _batch_size(runner, ev, plan=None):
    """How samples are fed: a model with a fixed batch N gets chunks of exactly N (the last one
    padded, the padding's outputs dropped); a dynamic batch gets chunks of ``batch_size``. A stateful
    model (a stream with state) gets one sample at a time; with constants only, the batch is read off
    the inputs the data feeds (a constant's first axis is no batch)."""
    if plan is not None and plan["state"]:
        return {"static": None, "eval": 1, "timed": 1}
    static = runner.static_batch() if plan is None else _data_batch(runner, plan)
    if static:
        return {"static": static, "eval": static, "timed": static}
    return {"static": None, "eval": int((ev or {}).get("batch_size", 64)), "timed": 1}


def _data_batch(runner, plan):
    shapes = getattr(runner, "input_shapes", None)
    if shapes is None:
        return runner.static_batch()
    firsts = [shapes[k][0] for k in plan["data"] if k < len(shapes) and shapes[k]]
    return next((d for d in firsts if isinstance(d, int) and d > 0), None)


def _pad(np, x, size):
    """``x`` grown to ``size`` samples by repeating its last sample (for a fixed-batch model)."""
    if len(x) >= size:
        return x[:size]
    return np.concatenate([x, np.repeat(x[-1:], size - len(x), axis=0)], axis=0)


def eval_outputs(np, runner, shards, in_specs, out_specs, bs, static, plan=None):
    """Every output of the model on the whole eval set (shard by shard), in the user's layout (a
    stream's constants fed beside each chunk)."""
    per_output = None
    chunks = ((xs, i) for xs in shards for i in range(0, len(xs[0]), bs))
    try:
        for xs, i in chunks:
            chunk = [np.asarray(x[i:i + bs]) for x in xs]
            got = len(chunk[0])
            if static:
                chunk = [_pad(np, c, static) for c in chunk]
            res = runner.run([_prepare(np, c, s) for c, s in zip(assemble(plan, chunk, {}), in_specs)])
            res = [_restore_output(np, o, out_specs[k] if k < len(out_specs) else None) for k, o in enumerate(res)]
            if per_output is None:
                per_output = [[] for _ in res]
            for k, o in enumerate(res):
                per_output[k].append(o[:got] if static and o.ndim and len(o) == static else o)
    except AgentFailure:
        raise
    except Exception as exc:
        raise AgentFailure("inference_failed", f"{runner.name} failed on the eval set: {exc}", EXIT_RUNTIME) from exc
    return [np.concatenate(parts, axis=0) for parts in per_output or []]


def bucket_groups(shards, counts, plan):
    """The eval shards split into shape buckets (``counts``: shards per bucket, in order), or None for
    data of one shape."""
    if not counts:
        return None
    if sum(counts) != len(shards) or any(c < 1 for c in counts):
        raise AgentFailure("bad_data", f"eval buckets {counts} do not add up to the {len(shards)} shards",
                           EXIT_BAD_REQUEST)
    if plan is not None and plan["state"]:
        raise AgentFailure("bad_data", "a stateful stream cannot run over eval data at several shapes",
                           EXIT_BAD_REQUEST)
    out, at = [], 0
    for c in counts:
        out.append(shards[at:at + c])
        at += c
    return out


def bucket_latency(np, runner, groups, raw0, batch, plan, in_specs, req):
    """Latency per shape bucket: bucket 0's are the main timed runs (``raw0``); every other bucket's
    first chunk is timed after a few untimed runs, as many runs as bucket 0 had (at most 200, at least 5)."""
    runs = max(5, min(len(raw0), 200))
    warm = min(int(req.get("warmup", 10)), 10)
    out = []
    for j, g in enumerate(groups):
        samples = sum(len(sh[0]) for sh in g)
        shapes = [list(x.shape[1:]) for x in g[0]]
        if j == 0:
            ms = raw0
        else:
            chunk = [_pad(np, np.asarray(x[0:batch["timed"]]), batch["timed"]) for x in g[0]]
            feeds = [_prepare(np, x, s) for x, s in zip(assemble(plan, chunk, zero_state(np, plan, in_specs)),
                                                        in_specs)]
            for _ in range(warm):
                runner.run(feeds)
            ms = []
            for _ in range(runs):
                a = time.perf_counter_ns()
                runner.run(feeds)
                ms.append((time.perf_counter_ns() - a) / 1e6)
        st = summarize(ms)
        out.append({"shapes": shapes, "samples": samples, "runs": st["runs"], "p50": st["p50"], "mean": st["mean"]})
    return out


# --------------------------------------------------------------------------- measurement
def measure(req):
    import numpy as np

    model = req["model"]
    if req.get("model_sha256"):
        got = model_sha256(model, req.get("companions"))
        if got != req["model_sha256"]:
            raise AgentFailure("integrity", f"model file {model} has sha256 {got[:12]}..., expected "
                               f"{req['model_sha256'][:12]}... (corrupted transfer)", EXIT_BAD_REQUEST)
    runtime = req["runtime"]
    if runtime not in RUNNERS:
        raise AgentFailure("bad_request", f"unknown runtime {runtime!r}; known: {sorted(RUNNERS)}", EXIT_BAD_REQUEST)
    in_specs = req["inputs"]
    out_specs = req.get("outputs") or []

    state_before = device_state(req.get("sysfs_root") or (req.get("energy") or {}).get("sysfs_root") or "/")
    rss0, _, _ = memory_mb()
    t0 = time.perf_counter()
    runner = RUNNERS[runtime].open(model, req)
    load_ms = (time.perf_counter() - t0) * 1000.0
    rss1, _, _ = memory_mb()

    ev = req.get("eval")
    plan = stream_plan(np, req, in_specs, out_specs)  # constant and state inputs, or None
    batch = _batch_size(runner, ev, plan)
    if ev:
        xs = load_eval(np, ev, data_specs(plan, in_specs))
        n = sum(len(sh[0]) for sh in xs)
        groups = bucket_groups(xs, ev.get("buckets"), plan)
        sample = [_pad(np, np.asarray(x[0:batch["timed"]]), batch["timed"]) for x in xs[0]]
    else:
        xs, n, groups = None, 0, None
        sample = synthetic_inputs(np, data_specs(plan, in_specs))
    # the timed runs: one chunk, with the constants and a zero state
    feeds = [_prepare(np, x, s) for x, s in zip(assemble(plan, sample, zero_state(np, plan, in_specs)), in_specs)]

    root = req.get("sysfs_root") or (req.get("energy") or {}).get("sysfs_root") or "/"

    def run_once():
        runner.run(feeds)

    try:
        warm = warmup_runs(run_once, req)
        busy = BusyMeter()
        raw, sustained, energy = measure_with_energy(run_once, req, root)
        other_cpu = busy.other_cpu_fraction()
    except AgentFailure:
        raise
    except Exception as exc:
        raise AgentFailure("inference_failed", f"{runtime} failed to run the model: {exc}", EXIT_RUNTIME) from exc
    runs_done = len(raw)
    by_bucket = None
    if groups is not None:  # the other shapes: one chunk each, timed after the main runs (bucket 0's)
        try:
            by_bucket = bucket_latency(np, runner, groups, raw, batch, plan, in_specs, req)
        except Exception as exc:
            raise AgentFailure("inference_failed", f"{runtime} failed on the eval data's other sample shapes: "
                               f"{exc}", EXIT_RUNTIME) from exc
    raw, decimation = decimate(raw, int(req.get("max_raw", 200000)))
    _, peak_mb, mem_source = memory_mb()
    pss = pss_mb()
    arena_mb, arena_reason = runtime_arena(runner)
    state_after = device_state(root)
    warnings = list(getattr(runner, "warnings", [])) + state_warnings(state_before, state_after, other_cpu)
    if warm.get("warmup_stable") is False:
        warnings.append(f"latency did not stabilize during {warm['warmup']} warmup runs")
    op_profile = None
    if req.get("profile"):  # after the timed runs and the device readings, so it never touches them
        try:
            op_profile = runner.profile(feeds, int(req["profile"].get("runs", 20)))
        except Exception as exc:  # a profiler that breaks is the answer's reason, not a failed run
            op_profile = no_op_profile(f"{runtime}'s profiler failed: {type(exc).__name__}: {exc}")

    outputs_path = req.get("outputs_path")
    eval_s = None
    if xs is not None:
        t_eval = time.perf_counter()
        if plan is not None and plan["state"]:
            outs = stream_outputs(np, runner, xs, in_specs, out_specs, plan)
            named = {f"output_{i}": o for i, o in enumerate(outs)}
        elif groups is not None:  # one set of outputs per shape bucket: they cannot be stacked
            named = {f"bucket_{j}_output_{i}": o for j, g in enumerate(groups)
                     for i, o in enumerate(eval_outputs(np, runner, g, in_specs, out_specs, batch["eval"],
                                                        batch["static"], plan))}
        else:
            outs = eval_outputs(np, runner, xs, in_specs, out_specs, batch["eval"], batch["static"], plan)
            named = {f"output_{i}": o for i, o in enumerate(outs)}
        eval_s = time.perf_counter() - t_eval  # the eval pass alone: what a sharded fleet divides
        if outputs_path:
            os.makedirs(os.path.dirname(outputs_path) or ".", exist_ok=True)
            tmp = outputs_path + ".partial.npz"
            np.savez(tmp, **named)
            os.replace(tmp, outputs_path)

    return {
        "protocol": PROTOCOL,
        "agent_version": AGENT_VERSION,
        "ok": True,
        "variant": req.get("variant"),
        "device": device_facts(),
        "device_state": {"before": state_before, "after": state_after, "other_cpu_fraction": other_cpu},
        "runtime": {"name": runner.name, "version": runner.version, "threads": runner.threads,
                    "delegate": getattr(runner, "delegate", None),
                    **({"options": runner.options} if getattr(runner, "options", None) else {})},
        "load_ms": load_ms,
        "latency_ms": dict(warm, runs=runs_done, raw=raw, raw_decimation=decimation,
                           **({"buckets": by_bucket} if by_bucket is not None else {})),
        "sustained": sustained,
        "memory": {
            "peak_rss_mb": peak_mb,
            "source": mem_source,
            "rss_before_load_mb": rss0,
            "rss_after_load_mb": rss1,
            "load_delta_mb": (rss1 - rss0) if (rss0 is not None and rss1 is not None) else None,
            "pss_mb": pss,
            "arena_mb": arena_mb,
            "arena_reason": arena_reason,
        },
        "energy": energy,
        "warnings": warnings,
        "eval": {"samples": n, "batch_size": batch["eval"], "static_batch": batch["static"],
                 "seconds": round(eval_s, 4) if eval_s is not None else None,
                 **({"stateful": True, "order": "one sample at a time, state carried"}
                    if plan is not None and plan["state"] else {})} if xs is not None else None,
        "outputs_path": outputs_path if xs is not None else None,
        **({"op_profile": op_profile} if op_profile is not None else {}),
    }


def measure_ab(req):
    """Two models of one interface in ONE process, timed in alternating blocks (A B, B A, A B ...):
    the request's model is A, ``ab.model`` is B. Whatever the device does meanwhile (other load,
    clocks, heat) hits both sides of a block pair alike, so the host can judge their ratio. Each
    block runs for ``block_seconds`` (at least ``min_runs`` runs, at most ``max_runs``)."""
    import numpy as np

    ab = req["ab"]
    # B's own files beside its model, and the runtime options its file needs (NCNN's fp16 setting)
    req_b = {**req, "companions": ab.get("companions"),
             "runtime_options": ab["runtime_options"] if "runtime_options" in ab else req.get("runtime_options")}
    for r, path, digest in ((req, req["model"], req.get("model_sha256")), (req_b, ab["model"], ab.get("model_sha256"))):
        if digest and model_sha256(path, r.get("companions")) != digest:
            raise AgentFailure("integrity", f"model file {path} does not have sha256 {digest[:12]}...",
                               EXIT_BAD_REQUEST)
    runtime = req["runtime"]
    if runtime not in RUNNERS:
        raise AgentFailure("bad_request", f"unknown runtime {runtime!r}; known: {sorted(RUNNERS)}", EXIT_BAD_REQUEST)
    runners = {"a": RUNNERS[runtime].open(req["model"], req), "b": RUNNERS[runtime].open(ab["model"], req_b)}
    in_specs = req["inputs"]
    plan = stream_plan(np, req, in_specs, req.get("outputs") or [])  # constants, and a zero state
    sample = assemble(plan, synthetic_inputs(np, data_specs(plan, in_specs)), zero_state(np, plan, in_specs))
    feeds = [_prepare(np, x, s) for x, s in zip(sample, in_specs)]
    try:
        for r in runners.values():
            warmup_runs(lambda r=r: r.run(feeds), req)
        blocks, block_s = int(ab.get("blocks", 20)), float(ab.get("block_seconds", 0.1))
        min_runs, max_runs = int(ab.get("min_runs", 3)), int(ab.get("max_runs", 500))
        clock = time.perf_counter_ns
        out, order = {"a": [], "b": []}, []
        for i in range(blocks):
            for side in (("a", "b") if i % 2 == 0 else ("b", "a")):
                run, t, start = runners[side].run, [], time.perf_counter()
                while len(t) < max_runs and (len(t) < min_runs or time.perf_counter() - start < block_s):
                    a = clock()
                    run(feeds)
                    t.append((clock() - a) / 1e6)
                out[side].append(t)
                order.append(side)
    except AgentFailure:
        raise
    except Exception as exc:
        raise AgentFailure("inference_failed", f"{runtime} failed to run the model: {exc}", EXIT_RUNTIME) from exc
    r = runners["b"]
    raw_b = [x for blk in out["b"] for x in blk]
    # each side's runner notes (a delegate that could not prepare and fell back): a ratio between two
    # different kernel paths must say so
    warnings = [f"{side.upper()}: {w}" for side in ("a", "b") for w in getattr(runners[side], "warnings", [])]
    return {
        "protocol": PROTOCOL, "agent_version": AGENT_VERSION, "ok": True, "variant": req.get("variant"),
        "device": device_facts(), "load_ms": None, "warnings": warnings,
        "runtime": {"name": r.name, "version": r.version, "threads": r.threads,
                    "delegate": getattr(r, "delegate", None),
                    **({"options": r.options} if getattr(r, "options", None) else {})},
        "latency_ms": {"warmup": int(req.get("warmup", 10)), "runs": len(raw_b), "raw": raw_b},
        "ab": {"a": out["a"], "b": out["b"], "order": "".join(order)},
    }


def model_sha256(path, companions=None):
    """The hash of a model that may be a set of files (edgekit/fsutil.py ``sha256_files``): one file, its
    own hash; with companions ({suffix: path}), over each file's suffix and hash, the main file first."""
    if not companions:
        return sha256(path)
    h = hashlib.sha256()
    for suffix, p in [(os.path.splitext(path)[1], path), *companions.items()]:
        h.update(suffix.encode() + b"\0" + sha256(p).encode() + b"\n")
    return h.hexdigest()


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def probe():
    return {
        "protocol": PROTOCOL,
        "agent_version": AGENT_VERSION,
        "ok": True,
        "device": device_facts(),
        "device_state": device_state(),
        "runtimes": available_runtimes(),
    }


def _test_fault_injection(req):
    """TEST FAULT INJECTION ONLY (tests/unit/test_tuning_robust.py), off unless the variable is set in
    the agent's own environment (the local transport's subprocess; never forwarded over SSH or adb):
    EDGEKIT_AGENT_TEST_HANG_ON / EDGEKIT_AGENT_TEST_KILL_ON = "key=value[,key=value]" over the
    request's runtime options and ``threads``; a request matching all of them hangs, or is killed by
    SIGKILL, as a runtime stuck or crashing on one setting would."""
    for var in ("EDGEKIT_AGENT_TEST_HANG_ON", "EDGEKIT_AGENT_TEST_KILL_ON"):
        spec = os.environ.get(var)
        have = {k: str(v) for k, v in (req.get("runtime_options") or {}).items()}
        have["threads"] = str(req.get("threads", 1))
        if spec and all(have.get(k) == v for k, _, v in (p.partition("=") for p in spec.split(","))):
            if var.endswith("HANG_ON"):
                time.sleep(3600)
            import signal

            os.kill(os.getpid(), signal.SIGKILL)


def main(argv):
    try:
        if len(argv) == 2 and argv[1] == "--probe":
            doc = probe()
        elif len(argv) >= 2 and argv[1] == "--sha256":
            doc = {"protocol": PROTOCOL, "ok": True,
                   "sha256": {p: (sha256(p) if os.path.isfile(p) else None) for p in argv[2:]}}
        elif len(argv) == 2 and argv[1] == "--version":
            doc = {"protocol": PROTOCOL, "agent_version": AGENT_VERSION, "ok": True}
        elif len(argv) == 2:
            try:
                with open(argv[1], encoding="utf-8") as fh:
                    req = json.load(fh)
            except (OSError, ValueError) as exc:
                raise AgentFailure("bad_request", f"cannot read request {argv[1]}: {exc}", EXIT_BAD_REQUEST) from exc
            if req.get("protocol") != PROTOCOL:
                raise AgentFailure("bad_request", f"request protocol {req.get('protocol')} != agent protocol "
                                   f"{PROTOCOL}", EXIT_BAD_REQUEST)
            _test_fault_injection(req)
            doc = measure_ab(req) if req.get("ab") else measure(req)
        else:
            raise AgentFailure("usage", "usage: edgekit_agent.py REQUEST.json | --probe | --sha256 FILE... | --version", EXIT_BAD_REQUEST)
    except AgentFailure as exc:
        print(json.dumps({"protocol": PROTOCOL, "agent_version": AGENT_VERSION, "ok": False,
                          "error": {"kind": exc.kind, "message": exc.message}}))
        return exc.exit_code
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
