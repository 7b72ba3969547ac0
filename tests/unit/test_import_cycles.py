"""No import cycle among edgekit's modules: none at all, imports inside functions included (issue #23).
Read from the source with ``ast``, so nothing is imported.

What counts as an edge A -> B: any ``import``/``from ... import`` in A that names B, at module level or
inside a function, except under ``if TYPE_CHECKING:`` (never run: annotations only). ``from P import n``
is an edge to ``P.n`` when that is a module, and to ``P`` (its ``__init__`` runs) unless every name is a
submodule of P and P is A's own package or one above it: Python runs those before A, and a
``from . import sibling`` reads nothing of them. ``from .. import __version__`` is an edge to the
package; a circle through a package's ``__init__`` is a circle."""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "edgekit"


def _modules(pkg: Path = PKG) -> dict[str, Path]:
    out = {}
    for p in pkg.rglob("*.py"):
        parts = list(p.relative_to(pkg.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _targets(mod: str, node: ast.Import | ast.ImportFrom, is_pkg: bool, mods) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = mod.split(".") if is_pkg else mod.split(".")[:-1]
        if node.level > 1:
            base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    subs = [f"{target}.{a.name}" for a in node.names]  # `from . import x` imports module x
    own_package = mod == target or mod.startswith(target + ".")
    if own_package and all(s in mods for s in subs):
        return subs
    return [target, *subs]


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


def _anywhere(node: ast.AST):
    """Every import statement that can run: module level, in functions and classes, not under TYPE_CHECKING."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.dump(child.test):
            for n in child.orelse:
                yield from _anywhere(ast.Module(body=[n], type_ignores=[]))
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        yield from _anywhere(child)


def import_edges(*, module_level_only: bool, pkg: Path = PKG) -> dict[str, dict[str, int]]:
    """module -> {imported module of the package: the line of its first import}."""
    mods = _modules(pkg)
    edges: dict[str, dict[str, int]] = {}
    for m, p in mods.items():
        tree = ast.parse(p.read_text(encoding="utf-8"))
        nodes = _module_level(tree.body) if module_level_only else _anywhere(tree)
        out: dict[str, int] = {}
        for n in sorted(nodes, key=lambda n: n.lineno):
            for t in _targets(m, n, p.name == "__init__.py", mods):
                if t in mods and t != m:
                    out.setdefault(t, n.lineno)
        edges[m] = out
    return edges


def import_graph(*, module_level_only: bool, pkg: Path = PKG) -> dict[str, set[str]]:
    return {m: set(ts) for m, ts in import_edges(module_level_only=module_level_only, pkg=pkg).items()}


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


def a_circle(edges: dict[str, dict[str, int]], comp: list[str]) -> str:
    """One shortest circle through the component's first module, with the import lines:
    ``a (line 3) -> b (line 40) -> a``."""
    inside = set(comp)
    start = comp[0]
    came: dict[str, str] = {}
    todo = deque([start])
    while todo:
        v = todo.popleft()
        for w in sorted(edges[v]):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(came[path[-1]])
                path.reverse()
                hops = [f"{a} (line {edges[a][b]})" for a, b in zip(path, path[1:] + [start])]
                return " -> ".join(hops + [start])
            if w in inside and w not in came and w != start:
                came[w] = v
                todo.append(w)
    return " <-> ".join(comp)


def _report(module_level_only: bool) -> list[str]:
    edges = import_edges(module_level_only=module_level_only)
    return [a_circle(edges, c) + (f"  [the whole knot: {', '.join(c)}]" if len(c) > 2 else "")
            for c in cycles({m: set(ts) for m, ts in edges.items()})]


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    g = import_graph(module_level_only=False)
    assert "edgekit.paths" in g["edgekit.devices.lock"]  # the graph sees real imports
    assert "edgekit.train.launch" in g["edgekit.train"]  # ... and imports inside functions
    assert "edgekit.train.launch" not in import_graph(module_level_only=True)["edgekit.train"]


def test_the_graph_reads_imports_as_python_runs_them(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    files = {
        "__init__.py": "VERSION = '1'\nfrom .c import C\n",
        # a circle only through a function-level import
        "a.py": "def f():\n    from .b import g\n",
        "b.py": "from .a import f\ndef g(): pass\n",
        # a sibling by `from . import` is no edge to the package (whose __init__ imports c); its VERSION is
        "c.py": "from . import a\nclass C: pass\n",
        "d.py": "from . import VERSION\n",
        "e.py": ("from typing import TYPE_CHECKING\n"
                 "if TYPE_CHECKING:\n    from .f import F\nelse:\n    from . import a\n"),
        "f.py": "from .e import E\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    g = import_graph(module_level_only=False, pkg=pkg)
    assert g["p"] == {"p.c"} and g["p.c"] == {"p.a"} and g["p.d"] == {"p"}
    assert g["p.e"] == {"p.a"}  # under TYPE_CHECKING: never run; its else branch runs
    assert cycles(g) == [["p.a", "p.b"]]
    assert cycles(import_graph(module_level_only=True, pkg=pkg)) == []
    (pkg / "__init__.py").write_text("VERSION = '1'\nfrom .d import *\n")
    assert sorted(cycles(import_graph(module_level_only=False, pkg=pkg))) == [["p", "p.d"], ["p.a", "p.b"]]
    edges = import_edges(module_level_only=False, pkg=pkg)
    assert a_circle(edges, ["p.a", "p.b"]) == "p.a (line 2) -> p.b (line 1) -> p.a"


def test_no_cycle_at_module_import_time():
    found = _report(module_level_only=True)
    assert not found, "import cycles at module level:\n" + "\n".join(found)


def test_no_cycle_at_all_imports_inside_functions_included():
    """The whole package is layered: a module never imports (at any time) a module that imports it
    back. Break a circle by moving what both sides need into a module below them, not by hiding an
    import in a function."""
    found = _report(module_level_only=False)
    assert not found, "import cycles (imports inside functions included):\n" + "\n".join(found)


def test_paths_is_a_leaf():
    assert import_graph(module_level_only=False)["edgekit.paths"] == set()


def test_edgekit_home_keeps_its_old_names():
    from edgekit import fsutil, paths
    from edgekit.devices import inventory as devices
    from edgekit.devices import lock

    assert devices.edgekit_home is paths.edgekit_home and lock.locks_dir is paths.locks_dir
    assert fsutil.cache_dir is paths.cache_dir and devices.inventory_path is paths.inventory_path
    assert devices.edgekit_known_hosts() == paths.edgekit_home() / "known_hosts"
