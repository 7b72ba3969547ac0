"""report.md carries the variant search (what shipped, why each candidate was dropped) and the
whole-chain parity per hop, so a PR comment answers the questions without opening the HTML."""

from edgekit.report.markdown import render_markdown

from report_factory import report, variant


def test_markdown_has_search_and_parity_sections():
    r = report([variant("fp32"), variant("int8", median=0.5, precision="int8", seed=2, selected=True)])
    r.search = {"objective": "p50", "selected": "int8", "seconds": 12.5, "shipped": {"file": "out/ship/int8.onnx"},
                "candidates": [{"name": "slow", "status": "dropped", "dropped_at": "racing", "reason": "clearly slower",
                                "screening": {"p50": 2.0}},
                               {"name": "int8", "status": "selected", "screening": {"p50": 0.5}}]}
    md = render_markdown(r)
    assert "## Variant search" in md and "Selected **int8** by p50" in md and "out/ship/int8.onnx" in md
    assert "| slow | dropped | racing | 2.0000 | clearly slower |" in md
    assert "## Parity per hop" in md and "torch->onnx (host)" in md


def test_markdown_without_search_has_no_search_section():
    assert "## Variant search" not in render_markdown(report([variant("fp32"), variant("int8", seed=3)]))
