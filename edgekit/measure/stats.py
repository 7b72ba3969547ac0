"""Latency statistics from raw per-run timings.

The median is the headline figure (robust to the occasional scheduler hiccup); its 95%
confidence interval comes from a percentile bootstrap with a fixed seed, so the same timings
always give the same report.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261130
STABLE_COV = 0.10  # coefficient of variation above which a measurement is flagged unstable
# other processes' share of the device's CPU (the agent reads it during each run) above which the run was on a busy
# device: the agent's threshold (device_agents/edgekit_agent/device.py BUSY_OTHER_CPU)
BUSY_OTHER_CPU = 0.15


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
    stable: bool  # robust_cov <= STABLE_COV
    # 1.4826 * MAD / median: the CoV a normal distribution with this spread would have. Unlike the
    # plain CoV it is not blown up by a handful of scheduler stalls (counted in `outliers` instead),
    # which on a microsecond-scale model would otherwise flag every run as unstable.
    robust_cov: float = 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ci95"] = list(self.ci95)
        return d


BOOTSTRAP_MAX_N = 5000  # above this, the order-statistic CI: as good at that size, and O(n log n)
_CHUNK = 250  # resamples per batch: bounds memory at _CHUNK x n indices


def bootstrap_median_ci(x: np.ndarray, level: float = 0.95, resamples: int = BOOTSTRAP_RESAMPLES,
                        seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile-bootstrap CI of the median (fixed seed: same timings, same interval). Long
    series (sustained runs) use the distribution-free order-statistic interval instead."""
    x = np.asarray(x, dtype=np.float64)
    if len(x) < 2:
        return (float(x[0]), float(x[0])) if len(x) else (float("nan"), float("nan"))
    if len(x) > BOOTSTRAP_MAX_N:
        return order_statistic_median_ci(x, level)
    rng = np.random.default_rng(seed)
    meds = np.empty(resamples)
    for start in range(0, resamples, _CHUNK):
        k = min(_CHUNK, resamples - start)
        meds[start:start + k] = np.median(x[rng.integers(0, len(x), size=(k, len(x)))], axis=1)
    lo, hi = np.quantile(meds, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def order_statistic_median_ci(x: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The CI of the median from the binomial distribution of the count below it (normal
    approximation, fine for the large n it is used at): sorted x at n/2 -/+ z sqrt(n)/2."""
    from statistics import NormalDist

    s = np.sort(np.asarray(x, dtype=np.float64))
    n = len(s)
    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    half = z * np.sqrt(n) / 2
    lo = max(int(np.floor(n / 2 - half)) - 1, 0)
    hi = min(int(np.ceil(n / 2 + half)), n - 1)
    return float(s[lo]), float(s[hi])


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
    med = float(np.median(x))
    robust_cov = float(1.4826 * np.median(np.abs(x - med)) / med) if med > 0 else 0.0
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
        stable=robust_cov <= STABLE_COV,
        robust_cov=robust_cov,
    )


@dataclass
class ABBlocks:
    """Alternating-block timings of two models measured in one session (raw ms per block)."""

    a: list[list[float]] = field(default_factory=list)
    b: list[list[float]] = field(default_factory=list)
    order: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # the agent's notes on either side (e.g. a delegate off)
