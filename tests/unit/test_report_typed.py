"""The report's sections are typed models (device, search, compared_with, comparison, lineage steps):
dicts passed to the constructor or assigned later become those models, unknown keys survive, the views
read attributes, and the schema module imports no view."""

from __future__ import annotations

import ast
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from edgekit.inputs.recipe import GateConfig
from edgekit.report.diff import diff_reports
from edgekit.report.gate import evaluate_gate
from edgekit.report.html import render_html
from edgekit.report.junit import render_junit
from edgekit.report.markdown import render_markdown
from edgekit.report.model import (
    BeforeAfter,
    ComparedWith,
    DeviceInfo,
    Gate,
    LineageStep,
    Report,
    ReportDiff,
    SearchCandidate,
    SearchSection,
    VariantResult,
)
from edgekit.report.write import write_report
from tests.unit.report_factory import lineage, release_pair, report, variant

SEARCH = {"objective": "p50", "selected": "int8", "shipped": {"file": "ship/int8.onnx", "sha256": "e" * 64},
          "seconds": 42.0, "time_budget_s": 900.0,
          "candidates": [{"name": "fp32", "status": "baseline", "screening": {"p50": 1.0, "ci95": [0.9, 1.1]}},
                         {"name": "int8", "status": "selected", "format": "onnx", "size_bytes": 60_000,
                          "passes": [{"name": "quantize", "config": {"mode": "static"}}], "npu_ops": 3},
                         {"name": "tflite-int8", "status": "dropped", "dropped_at": "racing",
                          "reason": "slower than int8", "screening": None}]}


def _report(**kw) -> Report:
    r = report([variant("fp32"), variant("int8", median=0.5, precision="int8", seed=2, selected=True)])
    return Report(**{**r.model_dump(), **kw})


def test_constructor_dicts_become_typed_sections():
    r = _report(device={"name": "pi", "arch": "aarch64", "cores": 4, "transport": "ssh",
                        "temperature_c": {"before": 40.0, "after": 47.5}, "loadavg_before": [0.1, 0.2, 0.3],
                        "emulated": True, "emulation": "qemu", "latency_representative": False,
                        "android": {"model": "Pixel"}, "battery_temperature_c": {"before": 30.1, "after": None},
                        "npu": "none"},  # a key this version does not declare
                search=SEARCH)
    assert isinstance(r.device, DeviceInfo) and isinstance(r.device.temperature_c, BeforeAfter)
    assert r.device.temperature_c.after == 47.5 and r.device.battery_temperature_c.before == 30.1
    assert r.device.emulated and not r.device.is_latency_representative
    assert r.device.model_extra == {"npu": "none"}
    assert isinstance(r.search, SearchSection) and isinstance(r.search.candidates[1], SearchCandidate)
    assert r.search.shipped.sha256 == "e" * 64 and r.search.candidates[0].screening.ci95 == [0.9, 1.1]
    assert r.search.candidates[1].passes[0].config == {"mode": "static"}
    assert r.search.candidates[1].model_extra == {"npu_ops": 3}
    assert isinstance(r.variants[0].lineage[0], LineageStep) and r.variants[0].lineage[1].kind == "convert"
    back = json.loads(r.to_json())
    assert back["device"]["npu"] == "none" and back["search"]["candidates"][1]["npu_ops"] == 3


def test_a_minimal_device_and_search_validate():
    r = _report(device={"name": "x"}, search={"objective": "size"})
    assert r.device.arch is None and r.device.is_latency_representative and r.search.candidates == []


def test_assigning_dicts_still_gives_the_typed_models():
    """The pipeline assembles a report in steps (``report.search = {...}``, release.py's
    ``report.comparison = d.model_dump(...)``): assignment validates like the constructor."""
    old, new = release_pair()
    d = diff_reports(old, new)
    new.search = SEARCH
    new.comparison = d.model_dump(mode="json")
    new.compared_with = {"path": "old/report.json", "sha256": "f" * 64, **d.baseline.model_dump(),
                         "method": "ab_interleaved", "method_detail": {"blocks": 6}}
    new.gate = {"passed": False, "checks": [{"name": "x", "passed": False, "message": "no"}]}
    new.device = {"name": "other-pi", "cores": 8}
    assert isinstance(new.search, SearchSection) and new.search.candidates[2].dropped_at == "racing"
    assert isinstance(new.comparison, ReportDiff) and new.comparison.variant("int8") is not None
    assert isinstance(new.compared_with, ComparedWith) and new.compared_with.method_detail == {"blocks": 6}
    assert new.compared_with.device == "lab-pi"
    assert isinstance(new.gate, Gate) and new.gate.failed_checks[0].name == "x"
    assert isinstance(new.device, DeviceInfo) and new.device.cores == 8
    new.provenance = {"ci": 1}  # an undeclared attribute is still kept as an extra
    assert json.loads(new.to_json())["provenance"] == {"ci": 1}
    with pytest.raises(ValueError):
        new.search = {"candidates": [{"status": "dropped"}]}  # a candidate without a name is not a candidate


def test_sections_still_read_like_the_dicts_they_were():
    """Callers written against the dicts keep working while they move to attributes."""
    r = _report(search=SEARCH, device={"name": "pi", "transport": "ssh"})
    assert r.device.get("name") == "pi" and r.device["transport"] == "ssh" and r.device.get("cores", 1) == 1
    assert r.search.get("selected") == "int8" and r.search["shipped"]["file"] == "ship/int8.onnx"
    assert [c["name"] for c in r.search["candidates"]] == ["fp32", "int8", "tflite-int8"]
    assert r.search.candidates[1]["npu_ops"] == 3 and "npu_ops" in r.search.candidates[1]
    assert "dropped_at" not in r.search.candidates[1]  # None reads as absent, like the dict without the key
    with pytest.raises(KeyError):
        r.device["no-such-key"]
    step = r.variants[0].lineage[1]
    assert step["name"] == "torch->onnx" and step.get("metrics", {})["parity_violations"] == []
    assert {**ComparedWith(path="p", method="direct")}["method"] == "direct"


def test_artifact_lineage_steps_validate_into_the_report_step():
    from edgekit.artifact import LineageStep as ArtifactStep

    s = ArtifactStep(kind="convert", name="onnx->tflite", config={"precision": "int8"},
                     metrics={"parity": {"reference": "pytorch", "max_abs_err": 0.1, "mean_abs_err": 0.01,
                                         "cosine": 0.99, "top1_agreement": None, "n": 10, "exact_agreement": None},
                              "parity_violations": ["cosine 0.99 < 0.995"]},
                     input_sha256="a" * 64, seconds=1.5)
    step = LineageStep.model_validate(s.model_dump(mode="json"))
    assert step.model_extra == {} and step.seconds == 1.5 and step.output_sha256 is None
    assert step.parity.max_abs_err == 0.1 and step.parity_violations == ["cosine 0.99 < 0.995"]
    assert LineageStep(kind="convert", name="x", metrics={"parity": None}).parity is None
    assert LineageStep(kind="source", name="y").parity_violations is None


def test_gate_parity_checks_read_typed_lineage():
    bad = lineage("int8", hops=(("torch->onnx", 6e-6), ("onnx->tflite", 0.3)))
    bad[2]["metrics"]["parity_violations"] = ["max abs error 0.3 > 0.001"]
    v1 = variant("fp32")
    v2 = variant("tfl", precision="int8", seed=2)
    v2.lineage = bad  # assigned dicts become LineageSteps too
    gate = evaluate_gate([v1, v2], "fp32", GateConfig())
    parity = [c for c in gate.checks if c.name.startswith("parity[")]
    # torch->onnx is the same hop in both variants (same input, same config): one check
    assert [(c.name, c.passed) for c in parity] == [("parity[torch->onnx]", True), ("parity[onnx->tflite]", False)]
    assert "0.3 > 0.001" in parity[1].message and isinstance(v2.lineage[2], LineageStep)


@pytest.mark.parametrize("method, words", [
    ("ab_interleaved", "A/B interleaved re-measurement of the baseline's shipped variant"),
    ("ab", "A/B interleaved re-measurement of the baseline's shipped variant"),
    ("normalized_by_reference", "each variant's p50 relative to the reference variant measured in the same run"),
    ("direct", "direct comparison of the two runs' raw timings"),
    ("bayesian", "bayesian"),  # a method a newer edgekit added: said by name
])
def test_the_latency_method_is_shown_when_recorded(method, words):
    old, new = release_pair()
    new.comparison = diff_reports(old, new)
    new.compared_with = {"path": "old/report.json", "method": method, "method_detail": {"blocks": 6}}
    md, html = render_markdown(new), render_html(new)
    assert f"Release latency judged by: {words}" in md and "blocks 6" in md
    assert "<p id=latency-method>Release latency judged by: <b>" in html and words.replace("'", "&#x27;") in html
    props = {p.get("name"): p.get("value") for p in ET.fromstring(render_junit(new)).iter("property")}
    assert props["latency_method"] == method and props["compared_with"] == "old/report.json"


def test_a_recorded_method_text_wins():
    cw = ComparedWith(method="ab", method_text="A/B in 6 blocks")
    assert cw.method_description() == "A/B in 6 blocks"
    assert ComparedWith().method_description() is None


def test_the_device_table_shows_what_is_known():
    html = render_html(_report(device={"name": "pi", "cores": 4, "temperature_c": {"before": 41.0}}))
    table = html[html.index("<table id=device-table>"):]
    table = table[:table.index("</table>")]
    assert "<th>cores</th><td>4</td>" in table and "<th>emulated</th>" not in table  # unknown facts: no row


def test_write_report_writes_every_view_and_the_json_last(tmp_path, monkeypatch):
    import edgekit.report.write as write_mod

    order = []
    real = write_mod.atomic_write_text

    def spy(path, text):
        order.append(Path(path).name)
        return real(path, text)

    monkeypatch.setattr(write_mod, "atomic_write_text", spy)
    _, new = release_pair()
    paths = write_report(new, tmp_path)
    assert order == ["report.md", "report.html", "junit.xml", "report.json"]
    assert {k: p.name for k, p in paths.items()} == {"md": "report.md", "html": "report.html",
                                                      "junit": "junit.xml", "json": "report.json"}
    assert Report.load(paths["json"]).variants[1].name == "int8"
    assert new.write(tmp_path / "again") == {k: tmp_path / "again" / p.name for k, p in paths.items()}


def test_the_schema_imports_no_view():
    """model.py <-> html/markdown/junit was an import cycle (Report.write imported the views), and so
    was loading write.py and diff.py inside ``Report.write``/``Report.diff``: those two now hand their
    function to the schema (``model.provides``), which imports no view at all."""
    src = Path(__file__).resolve().parents[2] / "edgekit" / "report" / "model.py"
    tree = ast.parse(src.read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    mods = {(n.module or "") for n in top if isinstance(n, ast.ImportFrom) and n.level}
    assert mods == {"errors"}, mods
    lazy = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level and n not in top}
    assert lazy == set(), lazy


def test_variant_results_take_lineage_dicts():
    v = VariantResult(name="m", format="onnx", precision="fp32", runtime={"name": "onnxruntime"}, size_bytes=1,
                      sha256="0" * 64, lineage=[{"kind": "pass", "name": "quantize", "config": {"mode": "dynamic"},
                                                 "metrics": {"cache": {"hit": True}}, "cost_usd": 0.0}])
    assert v.lineage[0].config == {"mode": "dynamic"} and v.lineage[0].model_extra == {"cost_usd": 0.0}
    assert v.model_dump(mode="json")["lineage"][0]["cost_usd"] == 0.0


def test_report_show_says_how_latency_was_judged(cli, tmp_path):
    old, new = release_pair()
    new.comparison = diff_reports(old, new)
    new.compared_with = {"path": "old/report.json", "method": "normalized_by_reference",
                         "method_detail": {"reference": "fp32", "reference_sha256_match": True}}
    new.write(tmp_path)
    r = cli("report", "show", tmp_path / "report.json")
    assert r.exit_code == 0, r.stdout + r.stderr
    out = " ".join(r.stdout.split())  # rich wraps long lines
    assert "compared with old/report.json" in out
    assert ("release latency judged by: each variant's p50 relative to the reference variant measured in the same "
            "run (reference fp32, reference_sha256_match True)") in out
