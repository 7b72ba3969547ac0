"""The release gate's latency methods (edgekit/report/release.py) on controlled timings: a change of
the machine moves both sides of an A/B block pair and the reference alike, so it cancels; a real
slowdown of the model does not."""

from __future__ import annotations

import numpy as np
import pytest

from edgekit.errors import BadInputError
from edgekit.measure.stats import ABBlocks
from edgekit.report.release import choose_method, judge_ab, judge_normalized
from tests.unit.report_factory import report as make_report
from tests.unit.report_factory import variant as make_variant


def _timings(rng, median, n=200, cov=0.05):
    return list(median * (1 + cov * rng.standard_normal(n)).clip(0.5))


def _blocks(rng, slowdown: float, drift) -> ABBlocks:
    b = ABBlocks()
    for i, machine in enumerate(drift):  # the machine's speed factor while block pair i ran
        b.a.append(_timings(rng, 1.0 * machine))
        b.b.append(_timings(rng, slowdown * machine))
    return b


def _verdict(j) -> str:
    """What the release gate makes of the judgement at the default 10% threshold (slower fails)."""
    from edgekit.inputs.recipe import GateConfig
    from edgekit.report.release import latency_change

    v = make_variant("int8")
    return latency_change(j, v, v, GateConfig().max_latency_regression).verdict


def test_ab_cancels_a_machine_that_got_40_percent_slower_mid_run():
    rng = np.random.default_rng(1)
    j = judge_ab(_blocks(rng, 1.0, [1.0, 1.0, 1.4, 1.4, 1.4, 1.0]))
    # the same model: a ratio of ~1 whose CI holds 1 and ends far below the 10% default threshold
    assert 0.97 < j.ratio < 1.03, j
    assert j.ci95[0] < 1.0 < j.ci95[1] < 1.1 and not j.significant, j
    assert _verdict(j) == "no significant change"


def test_ab_catches_a_model_1_5x_slower_on_a_drifting_machine():
    rng = np.random.default_rng(2)
    j = judge_ab(_blocks(rng, 1.5, [1.0, 1.3, 0.9, 1.4, 1.0, 1.2]))
    assert j.significant and 1.4 < j.ratio < 1.6 and j.ci95[0] > 1.2
    assert j.detail["blocks"] == 6 and len(j.detail["block_ratios"]) == 6


def test_ab_one_disturbed_block_does_not_make_an_alarm():
    rng = np.random.default_rng(3)
    b = _blocks(rng, 1.0, [1.0] * 6)
    b.b[2] = [x * 1.8 for x in b.b[2]]  # a burst of other load during one B block only
    j = judge_ab(b)
    # the median block ratio ignores the one disturbed pair (a mean of the block ratios would say ~1.10)
    assert 0.97 < j.ratio < 1.03 and not j.significant, j
    assert _verdict(j) == "no significant change"


def _variant(name, sha, median, rng):
    v = make_variant(name)
    raw = _timings(rng, median)
    return v.model_copy(update={"sha256": sha, "latency_ms": v.latency_ms.model_copy(
        update={"raw": raw, "p50": float(np.median(raw))})})


def test_normalized_removes_a_uniform_slowdown_and_keeps_a_real_one():
    rng = np.random.default_rng(4)
    old_ref, old_v = _variant("fp32", "r" * 64, 1.0, rng), _variant("int8", "a" * 64, 0.5, rng)
    # the whole machine is 1.4x slower today: the reference says so
    new_ref, new_v = _variant("fp32", "r" * 64, 1.4, rng), _variant("int8", "a" * 64, 0.7, rng)
    j = judge_normalized(old_v, old_ref, new_v, new_ref)
    assert 0.95 < j.ratio < 1.05
    slower = _variant("int8", "b" * 64, 1.05, rng)  # 1.5x slower than it should be on the slow machine
    j2 = judge_normalized(old_v, old_ref, slower, new_ref)
    assert j2.significant and j2.ratio > 1.4


def test_method_choice_prefers_ab_then_normalized_then_direct(tmp_path):
    from edgekit.report.model import Report

    rng = np.random.default_rng(5)
    ref, v = _variant("fp32", "r" * 64, 1.0, rng), _variant("int8", "a" * 64, 0.5, rng)
    prev = make_report([ref, v])
    assert isinstance(prev, Report)
    assert choose_method("auto", prev, [v], {"int8": tmp_path / "f.onnx"}, ref) == "ab"
    assert choose_method("auto", prev, [v], {}, ref) == "normalized"
    changed_ref = ref.model_copy(update={"sha256": "z" * 64})
    assert choose_method("auto", prev, [v], {}, changed_ref) == "direct"
    with pytest.raises(BadInputError, match="--baseline-artifacts"):
        choose_method("ab", prev, [v], {}, ref)
    with pytest.raises(BadInputError, match="same reference"):
        choose_method("normalized", prev, [v], {}, changed_ref)
