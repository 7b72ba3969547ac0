"""Paired statistics of a metric drop between the baseline and a variant on the same eval samples.

Both variants scored the same samples, so the drop is judged on paired per-sample results: a paired
bootstrap (resampling samples, both variants together) gives a 95% confidence interval of the drop;
for top-k accuracy the exact McNemar test on the discordant pairs gives the p-value. The
``resolution`` is the half-width of the baseline value's own 95% interval: how finely this eval set
can resolve the metric at all (1 point on 300 samples at 90% accuracy is ±3.4 points). When it is
wider than the tolerance, the report says the set is too small to resolve the tolerance.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .base import Metric

DEFAULT_RESAMPLES = 2000  # decomposable metrics (row resampling is cheap)
RESCORE_RESAMPLES = 200  # non-decomposable metrics (mAP) are re-scored on every resample
_CHUNK = 100


@dataclass(frozen=True)
class PairedDrop:
    drop: float  # > 0 = the variant is worse, in the metric's units
    ci95: tuple[float, float]
    p_value: float | None
    significant: bool  # the interval excludes 0 (and McNemar p < alpha where it applies)
    method: str
    n: int
    resolution: float | None  # half-width of the baseline value's 95% interval
    resamples: int

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ci95"] = [round(float(x), 6) for x in self.ci95]
        d["drop"] = round(float(self.drop), 6)
        d["resolution"] = None if self.resolution is None else round(float(self.resolution), 6)
        return d


def _mcnemar(base_hit: np.ndarray, var_hit: np.ndarray) -> float:
    from scipy.stats import binomtest

    b = int(np.sum(base_hit & ~var_hit))
    c = int(np.sum(~base_hit & var_hit))
    if b + c == 0:
        return 1.0
    return float(binomtest(min(b, c), b + c, 0.5).pvalue)


def paired_drop(metric: Metric, base_outputs: list[np.ndarray] | None, var_outputs: list[np.ndarray] | None,
                labels: np.ndarray | None, *, base_stats: np.ndarray | None = None,
                var_stats: np.ndarray | None = None, alpha: float = 0.05, seed: int = 0,
                resamples: int | None = None) -> PairedDrop:
    rng = np.random.default_rng(seed)
    # the outputs may be left out when both sides' per-sample statistics are given (data at several shapes)
    n = len(base_stats) if base_stats is not None else len(base_outputs[0])
    sign = 1.0 if metric.direction == "higher" else -1.0
    if base_stats is None:
        base_stats = metric.stats(base_outputs, labels)
    if var_stats is None and base_stats is not None:
        var_stats = metric.stats(var_outputs, labels)
    p_value = None
    if base_stats is not None and var_stats is not None:
        b_val = float(metric.reduce(base_stats.sum(0)))
        v_val = float(metric.reduce(var_stats.sum(0)))
        B = resamples or DEFAULT_RESAMPLES
        drops, bases = [], []
        for start in range(0, B, _CHUNK):
            idx = rng.integers(0, n, size=(min(_CHUNK, B - start), n))
            tb = metric.reduce(base_stats[idx].sum(axis=1))
            tv = metric.reduce(var_stats[idx].sum(axis=1))
            drops.append(sign * (tb - tv))
            bases.append(tb)
        drops_a, bases_a = np.concatenate(drops), np.concatenate(bases)
        method = f"paired bootstrap ({B} resamples)"
        if getattr(metric, "k", None) is not None and base_stats.shape[1] == 2:  # top-k: hits per sample
            p_value = _mcnemar(base_stats[:, 0] > 0.5, var_stats[:, 0] > 0.5)
            method += " + exact McNemar"
    else:
        b_val = float(metric.score(base_outputs, labels))
        v_val = float(metric.score(var_outputs, labels))
        B = resamples or RESCORE_RESAMPLES
        sb = metric.subset_scorer(base_outputs, labels) if hasattr(metric, "subset_scorer") else None
        sv = metric.subset_scorer(var_outputs, labels) if hasattr(metric, "subset_scorer") else None
        drops_l, bases_l = [], []
        for _ in range(B):
            idx = rng.integers(0, n, size=n)
            if sb is not None:
                tb, tv = sb(idx), sv(idx)
            else:
                lab = None if labels is None else labels[idx]
                tb = metric.score([o[idx] for o in base_outputs], lab)
                tv = metric.score([o[idx] for o in var_outputs], lab)
            drops_l.append(sign * (tb - tv))
            bases_l.append(tb)
        drops_a, bases_a = np.asarray(drops_l), np.asarray(bases_l)
        method = f"paired bootstrap, re-scored ({B} resamples)"
    drop = sign * (b_val - v_val)
    lo, hi = np.quantile(drops_a, [alpha / 2, 1 - alpha / 2])
    if p_value is None:  # two-sided bootstrap p-value of "no change"
        p_value = float(min(1.0, 2 * min(np.mean(drops_a <= 0), np.mean(drops_a >= 0))))
        if np.all(drops_a == 0):
            p_value = 1.0
    blo, bhi = np.quantile(bases_a, [alpha / 2, 1 - alpha / 2])
    significant = bool((lo > 0 or hi < 0) and p_value < alpha)
    return PairedDrop(drop=drop, ci95=(float(lo), float(hi)), p_value=p_value, significant=significant,
                      method=method, n=n, resolution=float((bhi - blo) / 2), resamples=B)
