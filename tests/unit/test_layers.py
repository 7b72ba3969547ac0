"""The package layers of docs/architecture.md hold in the code (issue #43): a package never imports one of a higher
layer, and no two packages import each other. Read from the source with ``ast`` (nothing is imported); every
import counts: module level, inside functions, and under ``if TYPE_CHECKING:`` (an annotation is a dependency
too, and a type-only circle is a circle).

A package is a folder of ``edgekit/`` (``edgekit/passes/accuracy_aware/`` belongs to ``passes``); the modules
directly in ``edgekit/`` (errors, paths, artifact, timeline...) are the ``root`` layer; ``edgekit/__init__.py``
(the public API, which names everything) is ``api``, on top with ``cli``.

``UPWARD`` names each import that still goes up, with its reason: an allow-list that may only shrink (an entry
no longer needed fails, so that it is deleted)."""

from __future__ import annotations

import ast
from pathlib import Path

from test_import_cycles import PKG, _modules, _targets

# bottom to top: a package imports packages of its own row or of a row below, never above
LAYERS: list[tuple[str, ...]] = [
    ("root",),  # edgekit/*.py: errors, paths, fsutil, logs, config, host, timeline, formats, pass_names, artifact...
    ("inputs",),  # what the user brings: source, data, stateful, recipe (its metric_spec), targets
    ("agent", "transport", "sim", "measure"),  # agent protocol and bundle, transports, sim hosts, statistics
    ("convert",),
    ("metrics",),
    ("train",),
    ("passes",),
    ("micro",),  # microcontrollers: TFLite Micro's kernels on the host (op check, arena, fit, C array)
    ("report",),  # the report schema, its views, the gate and the release statistics
    ("devices",),  # the device stage: session, lock, lease, labgrid places, inventory, provisioning, profiles
    ("lab",),  # a shared lab: inventory devices exported as labgrid places
    ("llm",),  # language models: their exports, race, quality, judge and generation workload
    # the stages deploy and the search share (preparation, options, steps, report assembly, ship writer, release
    # gate) and the runs of a generator, a microcontroller and a fleet
    ("orchestration",),
    ("variant_search",),  # the search over variants: a fixed graph's run without a recipe
    ("pipeline",),  # the one deploy entry for every kind of model (pipeline/deploy.py)
    ("cli", "api"),
]
RANK = {p: i for i, row in enumerate(LAYERS) for p in row}

# (importer, imported): why it still goes up. May only shrink.
UPWARD: dict[tuple[str, str], str] = {
}
# packages of one row that import each other (a before b), allowed for now: why. May only shrink. (A circle
# across rows has an upward import: UPWARD names it.)
MUTUAL: dict[tuple[str, str], str] = {}


def layer_of(module: str, pkg: Path = PKG) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "api"
    if len(parts) == 2 and (pkg / f"{parts[1]}.py").is_file():
        return "root"
    return parts[1]


def _every_import(tree: ast.AST):
    """Every import statement: module level, in functions and classes, and under TYPE_CHECKING."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def package_edges(pkg: Path = PKG) -> dict[tuple[str, str], list[str]]:
    """(importer package, imported package) -> the imports that make it, as ``module:line -> module``."""
    mods = _modules(pkg)
    out: dict[tuple[str, str], list[str]] = {}
    for m, p in sorted(mods.items()):
        tree = ast.parse(p.read_text(encoding="utf-8"))
        for n in _every_import(tree):
            for t in _targets(m, n, p.name == "__init__.py", mods):
                a, b = layer_of(m, pkg), layer_of(t, pkg)
                if t in mods and a != b:
                    out.setdefault((a, b), []).append(f"{m}:{n.lineno} -> {t}")
    return out


def _mutual(edges) -> set[tuple[str, str]]:
    return {tuple(sorted(k)) for k in edges if (k[1], k[0]) in edges}


def test_every_package_has_a_layer():
    found = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    named = set(RANK) - {"root", "api"}
    assert found == named, f"LAYERS (architecture.md) names all packages: new {found - named}, gone {named - found}"


def test_the_edges_see_type_only_and_function_imports(tmp_path):
    pkg = tmp_path / "p"
    (pkg / "low").mkdir(parents=True)
    (pkg / "high").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "base.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "high" / "__init__.py").write_text("")
    type_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..high.b import B\n"
    (pkg / "low" / "a.py").write_text(type_only)
    (pkg / "high" / "b.py").write_text("def f():\n    from ..low import a\n    from .. import base\n")
    edges = package_edges(pkg)
    assert set(edges) == {("low", "high"), ("high", "low"), ("high", "root")}
    assert edges[("low", "high")] == ["p.low.a:3 -> p.high.b"]
    assert _mutual(edges) == {("high", "low")}


def test_no_package_imports_a_higher_layer():
    edges = package_edges()
    up = {k: v for k, v in edges.items() if RANK[k[1]] > RANK[k[0]]}
    new = [f"{a} -> {b} (layer {RANK[a]} -> {RANK[b]}): {'; '.join(up[(a, b)][:4])}"
           for a, b in sorted(up) if (a, b) not in UPWARD]
    assert not new, ("a package imports a higher layer (docs/architecture.md; move the function down to the layer "
                     "that owns it, or the caller up):\n" + "\n".join(new))
    gone = sorted(set(UPWARD) - set(up))
    assert not gone, f"no longer imported upward: delete these from UPWARD: {gone}"


def test_no_two_packages_import_each_other():
    edges = package_edges()
    mutual = {(a, b) for a, b in _mutual(edges) if (a, b) not in UPWARD and (b, a) not in UPWARD}
    new = [f"{a} <-> {b}: {'; '.join(edges[(a, b)][:3])} || {'; '.join(edges[(b, a)][:3])}"
           for a, b in sorted(mutual) if (a, b) not in MUTUAL]
    assert not new, "packages that import each other:\n" + "\n".join(new)
    gone = sorted(set(MUTUAL) - mutual)
    assert not gone, f"no longer a circle: delete these from MUTUAL: {gone}"
