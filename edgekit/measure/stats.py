"""Latency statistics from raw per-run timings.

The median is the headline figure (robust to the occasional scheduler hiccup); its 95%
confidence interval comes from a percentile bootstrap with a fixed seed, so the same timings
always give the same report.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261130
STABLE_COV = 0.10  # coefficient of variation above which a measurement is flagged unstable


@dataclass(frozen=True)
class LatencyStats:
    runs: int
    mean: float
    std: float
    min: float
    max: float
    p50: float
    p90: float
    p99: float
    ci95: tuple[float, float]  # of the median
    cov: float
    outliers: int  # beyond 1.5 IQR above Q3 or below Q1
    stable: bool

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ci95"] = list(self.ci95)
        return d


def bootstrap_median_ci(x: np.ndarray, level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES,
                        seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    if len(x) < 2:
        return (float(x[0]), float(x[0])) if len(x) else (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(resamples, len(x)))
    meds = np.median(x[idx], axis=1)
    lo, hi = np.quantile(meds, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def latency_stats(raw_ms: list[float] | np.ndarray) -> LatencyStats:
    x = np.asarray(raw_ms, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no timings")
    q1, q3 = np.quantile(x, [0.25, 0.75])
    iqr = q3 - q1
    outliers = int(np.sum((x > q3 + 1.5 * iqr) | (x < q1 - 1.5 * iqr)))
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if x.size > 1 else 0.0
    cov = std / mean if mean > 0 else 0.0
    return LatencyStats(
        runs=int(x.size),
        mean=mean,
        std=std,
        min=float(x.min()),
        max=float(x.max()),
        p50=float(np.quantile(x, 0.50)),
        p90=float(np.quantile(x, 0.90)),
        p99=float(np.quantile(x, 0.99)),
        ci95=bootstrap_median_ci(x),
        cov=cov,
        outliers=outliers,
        stable=cov <= STABLE_COV,
    )
