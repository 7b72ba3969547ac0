"""The gate's budget and accuracy checks (edgekit.report.gate.evaluate_gate) on VariantResults built by
report_factory: p90, peak memory and model size budgets, budgets that cannot be shown to hold because the
figure was not measured, the relative accuracy tolerance, min_speedup, the slower-than-baseline warning,
and a target file's limits reaching the gate (resolve_gate, and a real deploy that fails on them)."""

from __future__ import annotations

import json

import pytest
from report_factory import variant

from edgekit.inputs.recipe import GateConfig, Recipe
from edgekit.report.gate import evaluate_gate, slower_warnings


def _pair(**int8):
    """fp32 baseline + one int8 variant (the judged one)."""
    return [variant("fp32", median=1.0, acc=98.0, seed=1),
            variant("int8", median=int8.pop("median", 0.5), precision="int8", seed=2, **int8)]


def _checks(gate, name):
    return [c for c in gate.checks if c.name == name]


def _one(gate, name):
    found = _checks(gate, name)
    assert len(found) == 1, [c.model_dump() for c in gate.checks]
    return found[0]


def test_budgets_set_to_none_add_no_check():
    gate = evaluate_gate(_pair(), "fp32", GateConfig())
    names = {c.name for c in gate.checks}
    assert not names & {"latency_p50_budget", "latency_p90_budget", "peak_memory_budget", "model_size_budget",
                        "min_speedup"}
    assert _one(gate, "accuracy_drop").variant == "int8" and gate.passed


def test_p90_budget_judges_the_tail_not_the_median():
    vs = _pair()
    lat = vs[1].latency_ms
    assert lat.p90 > lat.p50 * 1.05  # the factory's timings have a tail
    lim = round((lat.p50 + lat.p90) / 2, 6)  # above the median, below the 90th percentile
    gate = evaluate_gate(vs, "fp32", GateConfig(latency_ms_p50=lim, latency_ms_p90=lim))
    p50, p90 = _one(gate, "latency_p50_budget"), _one(gate, "latency_p90_budget")
    assert p50.passed and p50.value == pytest.approx(lat.p50, abs=1e-4)
    assert not p90.passed and p90.value == pytest.approx(lat.p90, abs=1e-4) and p90.limit == lim
    assert p90.variant == "int8" and "ms >" in p90.message and f"budget {lim:g} ms" in p90.message
    assert not gate.passed and [c.name for c in gate.failed_checks] == ["latency_p90_budget"]
    # a budget above the tail passes
    assert evaluate_gate(vs, "fp32", GateConfig(latency_ms_p90=lat.p90 * 1.01)).passed


def test_peak_memory_budget():
    over = evaluate_gate(_pair(mem=80.0), "fp32", GateConfig(peak_memory_mb=64))
    c = _one(over, "peak_memory_budget")
    assert not c.passed and c.value == 80.0 and c.limit == 64 and c.variant == "int8"
    assert "80.000 MB > budget 64 MB" in c.message and not over.passed
    at = evaluate_gate(_pair(mem=64.0), "fp32", GateConfig(peak_memory_mb=64))  # the budget itself is allowed
    assert _one(at, "peak_memory_budget").passed and at.passed


def test_model_size_budget_in_megabytes():
    vs = _pair(size=250_000)
    c = _one(evaluate_gate(vs, "fp32", GateConfig(model_size_mb=0.2)), "model_size_budget")
    assert not c.passed and c.value == 0.25 and "0.250 MB > budget 0.2 MB" in c.message
    assert _one(evaluate_gate(vs, "fp32", GateConfig(model_size_mb=0.25)), "model_size_budget").passed
    # only the judged (compressed) variants are held to it, not the bigger fp32 baseline
    big_base = [variant("fp32", size=5_000_000, seed=1), variant("int8", precision="int8", size=100_000, seed=2)]
    g = evaluate_gate(big_base, "fp32", GateConfig(model_size_mb=1.0))
    assert [c.variant for c in _checks(g, "model_size_budget")] == ["int8"] and g.passed


def test_unmeasured_memory_with_a_budget_fails_saying_so():
    gate = evaluate_gate(_pair(mem=None), "fp32", GateConfig(peak_memory_mb=512))
    c = _one(gate, "peak_memory_budget")
    assert not c.passed and c.value is None and c.limit == 512
    assert "not measured" in c.message and "512 MB budget cannot be shown to hold" in c.message
    assert not gate.passed
    # without a budget, missing memory is no failure
    assert evaluate_gate(_pair(mem=None), "fp32", GateConfig()).passed


def test_unmeasured_latency_with_budgets_fails_saying_so():
    vs = _pair()
    vs[1].latency_ms = None
    gate = evaluate_gate(vs, "fp32", GateConfig(latency_ms_p50=10, latency_ms_p90=20, min_speedup=1.0))
    for name, lim in (("latency_p50_budget", 10), ("latency_p90_budget", 20)):
        c = _one(gate, name)
        assert not c.passed and c.value is None and f"{lim} ms budget cannot be shown to hold" in c.message
    sp = _one(gate, "min_speedup")  # speedup_vs_baseline is None too
    assert not sp.passed and "cannot be shown" in sp.message
    assert not gate.passed


def test_relative_accuracy_drop_scales_the_tolerance_by_the_baseline():
    def gate(base_acc, acc, relative):
        vs = [variant("fp32", acc=base_acc, seed=1), variant("int8", acc=acc, precision="int8", seed=2)]
        vs[1].accuracy_drop = round(base_acc - acc, 4)
        return _one(evaluate_gate(vs, "fp32", GateConfig(max_accuracy_drop=1.0, relative_accuracy_drop=relative)),
                    "accuracy_drop")

    # 1% of a baseline at 80% is 0.8 points: a 0.9-point drop passes absolutely, fails relatively
    absolute, relative = gate(80.0, 79.1, False), gate(80.0, 79.1, True)
    assert absolute.passed and absolute.limit == 1.0
    assert not relative.passed and relative.limit == pytest.approx(0.8) and relative.value == pytest.approx(0.9)
    assert "(relative)" in relative.message and "(relative)" not in absolute.message
    assert gate(80.0, 79.3, True).passed  # 0.7 <= 0.8
    # the same relative setting on a 40% baseline allows only 0.4 points
    low = gate(40.0, 39.5, True)
    assert not low.passed and low.limit == pytest.approx(0.4)


def test_accuracy_not_measured_fails():
    vs = _pair(acc=None)
    c = _one(evaluate_gate(vs, "fp32", GateConfig()), "accuracy_drop")
    assert not c.passed and "not measured" in c.message


def test_min_speedup():
    vs = _pair(median=0.5)
    vs[1].speedup_vs_baseline = 2.0
    ok = _one(evaluate_gate(vs, "fp32", GateConfig(min_speedup=1.5)), "min_speedup")
    assert ok.passed and ok.value == 2.0 and ok.limit == 1.5 and "2.00x" in ok.message and ">= 1.5x" in ok.message
    g = evaluate_gate(vs, "fp32", GateConfig(min_speedup=3.0))
    bad = _one(g, "min_speedup")
    assert not bad.passed and "< 3x" in bad.message and not g.passed
    # the baseline itself is never held to a speed-up over itself
    assert [c.variant for c in _checks(g, "min_speedup")] == ["int8"]
    emu = _one(evaluate_gate(vs, "fp32", GateConfig(min_speedup=3.0), latency_representative=False), "min_speedup")
    assert emu.passed and emu.skipped and "emulated" in emu.message


def test_slower_warnings_only_when_the_cis_are_separated():
    slow = [variant("fp32", median=1.0, seed=1), variant("int8", median=2.0, precision="int8", seed=2)]
    slow[1].speedup_vs_baseline = 0.5
    w = slower_warnings(slow, "fp32")
    assert len(w) == 1 and w[0].startswith("int8 is SLOWER than fp32") and "0.50x" in w[0]
    same = [variant("fp32", median=1.0, seed=1), variant("int8", median=1.0, precision="int8", seed=1)]
    assert slower_warnings(same, "fp32") == []
    fast = _pair(median=0.5)
    assert slower_warnings(fast, "fp32") == []


def _target_yaml(tmp_path, limits: str):
    from edgekit.inputs.targets import targets_dirs

    local = next(d / "local.yaml" for d in targets_dirs() if (d / "local.yaml").is_file()).read_text()
    assert "limits: {}" in local
    p = tmp_path / "tight.yaml"
    p.write_text(local.replace("name: local", "name: tight").replace("limits: {}", f"limits: {limits}"))
    return p


def test_target_limits_flow_into_the_gate(tmp_path):
    from edgekit.inputs.targets import load_target
    from edgekit.pipeline import deploy as pipeline

    spec = load_target(_target_yaml(tmp_path, "{latency_ms_p90: 5, peak_memory_mb: 100, model_size_mb: 0.1}"))
    cfg = pipeline.resolve_gate(spec, Recipe(), pipeline.DeployOptions())
    assert (cfg.latency_ms_p50, cfg.latency_ms_p90, cfg.peak_memory_mb, cfg.model_size_mb) == (None, 5, 100, 0.1)
    # the recipe's own budget wins over the target's; a command-line budget wins over both
    rec = Recipe(gate=GateConfig(peak_memory_mb=200))
    assert pipeline.resolve_gate(spec, rec, pipeline.DeployOptions()).peak_memory_mb == 200
    assert pipeline.resolve_gate(spec, rec, pipeline.DeployOptions(memory_budget_mb=300)).peak_memory_mb == 300
    gate = evaluate_gate(_pair(size=250_000, mem=120.0), "fp32", cfg)
    failed = {c.name for c in gate.failed_checks}
    assert failed == {"peak_memory_budget", "model_size_budget"}, [c.message for c in gate.failed_checks]
    assert _one(gate, "latency_p90_budget").passed


def test_deploy_on_a_target_with_a_size_limit_fails_its_gate(cli, digits, tmp_path):
    """End to end: the limit written in a target file fails the release (exit 1), named in report and junit."""
    import xml.etree.ElementTree as ET

    target = _target_yaml(tmp_path, "{model_size_mb: 0.001}")  # 1 kB: no digits model fits
    out = tmp_path / "out"
    r = cli("deploy", digits.pt2, "--target", target, "--eval-data", digits.eval, "--calib-data", digits.calib,
            "--out", out, "--runs", "5", "--min-seconds", "0", "--warmup", "1", "--no-search")
    assert r.exit_code == 1, r.stdout + r.stderr
    doc = json.loads((out / "report.json").read_text())
    assert doc["target"] == "tight" and doc["settings"]["gate"]["model_size_mb"] == 0.001
    assert not doc["gate"]["passed"]
    size = [c for c in doc["gate"]["checks"] if c["name"] == "model_size_budget"]
    assert size and all(not c["passed"] and c["limit"] == 0.001 for c in size)
    assert {c["name"] for c in doc["gate"]["checks"] if not c["passed"]} == {"model_size_budget"}
    failing = [tc.get("name") for tc in ET.parse(out / "junit.xml").getroot().iter("testcase")
               if tc.find("failure") is not None]
    assert failing and all("model_size_budget" in n for n in failing), failing
