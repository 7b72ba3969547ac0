"""benchmarks/_docs.py: a benchmark writes its table into its docs page between markers, headed by where and how
it was measured; a page without the markers is refused (nothing appended silently)."""


import pytest
from _docs import markers, write_section


def test_the_section_between_the_markers_is_replaced_with_its_provenance(tmp_path):
    begin, end = markers("demo")
    page = tmp_path / "page.md"
    page.write_text(f"# Title\n\nbefore\n\n{begin}\n| old | table |\n{end}\n\nafter\n", encoding="utf-8")
    write_section(page, "demo", "| a | b |\n|---|---|\n| 1 | 2 |", command=["benchmarks/demo.py", "--x"],
                  when="2026-12-06")
    text = page.read_text(encoding="utf-8")
    assert "| old | table |" not in text and "| 1 | 2 |" in text
    assert text.startswith("# Title\n\nbefore\n\n" + begin) and text.endswith(end + "\n\nafter\n")
    line = text.splitlines()[5]
    assert line.startswith("Written by the benchmark: ") and "2026-12-06" in line
    assert "`python benchmarks/demo.py --x`" in line and "edgekit `" in line
    write_section(page, "demo", "| c |", command=["benchmarks/demo.py"], when="2026-12-07")  # again: replaced
    assert page.read_text(encoding="utf-8").count(begin) == 1 and "| 1 | 2 |" not in page.read_text()


def test_a_page_without_the_markers_is_refused_and_left_as_it_was(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# no markers\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="no section for benchmark 'demo'"):
        write_section(page, "demo", "| x |")
    assert page.read_text(encoding="utf-8") == "# no markers\n"
    assert [p.name for p in tmp_path.iterdir()] == ["page.md"]
