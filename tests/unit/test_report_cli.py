"""`edgekit report show | diff | render` on report files written from Report objects."""

from __future__ import annotations

import json

from edgekit.inputs.recipe import GateConfig
from edgekit.report.gate import compare_with_baseline
from tests.unit.report_factory import release_pair


def _write_pair(tmp_path, **kw):
    old, new = release_pair(**kw)
    old.write(tmp_path / "old")
    new.write(tmp_path / "new")
    return tmp_path / "old" / "report.json", tmp_path / "new" / "report.json"


def test_diff_unchanged_exits_0(cli, tmp_path):
    a, b = _write_pair(tmp_path)
    r = cli("report", "diff", a, b)
    assert r.exit_code == 0, r.stdout + r.stderr
    assert "no regression" in r.stdout and "no significant change" in r.stdout


def test_diff_regression_exits_1_and_names_check_and_significance(cli, tmp_path):
    a, b = _write_pair(tmp_path, slower=1.3)
    r = cli("report", "diff", a, b)
    assert r.exit_code == 1
    assert "FAIL latency_regression [int8]" in r.stdout and "Mann-Whitney p=" in r.stdout
    # a looser threshold on the command line
    assert cli("report", "diff", a, b, "--max-latency-regression", "0.5").exit_code == 0


def test_diff_json(cli, tmp_path):
    a, b = _write_pair(tmp_path, acc_after=95.0)
    r = cli("report", "diff", a, b, "--json")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["passed"] is False
    assert [c["name"] for c in doc["checks"] if not c["passed"]] == ["release_accuracy_drop"]
    assert doc["diff"]["variants"][1]["variant"] == "int8"


def test_diff_of_a_missing_or_foreign_file_exits_2(cli, tmp_path):
    a, _ = _write_pair(tmp_path)
    r = cli("report", "diff", a, tmp_path / "nope.json")
    assert r.exit_code == 2 and "not found" in r.stderr
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema_version": "2.0"}))
    r = cli("report", "diff", a, other)
    assert r.exit_code == 2 and "report schema 2.0" in r.stderr


def test_show_prints_table_and_comparison(cli, tmp_path):
    old, new = release_pair(slower=1.3)
    old.write(tmp_path / "old")
    compare_with_baseline(new, old, tmp_path / "old" / "report.json", GateConfig())
    new.write(tmp_path / "new")
    r = cli("report", "show", tmp_path / "new" / "report.json")
    assert r.exit_code == 1
    assert "FAILED" in r.stdout and "p50 95% CI" in r.stdout and "compared with" in r.stdout
    assert "latency_p50_ms" in r.stdout and "slower" in r.stdout


def test_render_rewrites_the_views(cli, tmp_path):
    _, b = _write_pair(tmp_path)
    (b.parent / "report.html").unlink()
    (b.parent / "junit.xml").unlink()
    r = cli("report", "render", b)
    assert r.exit_code == 0
    assert (b.parent / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert (b.parent / "junit.xml").exists()
