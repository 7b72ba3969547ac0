"""The timing loop: warm-up (a fixed count, or until latency stabilizes), the timed runs (until both a
minimum count and a minimum time are met, or for N seconds in sustained mode), and the energy windows
around them. Raw per-run timings go back to the host, which computes every statistic."""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from .device import read_text, temperatures_c
from .energy import (
    DEFAULT_BASELINE_S,
    DEFAULT_SAMPLE_HZ,
    EnergySampler,
    EnergyUnavailable,
    energy_result,
    no_energy,
    open_energy_reader,
)
from .protocol import EXIT_BAD_REQUEST, AgentFailure, Doc
from .stats import median, summarize

RunOnce = Callable[[], Any]


def warmup_runs(run_once: RunOnce, req: Doc) -> Doc:
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
    done, stable = 0, False
    prev: float | None = None
    medians: list[float | None] = []
    started = time.perf_counter()
    while True:
        w: list[float] = []
        for _ in range(window):
            a = clock()
            run_once()
            w.append((clock() - a) / 1e6)
        done += window
        med = median(w)
        medians.append(med)
        if med is not None and prev is not None and done >= n and abs(med - prev) <= tol * prev:
            stable = True
            break
        if done >= max_n or time.perf_counter() - started >= max_s:
            break
        prev = med
    return {
        "warmup": done,
        "warmup_mode": "auto",
        "warmup_stable": stable,
        "warmup_window": window,
        "warmup_tolerance": tol,
        "warmup_window_medians_ms": medians[-10:],
    }


def _bin_state(root: str) -> Doc:
    temps = temperatures_c(root)
    f = read_text(os.path.join(root, "sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq"))
    return {
        "temperature_c": max(temps.values()) if temps else None,
        "frequency_mhz": int(f) / 1000.0 if f and f.isdigit() else None,
    }


def timed_runs(run_once: RunOnce, req: Doc, root: str = "/") -> tuple[list[float], Doc | None]:
    """(raw timings in ms, sustained summary or None). Fixed mode stops when runs AND min_seconds
    are met (or max_runs / max_seconds is hit); sustained mode runs for ``sustained.seconds``."""
    clock = time.perf_counter_ns
    raw: list[float] = []
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
    ends: list[float] = []
    bins: list[Doc] = []
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
    summary = {
        "seconds": total,
        "bin_s": bin_s,
        "segment_s": seg_s,
        "bins": bins,
        "first": fs,
        "last": ls,
        "p50_ratio_last_first": (ls["p50"] / fs["p50"]) if fs.get("p50") and ls.get("p50") else None,
    }
    return raw, summary


def decimate(raw: list[float], max_raw: int) -> tuple[list[float], int]:
    """Every k-th timing when there are more than ``max_raw`` (a long sustained run), with k."""
    if max_raw and len(raw) > max_raw:
        k = -(-len(raw) // max_raw)
        return raw[::k], k
    return raw, 1


def measure_with_energy(run_once: RunOnce, req: Doc, root: str = "/") -> tuple[list[float], Doc | None, Doc]:
    """Idle baseline, then the timed runs, with the energy source sampled in a background thread.
    Returns (raw, sustained, energy dict)."""
    ecfg = req.get("energy") or {}
    sources = list(ecfg.get("sources") or [])
    reader, reasons = open_energy_reader(ecfg, root)
    if reader is None:
        raw, sus = timed_runs(run_once, req, root)
        return raw, sus, no_energy(reasons, sources)
    hz = float(ecfg.get("sample_hz") or getattr(reader, "default_hz", None) or DEFAULT_SAMPLE_HZ)
    baseline_s = float(ecfg.get("baseline_seconds", DEFAULT_BASELINE_S))
    sampler = EnergySampler(reader, hz)
    out: Doc = {"energy_mj_per_inference": None, "source": reader.name, "checked": reasons, "sample_hz_requested": hz}
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
    base, run = sampler.samples[i0 : i1 + 1], sampler.samples[i1 : i2 + 1]
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
