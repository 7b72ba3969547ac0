"""Sustained mode: the device runs the model for N seconds and the agent bins latency over time
(with temperature and clock per bin). Here the first and last segments are compared, to catch a
device that slows down as it heats up, which a one-second measurement never shows."""

from __future__ import annotations

from typing import Any

SLOWDOWN_WARN = 1.10  # last-segment median / first-segment median above which the report warns


def request_fields(seconds: float, *, bin_s: float | None = None, segment_s: float | None = None) -> dict:
    """The request's ``sustained`` block: bins of ~1/30 of the run (>= 1 s), first/last segments
    of a minute (a quarter of the run when it is shorter than four minutes)."""
    if seconds <= 0:
        raise ValueError("sustained seconds must be > 0")
    return {"seconds": float(seconds), "bin_s": float(bin_s or max(1.0, seconds / 30.0)),
            "segment_s": float(segment_s or min(60.0, seconds / 4.0))}


def analyze(summary: dict | None) -> dict | None:
    """The agent's summary with slowdown, temperature rise, clock change and ``warnings`` added."""
    if not summary:
        return None
    first, last = summary.get("first") or {}, summary.get("last") or {}
    bins = summary.get("bins") or []
    out: dict[str, Any] = dict(summary)
    warnings: list[str] = []
    slowdown = (last["p50"] / first["p50"]) if first.get("p50") and last.get("p50") else None
    out["slowdown"] = slowdown
    temps = [b["temperature_c"] for b in bins if b.get("temperature_c") is not None]
    freqs = [b["frequency_mhz"] for b in bins if b.get("frequency_mhz") is not None]
    out["temperature_rise_c"] = (temps[-1] - temps[0]) if len(temps) > 1 else None
    out["frequency_change_pct"] = ((freqs[-1] / freqs[0] - 1) * 100) if len(freqs) > 1 and freqs[0] else None
    if slowdown is not None and slowdown > SLOWDOWN_WARN:
        seg = summary.get("segment_s")
        why = []
        if out["temperature_rise_c"] is not None and out["temperature_rise_c"] > 0:
            why.append(f"temperature +{out['temperature_rise_c']:.1f} C")
        if out["frequency_change_pct"] is not None and out["frequency_change_pct"] < 0:
            why.append(f"CPU clock {out['frequency_change_pct']:.0f}%")
        cause = f" with {', '.join(why)}: thermal throttling likely" if why else ""
        warnings.append(f"sustained run: median latency rose {100 * (slowdown - 1):.0f}% from the first to the last "
                        f"{seg:g} s ({first['p50']:.3f} -> {last['p50']:.3f} ms){cause}")
    out["warnings"] = warnings
    return out
