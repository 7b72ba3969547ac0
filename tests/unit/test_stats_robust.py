"""A few scheduler stalls must not make a steady measurement 'unstable' (they are outliers)."""

import numpy as np

from edgekit.measure.stats import latency_stats


def test_stalls_are_outliers_not_instability():
    rng = np.random.default_rng(7)
    x = rng.normal(0.018, 0.0005, 5000)
    x[::500] = 8.0  # ten 8 ms stalls among 18 us inferences
    s = latency_stats(x)
    assert s.cov > 1.0  # the plain CoV explodes
    assert s.robust_cov < 0.05 and s.stable and s.outliers >= 10


def test_a_bimodal_device_is_unstable():
    x = np.concatenate([np.full(500, 1.0), np.full(500, 1.5)]) + np.random.default_rng(8).normal(0, 0.01, 1000)
    assert not latency_stats(x).stable
