"""Report schema versions (fixture files of other versions) and the atomic write of all four views."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgekit.errors import BadInputError
from edgekit.report.model import SCHEMA_VERSION, Report
from tests.unit.report_factory import release_pair

FIX = Path(__file__).parent / "fixtures" / "reports"


def test_older_major_version_fails_clearly():
    with pytest.raises(BadInputError) as ei:
        Report.load(FIX / "report-v0.9.json")
    msg = str(ei.value)
    assert "report schema 0.9" in msg and f"reads {SCHEMA_VERSION.split('.')[0]}.x" in msg
    assert "edgekit_version" in msg  # the hint: open it with the version that wrote it


def test_newer_major_version_fails_clearly():
    with pytest.raises(BadInputError, match="report schema 2.0"):
        Report.load(FIX / "report-v2.0.json")


def test_minimal_1_0_report_without_newer_fields_loads_and_renders(tmp_path):
    r = Report.load(FIX / "report-v1.0-minimal.json")
    assert r.compared_with is None and r.comparison is None and r.variants[0].latency_ms.raw is None
    paths = r.write(tmp_path)
    assert "Gate PASSED" in paths["html"].read_text() and paths["junit"].read_text().startswith("<?xml")


def test_newer_minor_version_loads_and_keeps_unknown_fields(tmp_path):
    r = Report.load(FIX / "report-v1.7-newer-minor.json")
    assert r.schema_version == "1.7"
    r.write(tmp_path)
    back = json.loads((tmp_path / "report.json").read_text())
    assert back["provenance"] == {"ci_run": "https://ci.example/run/42"}
    assert back["variants"][0]["npu_utilization"] == 0.0 and back["variants"][0]["latency_ms"]["p999"] == 1.6
    assert back["gate"]["checks"][0]["severity"] == "info"


def test_old_report_can_be_a_baseline():
    # a 1.0 report without raw timings still serves as the baseline of a comparison (CI fallback)
    old = Report.load(FIX / "report-v1.0-minimal.json")
    _, new = release_pair()
    d = new.diff(old)
    lat = d.variant("fp32").get("latency_p50_ms")
    assert lat.p_value is None and "CI overlap" in lat.test and lat.verdict in ("faster", "no significant change",
                                                                                  "below threshold")


@pytest.mark.parametrize("content, expected", [
    ("{not json", "not readable JSON"),
    ('{"hello": 1}', "no schema_version"),
    ('{"schema_version": "1.0", "target": "x"}', "not a valid edgekit report"),
])
def test_bad_files_fail_clearly(tmp_path, content, expected):
    p = tmp_path / "r.json"
    p.write_text(content)
    with pytest.raises(BadInputError, match=expected):
        Report.load(p)


def test_write_renders_everything_before_touching_the_folder(tmp_path, monkeypatch):
    old, new = release_pair()
    old.write(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert set(before) == {"report.json", "report.md", "report.html", "junit.xml"}

    import edgekit.report.html as html_mod

    def broken(_):
        raise RuntimeError("renderer bug")

    monkeypatch.setattr(html_mod, "render_html", broken)
    with pytest.raises(RuntimeError, match="renderer bug"):
        new.write(tmp_path)
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert after == before  # nothing replaced, no temp files left


def test_1_2_report_with_search_and_comparison_loads_typed_and_renders(tmp_path):
    """A 1.2 report (written by 1.2 code: search as an undeclared extra, comparison and compared_with as
    dicts) loads into the typed sections, renders, and its newer-than-1.2 fields come back as null."""
    from edgekit.report.model import ComparedWith, DeviceInfo, LineageStep, ReportDiff, SearchSection

    r = Report.load(FIX / "report-v1.2-search-comparison.json")
    assert r.schema_version == "1.2"
    assert isinstance(r.device, DeviceInfo) and r.device.temperature_c.after == 51.5
    assert isinstance(r.search, SearchSection) and r.search.selected == "int8"
    assert r.search.shipped.file == "edgekit-out/ship/int8.onnx"
    cands = {c.name: c for c in r.search.candidates}
    assert cands["tflite-int8"].dropped_at == "host_accuracy" and cands["int8"].screening.p50 == 0.51
    assert cands["int8"].passes[0].name == "quantize" and cands["int8-qdq-per-channel"].status == "skipped"
    assert isinstance(r.comparison, ReportDiff) and r.comparison.variant("int8").get("latency_p50_ms").verdict
    assert isinstance(r.compared_with, ComparedWith) and r.compared_with.path == "releases/1.2/report.json"
    assert r.compared_with.method is None  # 1.2 did not record how latency was judged
    assert isinstance(r.variants[1].lineage[1], LineageStep) and r.variants[1].lineage[1].parity.cosine == 1.0
    assert "search" not in (r.model_extra or {})  # a declared field now, not an extra

    paths = r.write(tmp_path)
    md, html = paths["md"].read_text(), paths["html"].read_text()
    assert "## Variant search" in md and "| tflite-int8 | dropped | host_accuracy |" in md
    assert "## Compared with the baseline report" in md and "releases/1.2/report.json" in md
    assert "judged by" not in md  # no method recorded: nothing claimed
    assert "<table id=search-candidates>" in html and "<table id=comparison-table>" in html
    back = json.loads(paths["json"].read_text())
    assert back["search"]["candidates"][2]["reason"].startswith("accuracy 91.2%")
    assert back["compared_with"]["method"] is None and back["comparison"]["baseline"]["device"] == "lab-pi"
    assert Report.load(paths["json"]).model_dump() == r.model_dump()  # the round trip is lossless


def test_a_new_report_is_written_with_the_current_schema_version(tmp_path):
    _, new = release_pair()
    new.write(tmp_path)
    assert json.loads((tmp_path / "report.json").read_text())["schema_version"] == SCHEMA_VERSION == "1.4"
