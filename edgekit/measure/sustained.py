"""Sustained mode: the device runs the model for N seconds and the agent bins latency over time
(with temperature and clock per bin). Here the first and last segments are compared, to catch a
device that slows down as it heats up, which a one-second measurement never shows. The request's
``sustained`` block is ``agent.protocol.SustainedRequest.for_seconds``."""

from __future__ import annotations

from typing import Any

SLOWDOWN_WARN = 1.10  # last-segment median / first-segment median above which the report warns


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
