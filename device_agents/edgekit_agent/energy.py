"""Energy on the device: a reader per source (RAPL, hwmon, an Android battery, an external meter command),
a background sampler with synchronous marks at phase edges, and the net energy per inference above
the idle baseline with its uncertainty. No source, no figure: the reason goes into the report."""

from __future__ import annotations

import os
import time
from typing import Any, Sequence, Tuple

from .device import read_text
from .protocol import Doc
from .stats import median, sem

Sample = Tuple[float, float, float]  # (t, value, read_seconds)

# Readers of every energy source a device may have. A reader is "power" (read() -> watts now) or
# "energy" (read() -> cumulative joules). EnergyUnavailable carries the reason into the report.
ENERGY_SOURCES = ("rapl", "hwmon", "android_battery", "external_command")
DEFAULT_SAMPLE_HZ = 50.0
DEFAULT_BASELINE_S = 1.0


class EnergyUnavailable(Exception):
    pass


def _read_int_strict(path: str) -> int:
    with open(path, encoding="ascii") as fh:
        return int(fh.read().strip())


class _WrappingCounter:
    """A sysfs energy counter in µJ that wraps to 0 at max_energy_range_uj (RAPL)."""

    def __init__(self, path: str, max_range: int | None) -> None:
        self.path, self.max_range = path, max_range
        self.last: int | None = None
        self.offset, self.wraps = 0, 0

    def read_uj(self) -> int:
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

    def __init__(self, root: str = "/", **_: Any) -> None:
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
            zname = read_text(os.path.join(base, e, "name"), e)
            if len(parts) == 2 or zname == "dram":
                zones.append((e, zname))
        if any(z == "psys" for _, z in zones):
            zones = [(e, z) for e, z in zones if z == "psys"]  # psys already includes the packages
        if not zones:
            raise EnergyUnavailable(f"{base} has no intel-rapl zone")
        self.counters: list[_WrappingCounter] = []
        self.domains: list[str] = []
        for e, zname in zones:
            path = os.path.join(base, e, "energy_uj")
            try:
                _read_int_strict(path)
            except PermissionError:
                raise EnergyUnavailable(
                    f"{path} is readable only by root (kernels since 5.10); run the agent "
                    "as root or grant read access (chmod o+r)"
                )
            except (OSError, ValueError) as exc:
                raise EnergyUnavailable(f"cannot read {path}: {exc}")
            rng = read_text(os.path.join(base, e, "max_energy_range_uj"))
            self.counters.append(_WrappingCounter(path, int(rng) if rng and rng.isdigit() else None))
            self.domains.append(f"{e} ({zname})")

    def read(self) -> float:
        return sum(c.read_uj() for c in self.counters) / 1e6

    def details(self) -> Doc:
        return {"domains": self.domains, "wraps": sum(c.wraps for c in self.counters)}


# Labels of a sensor channel that measures the whole board's input (summing the rails would double count).
_TOTAL_LABELS = ("vdd_in", "pom_5v_in", "vin", "total", "sys_in")


class HwmonReader:
    """hwmon power sensors: power*_input (µW), or bus voltage in*_input (mV) x curr*_input (mA) by
    channel. INA3221 (Jetson) exposes channels 1-3 as in/curr pairs (in4-6 are shunt voltages);
    INA219/INA226 (ina2xx) expose power1_input. Channels: ``channels`` (labels) when given, else a
    board-input channel (VDD_IN...) when one exists, else all channels summed."""

    name, kind = "hwmon", "power"

    def __init__(
        self, root: str = "/", sensor: str | None = None, channels: Sequence[str] | None = None, **_: Any
    ) -> None:
        base = os.path.join(root, "sys/class/hwmon")
        try:
            devs = sorted(d for d in os.listdir(base) if d.startswith("hwmon"))
        except OSError:
            raise EnergyUnavailable(f"{base} does not exist (no hwmon sensors)")
        found: list[tuple[str, str, str, list[str]]] = []  # (full label, label, kind, paths)
        names: list[str] = []
        for d in devs:
            path = os.path.join(base, d)
            dname = read_text(os.path.join(path, "name"), d) or d
            names.append(dname)
            if sensor and dname != sensor:
                continue
            try:
                files = set(os.listdir(path))
            except OSError:
                continue
            power = sorted(f for f in files if f.startswith("power") and f.endswith("_input"))
            chans: list[tuple[str, str, list[str]]] = []
            for f in power:
                idx = f[len("power") : -len("_input")]
                label = read_text(os.path.join(path, f"power{idx}_label")) or f"{dname}/power{idx}"
                chans.append((label, "uW", [os.path.join(path, f)]))
            if not chans:
                for f in sorted(files):
                    if not (f.startswith("curr") and f.endswith("_input")):
                        continue
                    idx = f[len("curr") : -len("_input")]
                    if dname == "ina3221" and idx not in ("1", "2", "3"):
                        continue  # curr4 is the summed-shunt channel; in4-6 are shunt voltages
                    if f"in{idx}_input" not in files:
                        continue
                    label = (
                        read_text(os.path.join(path, f"in{idx}_label"))
                        or read_text(os.path.join(path, f"curr{idx}_label"))
                        or f"{dname}/ch{idx}"
                    )
                    chans.append((label, "mV*mA", [os.path.join(path, f"in{idx}_input"), os.path.join(path, f)]))
            found += [(f"{dname}:{lab}" if not lab.startswith(dname) else lab, lab, k, p) for lab, k, p in chans]
        if not found:
            what = f"sensor '{sensor}'" if sensor else "sensor"
            raise EnergyUnavailable(
                f"no hwmon {what} with power*_input or in*/curr*_input pairs in {base} "
                f"(sensors: {', '.join(names) or 'none'})"
            )
        if channels:
            want = set(channels)
            chosen = [c for c in found if c[1] in want or c[0] in want]
            if len(chosen) != len(want):
                raise EnergyUnavailable(
                    f"hwmon channels {sorted(want)} not all found; available: {[c[1] for c in found]}"
                )
            rule = "channels named in the request"
        else:
            totals = [c for c in found if c[1].strip().lower() in _TOTAL_LABELS]
            chosen, rule = (totals, "board input channel") if totals else (found, "sum of all channels")
        self.channels = [(full, k, p) for full, _, k, p in chosen]
        self.rule = rule
        self.read()  # fail now, with the reason, rather than in the sampler

    def read(self) -> float:
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

    def details(self) -> Doc:
        return {"channels": [c[0] for c in self.channels], "rule": self.rule}


class AndroidBatteryReader:
    """Battery current x voltage from power_supply (current_now µA, voltage_now µV). Devices differ
    in the sign of a discharging current: it is calibrated from the idle baseline, taken while the
    battery reports Discharging (or set with ``sign``: "discharge_positive" | "discharge_negative")."""

    name, kind = "android_battery", "power"

    def __init__(self, root: str = "/", sign: str | None = None, current_unit: str | None = None, **_: Any) -> None:
        base = os.path.join(root, "sys/class/power_supply")
        try:
            supplies = sorted(os.listdir(base))
        except OSError:
            raise EnergyUnavailable(f"{base} does not exist (no power_supply class)")
        cands = [s for s in supplies if s == "battery"] + [
            s for s in supplies if s != "battery" and (read_text(os.path.join(base, s, "type")) or "") == "Battery"
        ]
        found: str | None = None
        for s in cands:
            p = os.path.join(base, s)
            if os.path.exists(os.path.join(p, "current_now")) and os.path.exists(os.path.join(p, "voltage_now")):
                found = p
                break
        if found is None:
            raise EnergyUnavailable(
                f"no battery with current_now and voltage_now in {base} (supplies: {', '.join(supplies) or 'none'})"
            )
        self.path: str = found
        if sign not in (None, "discharge_positive", "discharge_negative"):
            raise EnergyUnavailable(f"android sign {sign!r}: use discharge_positive or discharge_negative")
        self.sign: int | None = {None: None, "discharge_positive": 1, "discharge_negative": -1}[sign]
        self.sign_source: str | None = "request" if sign else None
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
                "current is not what it consumes; unplug USB (adb over Wi-Fi: `adb tcpip`) or use an external meter"
            )
        if self.sign is None and self.status_before != "Discharging":
            raise EnergyUnavailable(
                f"battery status is {self.status_before!r}, not Discharging: the current's sign "
                "cannot be calibrated; set energy.android.sign in the request"
            )
        self.read()

    def status(self) -> str:
        return read_text(os.path.join(self.path, "status"), "Unknown") or "Unknown"

    def read(self) -> float:
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

    def calibrate(self, baseline_powers: Sequence[float]) -> int:
        """Fix the sign from the idle baseline (the battery discharges then); returns +1 or -1."""
        if self.sign is None:
            med = median(baseline_powers) or 0.0
            if med == 0:
                raise EnergyUnavailable(
                    "the battery current was 0 during the idle baseline: its sign cannot be "
                    "calibrated (the device may be on external power)"
                )
            self.sign = 1 if med > 0 else -1
            self.sign_source = "calibrated while Discharging"
        return self.sign

    def details(self) -> Doc:
        return {
            "supply": os.path.basename(self.path),
            "status": self.status_before,
            "sign": {1: "discharge_positive", -1: "discharge_negative"}.get(self.sign or 0),
            "sign_source": self.sign_source,
            "current_unit": self.current_unit,
        }


class ExternalCommandReader:
    """A user command (USB power meter, Joulescope script...) that prints cumulative joules as the
    first number on its last output line. Runs as an argv list, never through a shell."""

    name, kind = "external_command", "energy"
    default_hz = 1.0  # each read is a process start: sample slowly so the meter does not load the device

    def __init__(self, command: str | Sequence[str] | None = None, timeout: float = 10.0, **_: Any) -> None:
        import shlex

        if not command:
            raise EnergyUnavailable(
                "no external meter command configured (energy.external_command in the request, "
                "`--energy-command` on the host)"
            )
        self.argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
        self.timeout = float(timeout)
        self.read()

    def read(self) -> float:
        import subprocess

        try:
            res = subprocess.run(self.argv, capture_output=True, text=True, timeout=self.timeout)
        except (OSError, subprocess.SubprocessError) as exc:
            raise EnergyUnavailable(f"external meter command {self.argv[0]!r} failed to run: {exc}")
        lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
        if res.returncode != 0 or not lines:
            raise EnergyUnavailable(
                f"external meter command {self.argv[0]!r} exited {res.returncode} with "
                f"{'no output' if not lines else 'output'}: "
                f"{(res.stderr or res.stdout).strip()[:200]}"
            )
        try:
            return float(lines[-1].split()[0])
        except ValueError:
            raise EnergyUnavailable(
                f"external meter command printed {lines[-1][:80]!r}; expected cumulative joules as a number"
            )

    def details(self) -> Doc:
        return {"command": self.argv[0]}


READERS = {
    "rapl": RaplReader,
    "hwmon": HwmonReader,
    "android_battery": AndroidBatteryReader,
    "external_command": ExternalCommandReader,
}


def open_energy_reader(cfg: Doc, root: str = "/") -> tuple[Any, list[str]]:
    """The first source in the target's priority order that reads; (reader, reasons of the others)."""
    reasons = []
    sources = list(cfg.get("sources") or [])
    for src in sources:
        cls = READERS.get(src)
        if cls is None:
            reasons.append(f"{src}: unknown source (known: {', '.join(ENERGY_SOURCES)})")
            continue
        kwargs: dict[str, Any] = {"root": root}
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


class EnergySampler:
    """Samples a reader in a background thread; ``mark()`` takes a synchronous sample at a phase
    boundary (baseline start, run start, run end) so every window has exact edges."""

    def __init__(self, reader: Any, hz: float = DEFAULT_SAMPLE_HZ) -> None:
        import threading

        self.reader = reader
        self.period = 1.0 / max(0.1, float(hz))
        self.samples: list[Sample] = []  # (t, value, read_seconds)
        self.error: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="edgekit-energy", daemon=True)

    def _sample(self) -> int:
        with self._lock:
            a = time.perf_counter()
            try:
                v = self.reader.read()
            except (OSError, ValueError) as exc:  # a sensor that vanishes mid-run costs the figure, not the run
                raise EnergyUnavailable(f"reading {self.reader.name} failed: {exc}") from exc
            b = time.perf_counter()
            self.samples.append(((a + b) / 2, v, b - a))
            return len(self.samples) - 1

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self._sample()
            except EnergyUnavailable as exc:
                self.error = str(exc)
                return

    def start(self) -> None:
        self._thread.start()

    def mark(self) -> int:
        return self._sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def window_energy(kind: str, samples: Sequence[Sample]) -> tuple[float | None, float | None, list[float]]:
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


def energy_result(
    kind: str, base: Sequence[Sample], run: Sequence[Sample], inferences: int, sign: int = 1
) -> tuple[float | None, Doc]:
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
        return None, {
            "reason": "the power reading turned negative during the run (the device started "
            "charging?): no energy figure"
        }
    if rj is None or not rs:
        return None, {"reason": f"only {len(run)} energy sample(s) during the run: raise min_seconds or sample_hz"}
    if bj is None or not bs:
        return None, {"reason": f"only {len(base)} energy sample(s) during the idle baseline"}
    base_w = bj / bs
    run_w = rj / rs
    net_j = rj - base_w * rs
    if kind == "power":
        s_run = sem(rp) * rs
    else:
        s_run = abs(run_w) * 0.5 * (run[0][2] + run[-1][2])
    s_base = (sem(bp) if len(bp) > 1 else abs(base_w) * 0.5 * (base[0][2] + base[-1][2]) / bs) * rs
    sigma = (s_run**2 + s_base**2) ** 0.5
    info = {
        "baseline_w": base_w,
        "run_w": run_w,
        "net_j": net_j,
        "run_seconds": rs,
        "baseline_seconds": bs,
        "samples": len(run),
        "baseline_samples": len(base),
        "uncertainty_j": sigma,
    }
    if net_j <= 1e-9 * abs(rj):  # zero within float rounding counts as zero
        info["reason"] = (
            f"the run drew no more power than idle ({run_w:.3f} W vs baseline {base_w:.3f} W, "
            f"uncertainty {sigma:.3g} J): energy per inference is below what this source resolves"
        )
        return None, info
    info["uncertainty_mj"] = sigma / inferences * 1000.0
    info["significant"] = net_j > 2 * sigma
    return net_j / inferences * 1000.0, info


def no_energy(reasons: Sequence[str], sources: Sequence[str] | None) -> Doc:
    if not sources:
        reason = "the target lists no energy source"
    else:
        reason = "no readable energy source: " + "; ".join(reasons)
    return {"energy_mj_per_inference": None, "source": None, "reason": reason, "checked": reasons}
