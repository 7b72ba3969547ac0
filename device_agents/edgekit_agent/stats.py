"""The few order statistics the agent needs itself (warm-up windows, sustained bins, per-op medians);
every statistic the report carries is computed on the host from the raw timings."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence


def median(xs: Sequence[float]) -> Optional[float]:
    s = sorted(xs)
    n = len(s)
    if not n:
        return None
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def sem(xs: Sequence[float]) -> float:
    """The standard error of the mean (0 below two values)."""
    n = len(xs)
    if n < 2:
        return 0.0
    m = sum(xs) / n
    return float((sum((x - m) ** 2 for x in xs) / (n - 1)) ** 0.5 / n**0.5)


def quantile(sorted_xs: Sequence[float], q: float) -> Optional[float]:
    """Linear-interpolation quantile (numpy's default) of an already sorted list."""
    if not sorted_xs:
        return None
    pos = (len(sorted_xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def summarize(xs: Sequence[float]) -> Dict[str, Any]:
    s = sorted(xs)
    if not s:
        return {"runs": 0}
    return {
        "runs": len(s),
        "mean": sum(s) / len(s),
        "min": s[0],
        "max": s[-1],
        "p50": quantile(s, 0.5),
        "p90": quantile(s, 0.9),
        "p99": quantile(s, 0.99),
    }
