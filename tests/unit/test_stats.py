"""Latency statistics against distributions whose answers are known, including a simulation that
the bootstrap 95% CI of the median covers the true median at about the nominal rate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgekit.measure.stats import STABLE_COV, bootstrap_median_ci, latency_stats, order_statistic_median_ci


def test_quantiles_mean_std_and_cov_of_a_normal_sample():
    rng = np.random.default_rng(1)
    x = rng.normal(10.0, 0.5, 4000)  # bootstrap path (n <= BOOTSTRAP_MAX_N)
    s = latency_stats(x)
    assert s.p50 == pytest.approx(10.0, abs=0.04)
    assert s.p90 == pytest.approx(10.0 + 1.2816 * 0.5, abs=0.05)
    assert s.p99 == pytest.approx(10.0 + 2.3263 * 0.5, abs=0.1)
    assert s.mean == pytest.approx(10.0, abs=0.03) and s.std == pytest.approx(0.5, rel=0.05)
    assert s.cov == pytest.approx(0.05, rel=0.05) and s.stable
    assert s.ci95[0] < s.p50 < s.ci95[1] and s.ci95[1] - s.ci95[0] < 0.06
    assert s.runs == 4000 and s.min < s.p50 < s.max


def test_long_series_use_the_order_statistic_ci_and_stay_fast():
    rng = np.random.default_rng(7)
    x = rng.normal(10.0, 0.5, 200_000)  # a sustained run's worth of timings
    s = latency_stats(x)
    assert s.ci95[0] < 10.0 < s.ci95[1] and s.ci95[1] - s.ci95[0] < 0.02
    # the two methods agree where both apply
    y = rng.normal(10.0, 0.5, 5000)
    b = bootstrap_median_ci(y)
    o = order_statistic_median_ci(y)
    assert b[0] == pytest.approx(o[0], abs=0.01) and b[1] == pytest.approx(o[1], abs=0.01)


def test_outliers_are_counted_by_the_iqr_rule():
    x = np.concatenate([np.linspace(1.0, 2.0, 101), [10.0, 12.0, -5.0]])
    assert latency_stats(x).outliers == 3
    assert latency_stats(np.linspace(1.0, 2.0, 101)).outliers == 0


def test_stability_verdict_follows_the_cov_threshold():
    rng = np.random.default_rng(2)
    calm = rng.normal(5.0, 5.0 * STABLE_COV * 0.5, 5000)
    noisy = rng.normal(5.0, 5.0 * STABLE_COV * 2.0, 5000)
    assert latency_stats(calm).stable and not latency_stats(noisy).stable


def test_exponential_median_and_tail():
    rng = np.random.default_rng(3)
    x = rng.exponential(2.0, 50_000)  # median 2 ln 2, p99 2 ln 100
    s = latency_stats(x)
    assert s.p50 == pytest.approx(2 * math.log(2), rel=0.03)
    assert s.p99 == pytest.approx(2 * math.log(100), rel=0.05)
    assert s.cov == pytest.approx(1.0, rel=0.04) and not s.stable
    assert s.ci95[0] < 2 * math.log(2) < s.ci95[1]


def test_same_timings_give_the_same_ci():
    x = np.random.default_rng(4).lognormal(0, 0.3, 300)
    assert latency_stats(x).ci95 == latency_stats(x.copy()).ci95


@pytest.mark.parametrize("n", [30, 100, 6000])  # 6000: the order-statistic path
def test_bootstrap_median_ci_covers_the_true_median_at_about_95_percent(n):
    """Skewed, latency-like data (lognormal, true median exp(mu)). 400 simulated measurements;
    the coverage's own standard error is ~1.1 points, so [0.89, 0.99] fails only on a real defect."""
    mu, sigma, trials = math.log(3.0), 0.4, 400
    true_median = math.exp(mu)
    rng = np.random.default_rng(5)
    covered = 0
    for t in range(trials):
        x = rng.lognormal(mu, sigma, n)
        lo, hi = bootstrap_median_ci(x, resamples=500, seed=t)
        covered += lo <= true_median <= hi
    rate = covered / trials
    assert 0.89 <= rate <= 0.99, rate


def test_ci_level_narrows_and_widens():
    x = np.random.default_rng(6).normal(1.0, 0.1, 500)
    lo80, hi80 = bootstrap_median_ci(x, level=0.80)
    lo99, hi99 = bootstrap_median_ci(x, level=0.99)
    assert lo99 <= lo80 < hi80 <= hi99


def test_degenerate_inputs():
    s = latency_stats([4.2])
    assert s.p50 == 4.2 and s.std == 0.0 and s.ci95 == (4.2, 4.2) and s.stable
    with pytest.raises(ValueError, match="no timings"):
        latency_stats([])
