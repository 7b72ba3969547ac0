"""Runtime options as a search dimension (edgekit/variant_search/tuning.py), on the local device
with the real agent and onnxruntime: the selected file is measured again under each setting,
every setting is a candidate row, the agent applies (and reports) the options, and ship/ records
the runtime configuration the measured speed needs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgekit.options import DeployOptions
from edgekit.targets import MeasureDefaults
from edgekit.variant_search import SearchOptions, search
from edgekit.variant_search.tuning import label, settings_grid
from tests.unit.agent_loader import tiny_onnx

FAST = MeasureDefaults(warmup=3, runs=30, min_seconds=0.0, max_runs=30)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("tuning")
    model = tiny_onnx(d / "tiny.onnx")
    x = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    np.savez(d / "eval.npz", x=x, y=(x @ w).argmax(1))
    return model, d / "eval.npz"


def test_the_grid_varies_threads_only_when_not_fixed():
    g = settings_grid("onnxruntime", cores=2, threads_fixed=None)
    assert {s["threads"] for s in g} == {1, 2} and len(g) == 6
    assert g[0] == {"threads": 1, "options": {}}  # the default first
    fixed = settings_grid("onnxruntime", cores=8, threads_fixed=1)
    assert {s["threads"] for s in fixed} == {1}
    assert {s["options"].get("graph_optimization_level") for s in fixed} == {None, "extended", "basic"}
    assert settings_grid("litert", cores=4, threads_fixed=None) == [{"threads": t, "options": {}} for t in (1, 2, 3, 4)]
    assert label("int8", {"threads": 2, "options": {"graph_optimization_level": "basic"}}, 1) == "int8@t2,opt=basic"


def test_search_measures_each_runtime_setting_and_ships_its_config(data, tmp_path):
    model, ev = data
    out = tmp_path / "out"
    r = search(model, eval_data=ev, out=out, options=SearchOptions(candidates=[], host_filter=False, measure=FAST,
                                                                   screening_runs=10))
    rows = {c.name: c for c in r.search.candidates}
    tuned = [n for n in rows if "@" in n]
    assert sorted(tuned) == sorted(["fp32@opt=basic", "fp32@opt=extended", "fp32@t2", "fp32@t2,opt=basic",
                                    "fp32@t2,opt=extended"]), tuned
    for n in tuned:
        assert rows[n].status in ("finalist", "selected", "dropped"), rows[n]
        if rows[n].status != "dropped":
            v = r.variant(n)
            assert v.runtime.threads == (2 if "t2" in n else 1)
            want = "basic" if "basic" in n else ("extended" if "extended" in n else None)
            assert (v.runtime.options or {}).get("graph_optimization_level") == want  # the agent applied it
    sel = next(v for v in r.variants if v.selected)
    cfg = json.loads((out / "ship" / "runtime.json").read_text())
    assert cfg["runtime"] == "onnxruntime" and cfg["threads"] == sel.runtime.threads
    assert cfg["options"] == (sel.runtime.options or {})
    assert r.search.shipped.file.endswith(".onnx")


def test_fixed_threads_are_honoured_and_tuning_can_be_turned_off(data, tmp_path):
    model, ev = data
    r = search(model, eval_data=ev, out=tmp_path / "a", deploy_options=DeployOptions(threads=1),
               options=SearchOptions(candidates=[], host_filter=False, measure=FAST.model_copy(update={"threads": 1}),
                                     screening_runs=10))
    assert all("t2" not in c.name for c in r.search.candidates)
    r2 = search(model, eval_data=ev, out=tmp_path / "b",
                options=SearchOptions(candidates=[], host_filter=False, measure=FAST, tune_runtime=False,
                                      screening_runs=10))
    assert all("@" not in c.name for c in r2.search.candidates)


def test_the_agent_refuses_an_unknown_runtime_option(data, tmp_path):
    from edgekit.data import load_npz
    from edgekit.device_session import DeviceSession, MeasureFailure, RunSettings
    from edgekit.metrics import MetricSpec
    from edgekit.metrics.evaluate import eval_plan
    from edgekit.source import load_source
    from edgekit.targets import load_target

    model, ev = data
    src = load_source(model, workdir=tmp_path)
    ds = load_npz(ev, x_key="x", y_key="y", require_labels=False, role="eval")
    with DeviceSession(load_target("local"), None, source_io=src.artifact.io,
                       plan=eval_plan(MetricSpec(), src, ds)) as s:
        res = s.measure("x", src.artifact, RunSettings(measure=FAST, runtime_options={"turbo": True}))
    assert isinstance(res, MeasureFailure) and res.kind == "bad_request"
    assert "turbo" in res.message and "graph_optimization_level" in res.message
