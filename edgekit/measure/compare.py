"""Is run B slower or faster than run A? A statistical comparison of two sets of raw timings.

Two tests must agree before a change is called significant:

* a percentile bootstrap 95% CI of the ratio of medians (B / A) that excludes 1, and
* a two-sided Mann-Whitney U test with p < ``alpha``.

Significance alone is not enough on a busy machine: with thousands of runs a 1% shift is
"significant" yet meaningless, and the within-run bootstrap cannot see drift between runs (other
load, frequency changes). So a change is only a *regression* (or an *improvement*) when it is also
at least ``min_effect`` (default 10%) in size; otherwise the verdict says "no significant change"
or names the change as significant but below the threshold.

The bootstrap uses a fixed seed, so the same timings always give the same verdict.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

from .stats import BOOTSTRAP_SEED

DEFAULT_ALPHA = 0.05
DEFAULT_MIN_EFFECT = 0.10  # relative change of the median below which nothing is flagged
DEFAULT_RESAMPLES = 2000
_MAX_SAMPLES = 5000  # timings beyond this are thinned evenly (keeps the bootstrap's memory bounded)

# "below threshold": the medians differ significantly, but by less than min_effect
Verdict = Literal["slower", "faster", "no significant change", "below threshold", "insufficient data"]


@dataclass(frozen=True)
class TimingComparison:
    """B relative to A. ``ratio`` > 1 means B is slower."""

    n_a: int
    n_b: int
    median_a: float
    median_b: float
    ratio: float  # median_b / median_a
    ratio_ci95: tuple[float, float]
    p_value: float | None  # Mann-Whitney U, two-sided; None when it could not be computed
    test: str
    alpha: float
    min_effect: float
    significant: bool  # both tests agree that the medians differ
    verdict: Verdict  # judged with min_effect

    @property
    def change(self) -> float:
        """Relative change of the median, e.g. +0.25 for 25% slower."""
        return self.ratio - 1.0

    def describe(self) -> str:
        p = format_p(self.p_value)
        stats = (f"median {self.median_a:.4g} -> {self.median_b:.4g} ms, ratio {self.ratio:.3f} "
                 f"(95% CI {self.ratio_ci95[0]:.3f}-{self.ratio_ci95[1]:.3f}), Mann-Whitney p={p}")
        if self.verdict == "insufficient data":
            return f"insufficient data to compare ({self.n_a} vs {self.n_b} runs)"
        if self.verdict == "no significant change":
            return f"no significant change: {stats}"
        if self.verdict == "below threshold":
            way = "slower" if self.ratio > 1 else "faster"
            return (f"{abs(self.change):.1%} {way}, significant but under the {self.min_effect:.0%} threshold: {stats}")
        return f"{abs(self.change):.1%} {self.verdict} (significant): {stats}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ratio_ci95"] = list(self.ratio_ci95)
        d["change"] = self.change
        d["description"] = self.describe()
        return d


def _thin(x: np.ndarray) -> np.ndarray:
    if x.size <= _MAX_SAMPLES:
        return x
    return x[np.linspace(0, x.size - 1, _MAX_SAMPLES).astype(int)]


def bootstrap_ratio_ci(a: np.ndarray, b: np.ndarray, level: float = 0.95, resamples: int = DEFAULT_RESAMPLES,
                       seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile bootstrap CI of median(b) / median(a), resampling each run independently."""
    rng = np.random.default_rng(seed)
    ratios = np.empty(resamples)
    chunk = max(1, 2_000_000 // max(a.size, b.size))  # bounded memory per step
    for start in range(0, resamples, chunk):
        k = min(chunk, resamples - start)
        ma = np.median(a[rng.integers(0, a.size, size=(k, a.size))], axis=1)
        mb = np.median(b[rng.integers(0, b.size, size=(k, b.size))], axis=1)
        ratios[start:start + k] = mb / ma
    lo, hi = np.quantile(ratios, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def mann_whitney_p(a: np.ndarray, b: np.ndarray) -> float | None:
    try:
        from scipy.stats import mannwhitneyu
    except ImportError:  # scipy is a dependency; stay usable (bootstrap only) if it was removed
        return None
    if np.all(a == a[0]) and np.all(b == a[0]):
        return 1.0
    return float(mannwhitneyu(a, b, alternative="two-sided").pvalue)


def compare_timings(a_ms, b_ms, *, alpha: float = DEFAULT_ALPHA, min_effect: float = DEFAULT_MIN_EFFECT,
                    resamples: int = DEFAULT_RESAMPLES) -> TimingComparison:
    """Compare raw per-run timings of run B against run A (the baseline)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if min_effect < 0:
        raise ValueError(f"min_effect must be >= 0, got {min_effect}")
    a = _thin(np.asarray(a_ms, dtype=np.float64))
    b = _thin(np.asarray(b_ms, dtype=np.float64))
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if a.size < 5 or b.size < 5 or np.median(a) <= 0:
        med_a = float(np.median(a)) if a.size else float("nan")
        med_b = float(np.median(b)) if b.size else float("nan")
        ratio = med_b / med_a if a.size and b.size and med_a > 0 else float("nan")
        return TimingComparison(int(a.size), int(b.size), med_a, med_b, ratio, (float("nan"), float("nan")), None,
                                "none", alpha, min_effect, False, "insufficient data")
    med_a, med_b = float(np.median(a)), float(np.median(b))
    ratio = med_b / med_a
    ci = bootstrap_ratio_ci(a, b, resamples=resamples)
    p = mann_whitney_p(a, b)
    ci_excludes_one = ci[0] > 1.0 or ci[1] < 1.0
    significant = ci_excludes_one and (p is None or p < alpha)
    test = "bootstrap ratio-of-medians CI" + (" + Mann-Whitney U" if p is not None else "")
    if significant and ratio >= 1.0 + min_effect:
        verdict: Verdict = "slower"
    elif significant and ratio <= 1.0 / (1.0 + min_effect):
        verdict = "faster"
    else:
        verdict = "below threshold" if significant else "no significant change"
    return TimingComparison(int(a.size), int(b.size), med_a, med_b, ratio, ci, p, test, alpha, min_effect,
                            significant, verdict)


def compare_summaries(a_p50: float, a_ci: tuple[float, float], b_p50: float, b_ci: tuple[float, float], *,
                      alpha: float = DEFAULT_ALPHA, min_effect: float = DEFAULT_MIN_EFFECT) -> TimingComparison:
    """Fallback when a report kept no raw timings: two medians with their 95% CIs.

    Non-overlapping CIs mean a significant difference (a conservative rule); the ratio's interval is
    the ratio of the interval ends. No p-value is claimed.
    """
    ratio = b_p50 / a_p50
    ci = (b_ci[0] / a_ci[1], b_ci[1] / a_ci[0])
    significant = b_ci[0] > a_ci[1] or b_ci[1] < a_ci[0]
    if significant and ratio >= 1.0 + min_effect:
        verdict: Verdict = "slower"
    elif significant and ratio <= 1.0 / (1.0 + min_effect):
        verdict = "faster"
    else:
        verdict = "below threshold" if significant else "no significant change"
    return TimingComparison(0, 0, a_p50, b_p50, ratio, ci, None, "median 95% CI overlap (no raw timings)", alpha,
                            min_effect, significant, verdict)


def two_proportion_p(acc_a: float, n_a: int, acc_b: float, n_b: int) -> float | None:
    """Two-sided p-value that two accuracies (in %, on n samples each) differ, by a pooled z-test.

    On the same eval set this treats the two runs as independent samples, which overstates the noise
    (it is conservative); it is shown beside an accuracy change, the gate itself judges the points.
    """
    if n_a <= 0 or n_b <= 0:
        return None
    pa, pb = acc_a / 100.0, acc_b / 100.0
    pool = (pa * n_a + pb * n_b) / (n_a + n_b)
    se = (pool * (1 - pool) * (1 / n_a + 1 / n_b)) ** 0.5
    if se == 0:
        return 1.0 if pa == pb else 0.0
    z = abs(pa - pb) / se
    from math import erfc, sqrt

    return float(erfc(z / sqrt(2)))


def format_p(p: float | None) -> str:
    """A p-value for people: 'n/a', '<1e-16' (floating point cannot say more), or two significant digits."""
    if p is None:
        return "n/a"
    return "<1e-16" if p < 1e-16 else f"{p:.2g}"
