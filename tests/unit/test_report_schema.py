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
