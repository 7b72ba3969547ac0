"""Baseline comparison (edgekit.report.diff) and the release checks of the gate, on Report objects
built directly."""

from __future__ import annotations

import pytest

from edgekit.errors import ConfigError
from edgekit.inputs.recipe import GateConfig, load_recipe
from edgekit.report.diff import diff_reports, render_diff_markdown
from edgekit.report.gate import compare_with_baseline, evaluate_gate
from tests.unit.report_factory import release_pair, report, variant


def _gate(old, new, cfg=None):
    cfg = cfg or GateConfig()
    d = diff_reports(old, new, alpha=cfg.significance_alpha, min_effect=cfg.max_latency_regression or 0.1)
    return evaluate_gate(new.variants, new.baseline, cfg, d), d


def _check(gate, name, variant="int8"):
    return next(c for c in gate.checks if c.name == name and c.variant == variant)


def test_unchanged_run_passes_every_release_check():
    old, new = release_pair()
    gate, d = _gate(old, new)
    assert gate.passed, [c.message for c in gate.failed_checks]
    names = [c.name for c in gate.checks if c.variant == "int8"]
    assert names == ["accuracy_drop", "latency_regression", "release_accuracy_drop", "memory_increase",
                     "size_increase"]
    assert _check(gate, "latency_regression").message.startswith("no significant change")
    assert d.regressions == []


def test_slower_variant_fails_with_check_and_significance_named():
    old, new = release_pair(slower=1.3)
    gate, d = _gate(old, new)
    assert not gate.passed
    c = _check(gate, "latency_regression")
    assert not c.passed and c.significant and c.p_value < 1e-6 and c.limit == 0.1 and 0.25 < c.value < 0.35
    assert "significant regression above 10%" in c.message and "Mann-Whitney p=" in c.message
    assert [(v, ch.metric) for v, ch in d.regressions] == [("int8", "latency_p50_ms")]


def test_slightly_slower_variant_within_threshold_passes():
    old, new = release_pair(slower=1.04)
    gate, _ = _gate(old, new)
    assert _check(gate, "latency_regression").passed


def test_threshold_from_config():
    old, new = release_pair(slower=1.3)
    assert _check(_gate(old, new, GateConfig(max_latency_regression=0.5))[0], "latency_regression").passed
    gate, _ = _gate(old, new, GateConfig(max_latency_regression=None))
    assert not [c for c in gate.checks if c.name == "latency_regression"]


def test_less_accurate_variant_fails_release_accuracy_drop():
    old, new = release_pair(acc_after=96.5)
    gate, _ = _gate(old, new)
    c = _check(gate, "release_accuracy_drop")
    assert not c.passed and c.value == pytest.approx(1.5) and c.limit == 1.0 and c.p_value is not None
    assert "98.00% -> 96.50%" in c.message
    # a looser limit for the release comparison only
    assert _check(_gate(old, new, GateConfig(max_release_accuracy_drop=2.0))[0], "release_accuracy_drop").passed


def test_size_and_memory_increases_fail_above_their_fraction():
    old, new = release_pair(size_after=80_000, mem_after=75.0)
    gate, _ = _gate(old, new)
    size, mem = _check(gate, "size_increase"), _check(gate, "memory_increase")
    assert not size.passed and size.value == pytest.approx(1 / 3, abs=1e-3)
    assert not mem.passed and mem.value == pytest.approx(0.25)
    gate, _ = _gate(old, new, GateConfig(max_size_increase=0.5, max_memory_increase=0.3))
    assert gate.passed


def test_reports_without_raw_timings_compare_by_confidence_intervals():
    old, new = release_pair(slower=1.5, raw=False)
    gate, d = _gate(old, new)
    c = _check(gate, "latency_regression")
    assert not c.passed and c.p_value is None and "CI overlap" in d.variant("int8").get("latency_p50_ms").test


def test_new_variant_is_named_not_failed():
    old, new = release_pair()
    new.variants.append(variant("int8-dynamic", median=0.7, precision="int8", seed=9))
    gate, d = _gate(old, new)
    assert d.added == ["int8-dynamic"]
    c = _check(gate, "release_baseline", "int8-dynamic")
    assert c.passed and "nothing to compare" in c.message


def test_diff_names_device_and_thread_differences():
    old, _ = release_pair()
    new = report([variant("fp32", seed=5), variant("int8", median=0.5, precision="int8", size=60_000, seed=6)],
                 device="other-pi")
    new.variants[1].runtime.threads = 4
    d = diff_reports(old, new)
    assert any("devices differ" in w for w in d.warnings) and any("thread counts differ" in w for w in d.warnings)


def test_report_diff_method_and_markdown():
    old, new = release_pair(slower=1.3)
    d = new.diff(old)
    assert d.baseline["created_at"] == old.created_at and d.current["created_at"] == new.created_at
    md = render_diff_markdown(d)
    assert "| int8 | latency_p50_ms |" in md and "**slower**" in md


def test_compare_with_baseline_records_the_baseline(tmp_path):
    old, new = release_pair(slower=1.3)
    old.write(tmp_path)
    compare_with_baseline(new, old, tmp_path / "report.json", GateConfig())
    assert new.compared_with["path"] == str(tmp_path / "report.json")
    assert len(new.compared_with["sha256"]) == 64 and new.compared_with["created_at"] == old.created_at
    assert new.comparison["variants"][1]["variant"] == "int8" and not new.gate.passed
    # the markdown view names the comparison and the failed check
    from edgekit.report.markdown import render_markdown

    md = render_markdown(new)
    assert "latency_regression" in md and "**FAIL**" in md and "## Compared with the baseline report" in md
    assert "| int8 | latency_p50_ms |" in md


def test_recipe_gate_section_carries_release_thresholds(tmp_path):
    p = tmp_path / "recipe.yaml"
    p.write_text("gate:\n  max_latency_regression: 0.05\n  max_size_increase: 0.0\n  max_release_accuracy_drop: 0.2\n")
    g = load_recipe(p).gate
    assert (g.max_latency_regression, g.max_size_increase, g.max_release_accuracy_drop) == (0.05, 0.0, 0.2)
    p.write_text("gate:\n  max_latency_regresion: 0.05\n")
    with pytest.raises(ConfigError, match="max_latency_regresion"):
        load_recipe(p)
    p.write_text("gate:\n  significance_alpha: 2\n")
    with pytest.raises(ConfigError, match="significance_alpha"):
        load_recipe(p)


def test_a_cached_measurement_compared_with_itself_is_called_out():
    old, new = release_pair()
    new.variants[1].latency_ms.raw = list(old.variants[1].latency_ms.raw)
    new.variants[1].measurement = {"reused": True, "measured_at": old.created_at}
    d = new.diff(old)
    assert any("int8" in w and "--remeasure" in w for w in d.warnings)
    assert d.variant("int8").get("latency_p50_ms").verdict == "no significant change"


def test_min_speedup_check_and_the_slower_variant_warning():
    """A compressed variant slower than the baseline is a warning by default and a failing check with
    min_speedup; a faster one passes it."""
    from edgekit.inputs.recipe import GateConfig
    from edgekit.report.gate import evaluate_gate, slower_warnings
    from tests.unit.report_factory import variant

    base = variant("fp32", median=1.0, seed=1)
    slow = variant("int8", median=2.0, precision="int8", seed=2, speedup_vs_baseline=0.5)

    class R:
        baseline = "fp32"

    r = R()
    other = variant("int8", median=0.6, precision="int8", seed=3)
    ws = slower_warnings([base, slow], r.baseline)
    assert len(ws) == 1 and "SLOWER" in ws[0] and "0.50x" in ws[0]
    g = evaluate_gate([base, slow], r.baseline, GateConfig(min_speedup=1.0, check_parity=False))
    c = next(c for c in g.checks if c.name == "min_speedup")
    assert not c.passed and not g.passed and c.value == 0.5
    fast = other.model_copy(update={"speedup_vs_baseline": 1.6})
    assert next(c for c in evaluate_gate([base, fast], r.baseline, GateConfig(min_speedup=1.5)).checks
                if c.name == "min_speedup").passed
    assert slower_warnings([base, fast], r.baseline) == []


def test_release_check_is_direction_aware_for_an_error_metric():
    """Against the last release, a rise of an error metric (mse) is a drop in quality: it fails, and a fall passes."""
    from edgekit.inputs.recipe import GateConfig
    from edgekit.report.diff import diff_reports
    from edgekit.report.gate import release_checks
    from edgekit.report.model import Accuracy
    from tests.unit.report_factory import report, variant

    def mse(value):
        return {"metric": "mse", "value": value, "n": 360, "direction": "lower", "units": ""}

    def rep(v):
        vs = [variant("fp32", acc=None), variant("int8", acc=None)]
        for x, val in zip(vs, (0.0, v)):
            x.accuracy = Accuracy(**mse(val))
        return report(vs)

    old, worse, better = rep(0.010), rep(0.050), rep(0.002)
    cfg = GateConfig(max_release_accuracy_drop=0.02)
    c = next(c for c in release_checks("int8", diff_reports(old, worse), cfg) if c.name == "release_accuracy_drop")
    assert not c.passed and c.value == pytest.approx(0.04) and "mse" in c.message
    c = next(c for c in release_checks("int8", diff_reports(old, better), cfg) if c.name == "release_accuracy_drop")
    assert c.passed and c.value == pytest.approx(-0.008)
