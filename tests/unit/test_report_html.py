"""The HTML report (edgekit.report.html) and the JUnit view (edgekit.report.junit), from Report objects
built directly."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

from edgekit.inputs.recipe import GateConfig
from edgekit.report.gate import compare_with_baseline
from edgekit.report.html import pareto_front, parity_hops, render_html, sustained_series
from edgekit.report.junit import render_junit
from tests.unit.report_factory import release_pair, report, variant


def _sustained_bins(seconds=60, start_ms=1.0, end_ms=1.4):
    n = 10
    return {"seconds": seconds, "bin_s": seconds / n, "segment_s": 15,
            "bins": [{"t_start_s": i * seconds / n, "t_end_s": (i + 1) * seconds / n,
                      "p50": start_ms + (end_ms - start_ms) * i / (n - 1), "temperature_c": 50 + i} for i in range(n)],
            "first": {"p50": start_ms}, "last": {"p50": end_ms}}


def test_verdict_is_at_the_top_and_every_plot_is_inline():
    old, new = release_pair(slower=1.3)
    compare_with_baseline(new, old, None, GateConfig())
    html = render_html(new)
    assert html.index("Gate FAILED") < html.index("<table id=variants")
    assert "latency_regression [int8]" in html[:html.index("<table id=variants")]  # why, next to the verdict
    for pid in ("plot-latency", "plot-pareto", "plot-parity", "plot-comparison"):
        assert f'id="{pid}"' in html, pid
    assert 'id="plot-sustained"' not in html  # no sustained series in this report: no empty plot
    assert html.count("<svg") == 4
    assert "<script" not in html and "<link" not in html and 'src="http' not in html
    assert "Compared with the baseline report" in html and "Mann-Whitney" in html


def test_passing_report_says_passed():
    _, new = release_pair()
    html = render_html(new)
    assert "Gate PASSED" in html and 'class="verdict pass"' in html


def test_table_has_the_contract_columns():
    _, new = release_pair()
    html = render_html(new)
    table = html[html.index("<table id=variants"):html.index("</table>", html.index("<table id=variants"))]
    for col in ("format", "precision", "size KB", "p50 ms", "p50 95% CI", "p90 ms", "p99 ms", "peak MB",
                "energy mJ/inf", "top1 %", "drop (paired 95% CI)", "max |err|", "top-1 agree"):
        assert f"<th>{col}</th>" in table, col
    assert "no readable energy source (test)" in table  # a null energy says why


def test_sustained_series_is_plotted_when_present():
    v = variant("int8", precision="int8", sustained=_sustained_bins())
    r = report([variant("fp32"), v])
    t, y = sustained_series(r.variants[1])
    assert len(t) == 10 and y[0] == 1.0 and abs(y[-1] - 1.4) < 1e-9
    assert sustained_series(r.variants[0]) is None
    html = render_html(r)
    assert 'id="plot-sustained"' in html and html.count("<svg") == 4
    assert "temperature, °C (dotted)" in html  # the bins carry temperatures: drawn beside latency


def test_other_sustained_shapes_are_read():
    pairs = variant("a", sustained={"t_s": [0, 1], "latency_ms": [1.0, 1.1]})
    series = variant("b", sustained={"series": [{"t_s": 0, "p50_ms": 1.0}, {"t_s": 5, "p50_ms": 1.2}]})
    junk = variant("c", sustained={"something": "else"})
    assert sustained_series(pairs) == ([0.0, 1.0], [1.0, 1.1])
    assert sustained_series(series) == ([0.0, 5.0], [1.0, 1.2])
    assert sustained_series(junk) is None


def test_selected_variant_and_pareto_front_are_marked():
    r = report([variant("fp32", median=1.0, acc=98.0, size=200_000),
                variant("int8", median=0.5, acc=97.8, size=60_000, precision="int8", selected=True, seed=2),
                variant("slow-int8", median=0.9, acc=97.0, size=70_000, precision="int8", seed=3)])
    html = render_html(r)
    assert "★ selected" in html and "SELECTED" in html and "star = selected" in html
    pts = [(v.latency_ms.p50, v.accuracy.value, float(v.size_bytes)) for v in r.variants]
    assert pareto_front(pts) == [0, 1]  # slow-int8 is slower, less accurate and bigger than int8


def test_pareto_front_rules():
    assert pareto_front([(1, 90, 10), (2, 95, 10), (3, 94, 10)]) == [0, 1]
    assert pareto_front([(1, 90, 10), (1, 90, 10)]) == [0, 1]  # ties dominate nothing
    assert pareto_front([(2, 90, 5), (1, 90, 10)]) == [0, 1]  # smaller vs faster: both on the front


def test_parity_hops_follow_the_chain_to_the_device():
    v = variant("int8", precision="int8")
    hops = parity_hops(v)
    assert [h for h, _ in hops] == ["torch->onnx", "on device (onnxruntime)"]
    html = render_html(report([variant("fp32"), v]))
    assert "torch-&gt;onnx" in html and "on device (onnxruntime)" in html


def test_everything_from_the_report_is_escaped():
    _, new = release_pair()
    new.model["source"] = "<img src=x onerror=alert(1)>"
    new.warnings.append("<script>alert(1)</script>")
    html = render_html(new)
    assert "<img src=x" not in html and "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_without_matplotlib_the_tables_stay(monkeypatch):
    _, new = release_pair()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    html = render_html(new)
    assert "<svg" not in html and "pip install 'edgekit[report]'" in html and "<table id=variants" in html


def test_lineage_and_device_state_are_shown():
    _, new = release_pair()
    html = render_html(new)
    lineage = html[html.index("Lineage of each variant"):]
    assert "<th>mode</th><td>static</td>" in lineage  # the quantize pass's config, as a key/value record
    assert "<table id=device-table>" in html and "Cortex-A72" in html


# --- JUnit ------------------------------------------------------------------------------------------
def test_junit_one_testcase_per_gate_check():
    old, new = release_pair(slower=1.3, acc_after=95.0)
    compare_with_baseline(new, old, None, GateConfig())
    root = ET.fromstring(render_junit(new))
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == len(new.gate.checks) == int(suite.get("tests"))
    failed = {(c.get("classname"), c.get("name")) for c in cases if c.find("failure") is not None}
    assert failed == {("edgekit.gate.int8", "latency_regression"), ("edgekit.gate.int8", "release_accuracy_drop"),
                      ("edgekit.gate.int8", "accuracy_drop")}
    assert int(suite.get("failures")) == 3 == int(root.get("failures"))
    lat = next(c for c in cases if c.get("name") == "latency_regression").find("failure")
    assert "Mann-Whitney" in lat.get("message") and "p-value" in lat.text
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["target"] == "rpi4" and props["gate_passed"] == "False"


def test_junit_passing_checks_and_empty_gate():
    _, new = release_pair()
    root = ET.fromstring(render_junit(new))
    assert root.get("failures") == "0" and all(c.find("failure") is None for c in root.iter("testcase"))
    new.gate.checks = []
    root = ET.fromstring(render_junit(new))
    assert [c.get("name") for c in root.iter("testcase")] == ["gate"]


def test_search_candidates_are_listed_with_why_they_were_dropped():
    r = report([variant("fp32"), variant("int8", median=0.5, precision="int8", selected=True, seed=2)])
    r.search = {"objective": "p50", "selected": "int8", "shipped": {"file": "ship/int8.onnx"}, "seconds": 42.0,
                "time_budget_s": 900.0,
                "candidates": [{"name": "fp32", "status": "baseline", "screening": {"p50": 1.0}},
                               {"name": "int8", "status": "selected", "format": "onnx", "size_bytes": 60_000},
                               {"name": "tflite-int8", "status": "dropped", "dropped_at": "host_accuracy",
                                "reason": "accuracy 91.2% is 7.8 pts below fp32 (tolerance 1)"}]}
    html = render_html(r)
    assert "<table id=search-candidates>" in html and "ship/int8.onnx" in html
    assert "host_accuracy" in html and "7.8 pts below fp32" in html
