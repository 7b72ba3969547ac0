"""Issue #8 end to end on `local` (real agent subprocess, real onnxruntime): the digits loop writes
report.html, report.md and junit.xml; against a baseline report, an unchanged model passes, a slower
model and a less accurate model fail the gate with the check and its significance named."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from edgekit.report.model import Report

ROOT = Path(__file__).resolve().parents[2]
# Enough timed runs for the significance tests; short enough for the default test run.
MEASURE = ("--runs", "100", "--min-seconds", "0.2", "--warmup", "5")
# A real release threshold: a model 25% slower than the release fails; the slow model below is ~14x slower
# (real extra work in a side branch) and fails it whatever this shared machine does. The unchanged model is
# judged at the default (GateConfig.max_latency_regression, 10%): the gate judges latency by A/B interleaved
# re-measurement of the release's own model file in the same device session, so the machine drift between
# two runs minutes apart (seen: +55% for the same ~18 us digits model, the whole process) cancels out.
THRESHOLD = "0.25"


def _digits_cnn():
    from model import DigitsCNN  # examples/digits/model.py (pyproject.toml: pytest's pythonpath)

    return DigitsCNN


def _trained(digits):
    import torch

    m = _digits_cnn()()
    m.load_state_dict(torch.load(digits.pth, weights_only=True))
    return m.eval()


def _slow_model(digits):
    """The same classifier plus a deliberately expensive side branch (an upsampled input through two
    small convolutions) whose output is scaled to nothing: same accuracy, same size, much slower."""
    import torch
    from torch import nn

    class SlowDigits(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner
            self.side = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))

        def forward(self, x):
            big = nn.functional.interpolate(x, scale_factor=8.0, mode="nearest")  # 64x64: ~2.6 M MACs more
            return self.inner(x) + 1e-6 * torch.tanh(self.side(big)).mean(dim=(1, 2, 3)).unsqueeze(1)

    torch.manual_seed(0)
    return SlowDigits(_trained(digits)).eval()


def _less_accurate_model(digits):
    """The same classifier that never predicts class 0 (its logit pushed down): about 10% less accurate."""
    import torch

    m = _trained(digits)
    with torch.no_grad():
        m.head[-1].bias[0] -= 100.0
    return m


@pytest.fixture(scope="module")
def release(digits, tmp_path_factory):
    """The 'last release': a real deploy of the digits model."""
    from edgekit.cli.main import main

    out = tmp_path_factory.mktemp("release")
    rc = main(["deploy", str(digits.pt2), "--eval-data", str(digits.eval), "--calib-data", str(digits.calib),
               "--out", str(out), *MEASURE])
    assert rc == 0
    return out


def test_digits_loop_writes_all_views(release):
    for name in ("report.json", "report.md", "report.html", "junit.xml"):
        assert (release / name).stat().st_size > 0, name
    html = (release / "report.html").read_text()
    assert "Gate PASSED" in html and html.count("<svg") >= 3  # latency, pareto, parity
    assert 'id="plot-latency"' in html and 'id="plot-pareto"' in html and 'id="plot-parity"' in html
    # self-contained: no scripts, no stylesheets or images to fetch
    assert "<script" not in html and "<link" not in html and 'src="http' not in html and "url(http" not in html
    suite = ET.parse(release / "junit.xml").getroot().find("testsuite")
    rep = Report.load(release / "report.json")
    assert int(suite.get("tests")) == len(rep.gate.checks) and suite.get("failures") == "0"
    assert rep.compared_with is None and rep.comparison is None


@pytest.mark.serial  # two runs' timings compared: another worker's load between them reads as a regression
def test_unchanged_model_passes_against_its_baseline(cli, digits, release, tmp_path):
    """No false alarm at the default threshold (no --max-latency-regression): the README's claim."""
    from edgekit.inputs.recipe import GateConfig

    default = GateConfig().max_latency_regression
    assert default == 0.10
    out = tmp_path / "again"
    # --remeasure: the measurement cache would otherwise hand back the release's own timings
    r = cli("deploy", digits.pt2, "--eval-data", digits.eval, "--calib-data", digits.calib, "--out", out, *MEASURE,
            "--baseline", release / "report.json", "--remeasure")
    rep = Report.load(out / "report.json")
    old = Report.load(release / "report.json")
    # the search may ship another file than the release did when two candidates are near-tied on this ~20 us
    # model (seen in CI: tflite-dynamic at the release, tflite-fp32 now): the release gate then judges file
    # shipped against file shipped (diff.counterpart), and a 3.5x larger file fails max_size_increase, as it
    # is meant to. Nothing else may fail: no latency false alarm whatever the search shipped.
    # A flip ships another program than the release did: then the A/B may find it truly slower than the released
    # file in this session (CI: tflite-fp32 against the release's tflite-dynamic@t2), which is the search's noise on
    # a ~25 us model, not a false alarm of the gate; the latency check must then say so with a CI above 1 (below).
    # The claim, no false alarm at the default threshold, is about the same file judged again.
    # With the release's choice kept while it is near the fastest (choice.keep_release_choice), a flip now
    # needs the released file to be a finalist no more, or more than 10% slower than the fastest one
    flipped = rep.search["selected"].split("@")[0] != old.search["selected"].split("@")[0]
    if flipped:
        released = old.search["selected"].split("@")[0]
        finalists = {c["name"]: rep.variant(c["name"]).latency_ms.p50 for c in rep.search["candidates"]
                     if c["status"] in ("finalist", "selected", "baseline") and "@" not in c["name"]}
        assert rep.search.get("kept_release_choice") is None
        assert released not in finalists or finalists[released] > (1 + default) * min(finalists.values()), finalists
    failed = {c.name for c in rep.gate.failed_checks}
    assert r.exit_code == 0 or (flipped and failed <= {"size_increase", "memory_increase", "latency_regression"}), \
        (r.stdout + r.stderr, rep.search["selected"], old.search["selected"], failed)
    assert rep.compared_with["path"] == str(release / "report.json") and len(rep.compared_with["sha256"]) == 64
    names = {c.name for c in rep.gate.checks}
    assert {"latency_regression", "release_accuracy_drop", "memory_increase", "size_increase"} <= names
    lat = [c for c in rep.gate.checks if c.name == "latency_regression"]
    assert len(lat) == 1, lat  # the shipped variant's, against its counterpart in the release
    # judged A/B against the release's model in this session (what makes the 10% default sound here); a flip to
    # another format (seen in CI: the release shipped fp32.onnx, this run tflite-dynamic@t2) cannot run both files
    # through one runtime, so it is judged by each file's ratio to fp32 within its own run (release.choose_method)
    shipped_format = rep.variant(rep.search["selected"]).format
    method = "ab" if shipped_format == old.variant(old.search["selected"]).format else "normalized"
    assert rep.compared_with.method == method, (rep.compared_with, rep.search["selected"], old.search["selected"])
    for c in lat:
        assert f"by {method}" in c.message and not rep.compared_with.method_detail[c.variant].get("ab_failed"), \
            c.message
        assert c.limit == default and c.value is not None and c.ratio_ci95, c.message
        if not flipped:  # the same file: within the threshold both ways
            assert c.passed and abs(c.value) < default and c.ratio_ci95[0] < 1 + default, c.message
        elif not c.passed:  # another file, found slower than the released one: only with the evidence for it
            assert c.significant and c.ratio_ci95[0] > 1 and c.value > default, c.message
    assert not [w for w in rep.warnings if "A/B re-measurement" in w or "compared across two runs" in w], rep.warnings
    assert rep.variants[1].latency_ms.raw != Report.load(release / "report.json").variants[1].latency_ms.raw
    assert "Compared with the baseline report" in (out / "report.html").read_text()


def test_a_failed_ab_remeasurement_becomes_a_warning(cli, digits, release, tmp_path, monkeypatch):
    """The A/B re-measurement of the baseline's model fails on the device (e.g. its interface changed):
    the deploy still finishes and gates, latency is compared across the two runs directly, and the report
    says so in a warning naming the variant and the agent's message."""
    from edgekit.agent.protocol import AgentRunFailed
    from edgekit.devices.session import DeviceSession

    calls = []

    def failing_ab(self, a, b, settings, blocks):
        calls.append((a.path, b.path))
        raise AgentRunFailed("input 'x' has shape [1, 3, 8, 8], the model wants [1, 1, 8, 8]", kind="bad_input",
                             variant="ab")

    monkeypatch.setattr(DeviceSession, "measure_ab", failing_ab)
    out = tmp_path / "ab-fails"
    r = cli("deploy", digits.pt2, "--eval-data", digits.eval, "--calib-data", digits.calib, "--out", out, *MEASURE,
            "--baseline", release / "report.json", "--remeasure", "--max-latency-regression", "1000",
            # the search may ship another near-tied file than the release did (seen in CI: 54 KB -> 189 KB),
            # which the size/memory checks fail by design; this test is about the A/B failure path only
            "--max-size-increase", "100", "--max-memory-increase", "100")
    assert r.exit_code == 0, r.stdout + r.stderr
    rep = Report.load(out / "report.json")
    judged = [c.variant for c in rep.gate.checks if c.name == "latency_regression"]
    # the release's A/B runs the baseline report's model as A (the search's finals rounds also call measure_ab,
    # with this run's files only: they fall back to the finals' separate runs)
    release_calls = [c for c in calls if str(Path(release).resolve()) in str(c[0])]
    assert len(judged) == 1 and len(release_calls) == 1, (judged, calls)  # tried for the judged variant, once
    for name in judged:
        detail = rep.compared_with.method_detail[name]
        assert "shape [1, 3, 8, 8]" in detail["ab_failed"] and detail["baseline_file"], detail
        warning = (f"baseline comparison: {name}: the A/B re-measurement of the baseline's model failed "
                   f"(input 'x' has shape [1, 3, 8, 8], the model wants [1, 1, 8, 8]); its latency was compared "
                   f"across the two runs directly")
        assert warning in rep.warnings, rep.warnings
        lat = next(c for c in rep.gate.checks if c.name == "latency_regression" and c.variant == name)
        assert "by ab" not in lat.message and lat.passed, lat.message  # the raw cross-run comparison judged it
    # the warning is in the views a reader sees, not only in report.json
    assert "A/B re-measurement of the baseline&#x27;s model failed" in (out / "report.html").read_text() \
        or "A/B re-measurement of the baseline's model failed" in (out / "report.html").read_text()
    assert "A/B re-measurement of the baseline's model failed" in (out / "report.md").read_text()


def test_a_re_deploy_keeps_the_release_s_choice_inside_the_latency_tolerance(cli, digits, release, tmp_path):
    """The release's shipped variant ships again while it is within --max-latency-regression of the fastest
    finalist (variant_search/choice.keep_release_choice). Here the release is said to have shipped fp32 (its
    report doctored) and the tolerance is 100x, so fp32 must ship; the faster finalist it replaced says why."""
    import json

    doc = json.loads((release / "report.json").read_text())
    doc["search"]["selected"] = "fp32"
    doctored = release / "report-shipped-fp32.json"
    doctored.write_text(json.dumps(doc))
    out = tmp_path / "keeps"
    r = cli("deploy", digits.pt2, "--eval-data", digits.eval, "--calib-data", digits.calib, "--out", out, *MEASURE,
            "--baseline", doctored, "--max-latency-regression", "100")
    assert r.exit_code == 0, r.stdout + r.stderr
    rep = Report.load(out / "report.json")
    assert rep.search["selected"].split("@")[0] == "fp32", rep.search["selected"]
    kept = rep.search.get("kept_release_choice")
    finalists = [c["name"] for c in rep.search["candidates"] if c["status"] in ("finalist", "selected")
                 and c["name"] != "fp32" and "@" not in c["name"]]
    if kept is None:  # only when fp32 was the search's own choice: no finalist faster than it
        fp32 = rep.variant("fp32").latency_ms.ci95
        assert all(rep.variant(n).latency_ms.ci95[0] > fp32[1] for n in finalists), finalists
        return
    assert kept["variant"] == "fp32" and kept["released"] == "fp32" and kept["tolerance"] == 100.0
    assert kept["instead_of"] in finalists and kept["ratio_to_fastest"] <= 101, kept
    other = next(c for c in rep.search["candidates"] if c["name"] == kept["instead_of"])
    assert other["reason"].startswith("the release's choice fp32 ships instead"), other
    assert "the release's choice, kept" in rep.decision.reason, rep.decision.reason
    assert rep.decision.lost[kept["instead_of"]] == other["reason"]


@pytest.mark.slow  # a full search with a baseline (~50 s): the default step keeps the unchanged-model pass
@pytest.mark.serial  # its 95% CI bound on the slow/fast ratio
def test_slower_model_fails_latency_regression_with_significance(digits, release, tmp_path, cli):
    import numpy as np

    import edgekit
    from edgekit.report.diff import counterpart

    x = np.load(digits.eval)["x"][:1]
    import torch

    rep = edgekit.deploy(_slow_model(digits), example_inputs=(torch.from_numpy(x),), eval_data=digits.eval,
                         calib_data=digits.calib, out=tmp_path / "slow", runs=100, min_seconds=0.2, warmup=5,
                         baseline_report=release / "report.json", max_latency_regression=float(THRESHOLD),
                         # judge latency alone: the side branch adds graph, and when int8 does not pay on the slow
                         # model the search ships an fp32 file, compared with the release's smaller int8 one
                         max_size_increase=1000.0, max_memory_increase=1000.0)
    assert not rep.gate.passed
    failed = {c.name for c in rep.gate.failed_checks}
    assert failed == {"latency_regression"}, [c.message for c in rep.gate.failed_checks]
    c = rep.gate.failed_checks[0]
    assert c.limit == float(THRESHOLD) and c.variant in {v.name for v in rep.variants}
    # far beyond the threshold, not just over it: the side branch makes the model several times slower, and
    # the whole 95% CI of the slow/fast ratio is above 1 + threshold
    assert c.significant and c.value > 1.0 and c.ratio_ci95[0] > 1 + float(THRESHOLD), c.message
    assert "significant regression above 25%" in c.message and "slower" in c.message
    # A/B when the slow model's search ships a file of the release's format; when int8 does not pay on it
    # and an ONNX fp32 row ships against the release's .tflite, the two runs' timings are compared directly
    shipped = rep.variant(rep.search.selected)
    prev = counterpart(Report.load(release / "report.json"), shipped.name, shipped.name)
    assert rep.compared_with.method == ("ab" if prev.format == shipped.format else "direct"), rep.compared_with
    junit = ET.parse(tmp_path / "slow" / "junit.xml").getroot()
    fail = [tc for tc in junit.iter("testcase") if tc.find("failure") is not None]
    assert [tc.get("name") for tc in fail] == ["latency_regression"]
    assert f"limit: {float(THRESHOLD)}" in fail[0].find("failure").text
    # the threshold is what decides: the same two reports pass a threshold above the measured slowdown
    from edgekit.report.diff import shipped_name

    old = Report.load(release / "report.json")
    pairs = [(v, counterpart(old, v.name, shipped_name(rep))) for v in rep.variants]
    worst = max(v.latency_ms.p50 / o.latency_ms.p50 - 1 for v, o in pairs if o is not None)
    args = ("report", "diff", release / "report.json", tmp_path / "slow" / "report.json", "--max-size-increase",
            "1000", "--max-memory-increase", "1000")
    assert cli(*args, "--max-latency-regression", THRESHOLD).exit_code == 1
    r = cli(*args, "--max-latency-regression", f"{2 * worst + 1:.2f}")
    assert r.exit_code == 0, r.stdout


@pytest.mark.slow
def test_less_accurate_model_fails_release_accuracy_drop(digits, release, tmp_path, cli):
    import numpy as np
    import torch

    import edgekit

    x = np.load(digits.eval)["x"][:1]
    rep = edgekit.deploy(_less_accurate_model(digits), example_inputs=(torch.from_numpy(x),), eval_data=digits.eval,
                         calib_data=digits.calib, out=tmp_path / "worse", runs=50, min_seconds=0.1, warmup=2,
                         baseline_report=release / "report.json", max_latency_regression=float(THRESHOLD))
    failed = {c.name for c in rep.gate.failed_checks}
    # (latency is not asserted here: this model is as fast as the release, but two runs minutes apart on a
    # shared machine can differ by more than any threshold; the latency tests use a model 14x slower)
    assert "release_accuracy_drop" in failed
    c = next(c for c in rep.gate.failed_checks if c.name == "release_accuracy_drop")
    assert c.value > 5 and c.p_value is not None and c.p_value < 0.05
    # the same verdict from the CLI diff of the two reports
    r = cli("report", "diff", release / "report.json", tmp_path / "worse" / "report.json",
            "--max-latency-regression", THRESHOLD)
    assert r.exit_code == 1 and "release_accuracy_drop" in r.stdout and "worse" in r.stdout


def test_missing_or_foreign_baseline_is_refused_before_any_work(cli, digits, tmp_path):
    out = tmp_path / "out"
    r = cli("deploy", digits.pt2, "--eval-data", digits.eval, "--out", out, "--baseline", tmp_path / "nope.json")
    assert r.exit_code == 2 and "nope.json not found" in r.stderr
    old = ROOT / "tests" / "unit" / "fixtures" / "reports" / "report-v0.9.json"
    r = cli("deploy", digits.pt2, "--eval-data", digits.eval, "--out", out, "--baseline", old)
    assert r.exit_code == 2 and "report schema 0.9" in r.stderr
    assert not (out / "report.json").exists() and not (out / "artifacts").exists()


# --- the normalized method end to end -----------------------------------------------------------
# `--release-method normalized` divides each variant's p50 by the reference variant (fp32, the same file by
# sha256 in both runs) of its own run. The baseline below is a real --no-search deploy's report whose
# timings are then scaled, which is what a release measured on another day looks like to this run:
# - every variant 10x faster at the release (the machine, not the model, changed): the ratios agree, so the
#   normalized judgement sees no regression, where the raw timings say ~10x slower (4x read as 1.85x once in CI);
# - only the INT8 variant 20x faster at the release (the model got 20x slower relative to fp32): a
#   significant regression far above the limit.
# The limit is 200% (--max-latency-regression 2): two measurements made one after the other on this shared
# host have been seen to drift apart by up to ~1.7x, and in CI (serial, a quiet 2-core AVX2 host) the INT8
# variant's ratio to fp32 moved 2.35x between the fixture's run and the test's (+135%, over the 100% limit
# this test had); 3x stays clear of that noise, below the 10x machine drift the first case removes, and far
# below the 20x of the second.
NORMALIZED_LIMIT = "2.0"
HOST_NOISE = 2.5  # the run-to-run factor of one variant's p50 on this shared host (seen: 2.35x; 1.85x on fp32 in CI)
DRIFT = 10.0  # the doctored "fast day": far beyond the host's own noise (4x read as 1.85x once in CI)


@pytest.fixture(scope="module")
def fixed_release(digits, tmp_path_factory):
    """A release of the fixed default variants (fp32 + int8-static): int8-static is judged, fp32 is the
    reference the normalized method divides by."""
    from edgekit.cli.main import main

    out = tmp_path_factory.mktemp("fixed-release")
    rc = main(["deploy", str(digits.pt2), "--eval-data", str(digits.eval), "--calib-data", str(digits.calib),
               "--out", str(out), "--no-search", *MEASURE])
    assert rc in (0, 1)
    rep = Report.load(out / "report.json")
    assert [v.name for v in rep.variants] == ["fp32", "int8-static"]
    assert all(v.latency_ms.raw and len(v.latency_ms.raw) >= 100 for v in rep.variants)  # what normalized reads
    return out


def _doctored(release: Path, dst: Path, faster: dict[str, float]) -> Path:
    """The release's report with the named variants' timings divided by the given factors."""
    import json

    doc = json.loads((release / "report.json").read_text())
    for v in doc["variants"]:
        f = faster.get(v["name"])
        if f is None:
            continue
        lat = v["latency_ms"]
        lat["raw"] = [x / f for x in lat["raw"]]
        for k in ("mean", "std", "min", "max", "p50", "p90", "p99"):
            lat[k] /= f
        lat["ci95"] = [x / f for x in lat["ci95"]]
    dst.mkdir(parents=True)
    (dst / "report.json").write_text(json.dumps(doc))
    return dst / "report.json"


def _normalized_deploy(cli, digits, baseline: Path, out: Path):
    r = cli("deploy", digits.pt2, "--eval-data", digits.eval, "--calib-data", digits.calib, "--out", out, "--no-search",
            *MEASURE, "--baseline", baseline, "--release-method", "normalized", "--remeasure",
            "--max-latency-regression", NORMALIZED_LIMIT)
    rep = Report.load(out / "report.json")
    assert rep.compared_with.method == "normalized" and rep.compared_with.method_detail["requested"] == "normalized"
    old = Report.load(baseline)
    assert rep.variant("fp32").sha256 == old.variant("fp32").sha256  # the same reference file: normalized applies
    lat = [c for c in rep.gate.checks if c.name == "latency_regression"]
    assert [c.variant for c in lat] == ["int8-static"], rep.gate.checks
    return r, rep, old, lat[0]


@pytest.mark.serial  # seen in CI on two workers: int8 alone 2.3x slower than in its fixture run, beside the other worker
def test_normalized_release_method_cancels_a_machine_that_was_faster(cli, digits, fixed_release, tmp_path):
    baseline = _doctored(fixed_release, tmp_path / "release-on-a-fast-day", {"fp32": DRIFT, "int8-static": DRIFT})
    r, rep, old, c = _normalized_deploy(cli, digits, baseline, tmp_path / "out")
    assert r.exit_code == 0, (r.stdout + r.stderr, [x.message for x in rep.gate.failed_checks])
    # the raw timings alone say "about 4x slower" (what --release-method direct would judge) ...
    raw = rep.variant("int8-static").latency_ms.p50 / old.variant("int8-static").latency_ms.p50
    assert raw > DRIFT / HOST_NOISE, raw
    # ... the reference measured the same drift, and the normalized ratio removes it
    detail = rep.compared_with.method_detail["int8-static"]
    assert detail["reference"] == "fp32" and detail["reference_ratio_raw"] > DRIFT / HOST_NOISE, detail
    assert c.passed and "by normalized" in c.message, c.message
    assert c.limit == float(NORMALIZED_LIMIT) and abs(c.value) < float(NORMALIZED_LIMIT), c.message
    assert not [w for w in rep.warnings if "compared across two runs directly" in w], rep.warnings


def test_normalized_release_method_fails_a_variant_slower_against_its_reference(cli, digits, fixed_release, tmp_path):
    # 20x: int8's own p50 varies up to ~2.4x between two runs on this shared host (seen: 0.035 then 0.019 ms while
    # fp32 held at 0.020), so a 4x doctoring could read as +70%, under the 200% limit; 20x reads >= +700%
    baseline = _doctored(fixed_release, tmp_path / "release-int8-was-faster", {"int8-static": 20.0})
    r, rep, old, c = _normalized_deploy(cli, digits, baseline, tmp_path / "out")
    assert r.exit_code == 1, r.stdout + r.stderr
    assert {x.name for x in rep.gate.failed_checks} == {"latency_regression"}, \
        [x.message for x in rep.gate.failed_checks]
    assert not c.passed and c.significant and "by normalized" in c.message, c.message
    # far above the limit: the whole 95% CI of the normalized ratio is above 1 + limit
    assert c.value > float(NORMALIZED_LIMIT) and c.ratio_ci95[0] > 1 + float(NORMALIZED_LIMIT), c.message
    assert f"significant regression above {float(NORMALIZED_LIMIT):.0%}" in c.message
    # the reference itself did not move between the runs beyond this host's drift: the regression is int8's
    assert rep.compared_with.method_detail["int8-static"]["reference_ratio_raw"] < HOST_NOISE
