"""`deploy` and `search` stay short orchestrations over shared pieces (docs/architecture.md: "each
under ~60 lines", signature and docstring included): a step that grows goes into a named helper.
Measured from the source with ``ast``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "edgekit"
MAX_LINES = 60
# (file, function): the public entry points (a fixed graph's and a language model's) and the search's real body
ORCHESTRATIONS = [("pipeline/deploy.py", "deploy"), ("variant_search/run.py", "search"),
                 ("variant_search/run.py", "_search"), ("orchestration/generate.py", "deploy_lm"),
                 ("orchestration/generate.py", "deploy_generator")]


def function_lines(path: Path, name: str) -> int:
    """Lines of the module-level function ``name``, from ``def`` to its last line."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    assert found, f"no function {name} in {path}: update ORCHESTRATIONS"
    return found[0].end_lineno - found[0].lineno + 1


def test_function_lines_counts_from_def_to_the_last_line(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("import os\n\n\ndef f(\n    a,\n):\n    '''doc'''\n    return a\n\n\ndef g():\n    pass\n")
    assert function_lines(p, "f") == 5 and function_lines(p, "g") == 2


@pytest.mark.parametrize("file, name", ORCHESTRATIONS)
def test_orchestration_is_at_most_60_lines(file, name):
    n = function_lines(PKG / file, name)
    assert n <= MAX_LINES, (f"edgekit/{file}:{name} is {n} lines (at most {MAX_LINES}): move a step into a "
                            "named helper")
