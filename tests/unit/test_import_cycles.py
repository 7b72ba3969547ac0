"""No import cycles among edgekit's modules: none at module import time anywhere, and none at all
(function-level imports included) through the foundation modules that everything else builds on
(paths, errors, formats, fsutil, devices, lock, provision, the simulator's state). Read from the
source with ``ast``, so nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "edgekit"

# modules that must sit in no cycle even through imports inside functions
FOUNDATION = ("edgekit.paths", "edgekit.errors", "edgekit.formats", "edgekit.fsutil", "edgekit.devices",
              "edgekit.lock", "edgekit.provision", "edgekit.sim.device", "edgekit.sim.state",
              "edgekit.convert.hops", "edgekit.agent.inprocess")


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _targets(mod: str, node: ast.AST, is_pkg: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = mod.split(".") if is_pkg else mod.split(".")[:-1]
        if node.level > 1:
            base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [target] + [f"{target}.{a.name}" for a in node.names]  # `from . import x` imports module x


def _module_level(body: list[ast.stmt]):
    """Import statements that run when the module is imported (under if/try too, not TYPE_CHECKING)."""
    for n in body:
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            yield n
        elif isinstance(n, ast.If):
            if "TYPE_CHECKING" in ast.dump(n.test):
                continue
            yield from _module_level(n.body)
            yield from _module_level(n.orelse)
        elif isinstance(n, ast.Try):
            for block in (n.body, n.orelse, n.finalbody, *[h.body for h in n.handlers]):
                yield from _module_level(block)


def import_graph(*, module_level_only: bool) -> dict[str, set[str]]:
    mods = _modules()
    graph = {}
    for m, p in mods.items():
        tree = ast.parse(p.read_text(encoding="utf-8"))
        nodes = (_module_level(tree.body) if module_level_only
                 else (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))))
        graph[m] = {t for n in nodes for t in _targets(m, n, p.name == "__init__.py") if t in mods and t != m}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    g = import_graph(module_level_only=False)
    assert "edgekit.paths" in g["edgekit.lock"]  # the graph sees real imports


def test_no_cycle_at_module_import_time():
    found = cycles(import_graph(module_level_only=True))
    assert not found, f"import cycles at module level: {found}"


@pytest.mark.parametrize("module", FOUNDATION)
def test_foundation_modules_are_in_no_cycle(module):
    graph = import_graph(module_level_only=False)
    # a renamed or moved module fails here (it would otherwise leave the list unchecked): update FOUNDATION
    assert module in graph, f"{module} is in FOUNDATION but is no module of edgekit now"
    found = [c for c in cycles(graph) if module in c]
    assert not found, f"{module} is in an import cycle (imports inside functions included): {found}"


def test_paths_is_a_leaf():
    assert import_graph(module_level_only=False)["edgekit.paths"] == set()


def test_edgekit_home_keeps_its_old_names():
    from edgekit import devices, fsutil, lock, paths

    assert devices.edgekit_home is paths.edgekit_home and lock.locks_dir is paths.locks_dir
    assert fsutil.cache_dir is paths.cache_dir and devices.inventory_path is paths.inventory_path
    assert devices.edgekit_known_hosts() == paths.edgekit_home() / "known_hosts"
