"""edgekit.measure.compare: the significance of a latency change between two runs."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.measure.compare import (compare_summaries, compare_timings, format_p, two_proportion_p)

from tests.unit.report_factory import timings


def test_same_distribution_is_no_significant_change_across_seeds():
    # 20 pairs of runs of the same model: none may be flagged (the noisy-machine requirement)
    verdicts = [compare_timings(timings(1.0, seed=s), timings(1.0, seed=100 + s)).verdict for s in range(20)]
    assert set(verdicts) == {"no significant change"}


def test_small_real_shift_is_significant_but_below_the_threshold():
    c = compare_timings(timings(1.0, n=3000, seed=1), timings(1.04, n=3000, seed=2))
    assert c.significant and c.verdict == "below threshold"
    assert "under the 10% threshold" in c.describe()


def test_thirty_percent_slower_is_a_regression_with_its_statistics():
    c = compare_timings(timings(1.0, seed=1), timings(1.3, seed=2))
    assert c.verdict == "slower" and c.significant
    assert c.p_value < 1e-6 and 1.0 < c.ratio_ci95[0] <= 1.3 <= c.ratio_ci95[1] * 1.03
    assert 0.25 < c.change < 0.35
    d = c.describe()
    assert d.startswith("3") and "slower (significant)" in d and "Mann-Whitney p=" in d and "95% CI" in d


def test_faster_is_named_faster():
    c = compare_timings(timings(1.0, seed=1), timings(0.6, seed=2))
    assert c.verdict == "faster" and c.ratio < 0.7


def test_threshold_is_configurable():
    a, b = timings(1.0, n=2000, seed=1), timings(1.15, n=2000, seed=2)
    assert compare_timings(a, b, min_effect=0.10).verdict == "slower"
    assert compare_timings(a, b, min_effect=0.20).verdict == "below threshold"


def test_same_inputs_give_the_same_answer():
    a, b = timings(1.0, seed=1), timings(1.1, seed=2)
    assert compare_timings(a, b).to_dict() == compare_timings(a, b).to_dict()


def test_too_few_runs_is_insufficient_data():
    c = compare_timings([1.0, 1.1], [2.0, 2.1, 2.2])
    assert c.verdict == "insufficient data" and not c.significant and "insufficient" in c.describe()


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="alpha"):
        compare_timings([1.0] * 10, [1.0] * 10, alpha=0)
    with pytest.raises(ValueError, match="min_effect"):
        compare_timings([1.0] * 10, [1.0] * 10, min_effect=-1)


def test_identical_constant_timings():
    c = compare_timings([2.0] * 50, [2.0] * 50)
    assert c.verdict == "no significant change" and c.p_value == 1.0 and c.ratio == 1.0


def test_bootstrap_ratio_ci_covers_the_true_ratio_at_about_its_level():
    # 60 simulated pairs of log-normal runs with a true median ratio of 1.2
    covered = 0
    for s in range(60):
        rng = np.random.default_rng(1000 + s)
        a = rng.lognormal(0.0, 0.3, 150)
        b = 1.2 * rng.lognormal(0.0, 0.3, 150)
        lo, hi = compare_timings(a, b, resamples=500).ratio_ci95
        covered += lo <= 1.2 <= hi
    assert covered >= 50  # nominal 95%: 57 of 60; percentile bootstrap of a median runs a little narrow


def test_long_runs_are_thinned_not_refused():
    a, b = timings(1.0, n=20000, seed=1), timings(1.0, n=20000, seed=2)
    c = compare_timings(a, b)
    assert c.n_a == 5000 and c.verdict == "no significant change"


def test_summary_fallback_uses_ci_overlap_and_claims_no_p_value():
    c = compare_summaries(1.0, (0.98, 1.02), 1.5, (1.45, 1.55))
    assert c.verdict == "slower" and c.p_value is None and "CI overlap" in c.test
    c = compare_summaries(1.0, (0.9, 1.1), 1.05, (0.95, 1.15))
    assert c.verdict == "no significant change" and not c.significant


def test_two_proportion_p():
    assert two_proportion_p(99.0, 360, 89.0, 360) < 1e-6
    assert two_proportion_p(99.0, 360, 99.0, 360) == 1.0
    assert 0.05 < two_proportion_p(99.0, 360, 98.5, 360) < 1.0
    assert two_proportion_p(99.0, 0, 98.0, 360) is None


def test_format_p():
    assert format_p(None) == "n/a" and format_p(0.0) == "<1e-16" and format_p(0.0312) == "0.031"
