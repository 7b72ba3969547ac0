"""Early stopping on the device: a candidate is dropped once its latency is clearly worse than
the current best, i.e. the lower end of its median's 95% CI is above the upper end of the best's
(times a margin). This is the usual racing rule: it spends device time only where the answer is
still open, and never drops a candidate on noise alone."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..measure.stats import bootstrap_median_ci


@dataclass(frozen=True)
class RaceEntry:
    name: str
    median: float
    ci: tuple[float, float]


def race_entry(name: str, raw: list[float]) -> RaceEntry:
    x = np.asarray(raw, dtype=np.float64)
    return RaceEntry(name, float(np.median(x)), bootstrap_median_ci(x))


def clearly_slower(entries: list[RaceEntry], margin: float = 0.05) -> dict[str, str]:
    """name -> reason for every entry whose CI lies entirely above the best's CI (+margin)."""
    if len(entries) < 2:
        return {}
    best = min(entries, key=lambda e: e.median)
    out = {}
    for e in entries:
        if e is best:
            continue
        if e.ci[0] > best.ci[1] * (1 + margin):
            out[e.name] = (f"clearly slower than {best.name}: median {e.median:.4f} ms, 95% CI "
                           f"[{e.ci[0]:.4f}, {e.ci[1]:.4f}] above {best.name}'s [{best.ci[0]:.4f}, {best.ci[1]:.4f}]")
    return out
