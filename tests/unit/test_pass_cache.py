"""The pass cache: a re-run with nothing changed recomputes nothing; any change that can alter
the output is a miss; a damaged entry is never trusted. Real passes, real files."""

from __future__ import annotations

import json

import pytest

from edgekit.inputs.data import load_npz
from edgekit.inputs.source import load_pt2
from edgekit.orchestration.cache import PassCache, cache_root
from edgekit.passes import PassContext, get_pass


@pytest.fixture
def setup(digits, tmp_path):
    ctx = PassContext(workdir=tmp_path / "work", eval=load_npz(digits.eval))
    return PassCache(tmp_path / "cache"), load_pt2(digits.pt2).artifact, ctx


def test_second_run_is_a_hit_with_the_same_bytes_and_lineage(setup):
    cache, art, ctx = setup
    p = get_pass("prune_magnitude")
    first = cache.run(p, art, {"sparsity": 0.5}, ctx, "a")
    second = cache.run(p, art, {"sparsity": 0.5}, ctx, "b")
    assert (cache.hits, cache.misses) == (1, 1)
    assert second.sha256 == first.sha256 and second.path != first.path and second.path.is_file()
    step = second.lineage[-1]
    assert step.name == "prune_magnitude" and step.metrics["cache"]["hit"] is True
    assert step.metrics["sparsity"] == first.lineage[-1].metrics["sparsity"]
    assert step.input_sha256 == art.sha256


def test_changed_config_or_data_is_a_miss(setup, digits):
    cache, art, ctx = setup
    p = get_pass("prune_magnitude")
    cache.run(p, art, {"sparsity": 0.5}, ctx, "a")
    cache.run(p, art, {"sparsity": 0.6}, ctx, "b")
    ctx2 = PassContext(workdir=ctx.workdir, eval=ctx.eval, train=load_npz(digits.train))
    cache.run(p, art, {"sparsity": 0.5}, ctx2, "c")
    assert (cache.hits, cache.misses) == (0, 3)


def test_a_damaged_entry_is_recomputed_not_trusted(setup):
    cache, art, ctx = setup
    p = get_pass("prune_magnitude")
    first = cache.run(p, art, {"sparsity": 0.5}, ctx, "a")
    (entry,) = [m.parent for m in cache.root.rglob("meta.json")]
    meta = json.loads((entry / "meta.json").read_text())
    (entry / meta["file"]).write_bytes(b"garbage")
    again = cache.run(p, art, {"sparsity": 0.5}, ctx, "b")
    assert cache.misses == 2 and again.sha256 == first.sha256


def test_cache_location_follows_edgekit_home(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / "cache" / "passes"
    monkeypatch.delenv("EDGEKIT_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "edgekit" / "passes"
