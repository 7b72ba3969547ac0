"""Runtime options as a search dimension (edgekit/variant_search/tuning.py), on the local device
with the real agent and onnxruntime: the selected file is measured again under each setting,
every setting is a candidate row, the agent applies (and reports) the options, and ship/ records
the runtime configuration the measured speed needs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgekit.inputs.targets import MeasureDefaults
from edgekit.orchestration.options import DeployOptions
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
    assert {s["threads"] for s in g} == {1, 2} and len(g) == 7
    assert g[0] == {"threads": 1, "options": {}}  # the default first
    fixed = settings_grid("onnxruntime", cores=8, threads_fixed=1)
    assert {s["threads"] for s in fixed} == {1}
    assert {s["options"].get("graph_optimization_level") for s in fixed} == {None, "extended", "basic"}
    assert label("int8", {"threads": 2, "options": {"graph_optimization_level": "basic"}}, 1) == "int8@t2,opt=basic"


def test_each_runtime_option_is_tried_alone_and_the_grid_is_capped():
    """One option at a time at each thread count (never their product); parallel mode only above one
    thread, with the inter-op pool at the setting's threads; at most 4 thread counts."""
    ort = settings_grid("onnxruntime", cores=2, threads_fixed=None)
    assert {"threads": 2, "options": {"execution_mode": "parallel", "inter_op_threads": 2}} in ort
    assert not [s for s in ort if s["threads"] == 1 and "execution_mode" in s["options"]]
    assert all(len({k for k in s["options"] if k != "inter_op_threads"}) <= 1 for s in ort)
    lite = settings_grid("litert", cores=2, threads_fixed=None)
    assert lite == [{"threads": t, "options": o} for t in (1, 2)
                    for o in ({}, {"api": "compiled"}, {"xnnpack": "off"})]
    assert settings_grid("executorch", cores=4, threads_fixed=None) == [{"threads": t, "options": {}}
                                                                        for t in (1, 2, 4)]
    assert [len(settings_grid(rt, cores=64, threads_fixed=None)) for rt in ("onnxruntime", "litert", "executorch")] \
        == [11, 9, 3]
    assert [s["threads"] for s in settings_grid("executorch", cores=3, threads_fixed=None)] == [1, 2, 3]
    assert len(settings_grid("onnxruntime", cores=64, threads_fixed=4)) == 4
    names = [label("m", s, 1) for s in ort + lite]
    assert "m@t2,mode=parallel" in names and "m@xnnpack=off" in names and "m@t2,api=compiled" in names
    assert label("m", {"threads": 2, "options": {"execution_mode": "parallel", "inter_op_threads": 3}}, 1) \
        == "m@t2,mode=parallel,inter=3"  # an inter-op pool other than the threads is named
    for grid in (ort, lite):  # one row name per setting
        assert len({label("m", s, 1) for s in grid}) == len(grid)


def test_a_page_runtime_is_tuned_only_on_the_options_it_takes():
    """In the browser (tune_runtime passes the page runtime's PAGE_OPTIONS): ORT Web keeps its
    optimization levels and drops what the page cannot set (the parallel mode's inter-op pool);
    LiteRT.js takes no options (its WASM CPU path is XNNPACK, not switchable), so only threads vary."""
    from edgekit.agent.browser_bridge import PAGE_OPTIONS
    from edgekit.variant_search.tuning import tuning_grid

    native, _ = tuning_grid("onnxruntime", {"device": {}}, 2, None)
    page, _ = tuning_grid("onnxruntime", {"device": {}}, 2, None, PAGE_OPTIONS["onnxruntime"])
    assert {"threads": 2, "options": {"execution_mode": "parallel", "inter_op_threads": 2}} in native
    assert [g for g in native if "inter_op_threads" not in g["options"]] == page
    assert {g["options"].get("graph_optimization_level") for g in page} == {None, "basic", "extended"}
    lite_native, _ = tuning_grid("litert", {"device": {}}, 2, None)
    lite_page, _ = tuning_grid("litert", {"device": {}}, 2, None, PAGE_OPTIONS["litert"])
    assert {"threads": 1, "options": {"xnnpack": "off"}} in lite_native
    assert lite_page == [{"threads": 1, "options": {}}, {"threads": 2, "options": {}}]


def test_search_measures_each_runtime_setting_and_ships_its_config(data, tmp_path):
    model, ev = data
    out = tmp_path / "out"
    r = search(model, eval_data=ev, out=out, options=SearchOptions(candidates=[], host_filter=False, measure=FAST,
                                                                   screening_runs=10))
    rows = {c.name: c for c in r.search.candidates}
    tuned = [n for n in rows if "@" in n]
    assert sorted(tuned) == sorted(["fp32@opt=basic", "fp32@opt=extended", "fp32@t2", "fp32@t2,opt=basic",
                                    "fp32@t2,opt=extended", "fp32@t2,mode=parallel"]), tuned
    measured = 0
    for n in tuned:
        assert rows[n].status in ("finalist", "selected", "dropped"), rows[n]
        if rows[n].status != "dropped":
            measured += 1
            v = r.variant(n)
            assert v.runtime.threads == (2 if "t2" in n else 1)
            want = "basic" if "basic" in n else ("extended" if "extended" in n else None)
            got = v.runtime.options or {}
            assert got.get("graph_optimization_level") == want  # the agent applied it
            assert got.get("execution_mode") == ("parallel" if "parallel" in n else None)
            assert got.get("inter_op_threads") == (2 if "parallel" in n else None)
            assert v.latency_ms.runs >= 30 and v.latency_ms.p50 > 0
    assert measured >= 4
    sel = next(v for v in r.variants if v.selected)
    cfg = json.loads((out / "ship" / "runtime.json").read_text())
    assert cfg["runtime"] == "onnxruntime" and cfg["threads"] == sel.runtime.threads
    assert cfg["options"] == (sel.runtime.options or {})
    so = cfg["apply"]["sess_options"]  # every SessionOptions field the measured speed needs
    assert so["intra_op_num_threads"] == sel.runtime.threads
    assert so["execution_mode"] == ("ORT_PARALLEL" if "parallel" in sel.name else "ORT_SEQUENTIAL")
    assert so["graph_optimization_level"].startswith("ORT_")
    assert r.search.shipped.file.endswith(".onnx")
    par = _shipped_as(r.variant("fp32@t2,mode=parallel"), model, tmp_path)  # had that row shipped
    assert par["threads"] == 2 and par["options"] == {"execution_mode": "parallel", "inter_op_threads": 2}
    assert par["apply"]["sess_options"] == {"intra_op_num_threads": 2, "inter_op_num_threads": 2,
                                            "execution_mode": "ORT_PARALLEL",
                                            "graph_optimization_level": "ORT_ENABLE_ALL"}


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
    from edgekit.devices.session import DeviceSession, MeasureFailure, RunSettings
    from edgekit.inputs.data import load_npz
    from edgekit.inputs.source import load_source
    from edgekit.inputs.targets import load_target
    from edgekit.metrics import MetricSpec
    from edgekit.metrics.evaluate import eval_plan

    model, ev = data
    src = load_source(model, workdir=tmp_path)
    ds = load_npz(ev, x_key="x", y_key="y", require_labels=False, role="eval")
    with DeviceSession(load_target("local"), None, source_io=src.artifact.io,
                       plan=eval_plan(MetricSpec(), src, ds)) as s:
        res = s.measure("x", src.artifact, RunSettings(measure=FAST, runtime_options={"turbo": True}))
    assert isinstance(res, MeasureFailure) and res.kind == "bad_request"
    assert "turbo" in res.message and "graph_optimization_level" in res.message


def _shipped_as(variant, model, tmp_path):
    """ship/ written for one measured tuning row (the file it measured is the source's own)."""
    from edgekit.inputs.source import load_source
    from edgekit.orchestration.ship import write_ship

    out = tmp_path / variant.name.replace("@", "_").replace(",", "_").replace("=", "-")
    out.mkdir()
    art = load_source(model, workdir=tmp_path).artifact
    write_ship(out, variant, art, art.io)
    return json.loads((out / "ship" / "runtime.json").read_text())


@pytest.fixture(scope="module")
def tflite_data(tmp_path_factory):
    """A .tflite as the user's model (the search's fp32 is that file, so the tuned runtime is LiteRT),
    labelled with its own predictions."""
    pytest.importorskip("ai_edge_litert")
    pytest.importorskip("tensorflow")
    from ai_edge_litert.interpreter import Interpreter

    from tests.unit.agent_loader import tiny_tflite

    d = tmp_path_factory.mktemp("tuning-tflite")
    model = tiny_tflite(d / "conv.tflite")
    x = np.random.default_rng(0).standard_normal((24, 16, 16, 3)).astype(np.float32)
    it = Interpreter(model_path=str(model))
    it.allocate_tensors()
    i, o = it.get_input_details()[0], it.get_output_details()[0]
    ys = []
    for row in x:
        it.set_tensor(i["index"], row[None])
        it.invoke()
        ys.append(int(it.get_tensor(o["index"]).argmax()))
    np.savez(d / "eval.npz", x=x, y=np.array(ys))
    return model, d / "eval.npz"


def test_litert_search_measures_xnnpack_and_compiled_model_rows(tflite_data, tmp_path):
    model, ev = tflite_data
    out = tmp_path / "out"
    r = search(model, eval_data=ev, out=out, options=SearchOptions(candidates=[], host_filter=False, measure=FAST,
                                                                   screening_runs=10))
    rows = {c.name: c for c in r.search.candidates}
    tuned = sorted(n for n in rows if "@" in n)
    assert tuned == sorted(["fp32@api=compiled", "fp32@xnnpack=off", "fp32@t2", "fp32@t2,api=compiled",
                            "fp32@t2,xnnpack=off"]), tuned
    for n in tuned:
        assert rows[n].status in ("finalist", "selected"), (n, rows[n].reason)  # same outputs: all pass the gate
        v = r.variant(n)
        assert v.runtime.name == "litert" and v.runtime.threads == (2 if "t2" in n else 1)
        assert (v.runtime.options or {}) == ({"api": "compiled"} if "compiled" in n else
                                             {"xnnpack": "off"} if "off" in n else {})
        assert v.runtime.delegate == (None if "off" in n else "xnnpack")  # read off the loaded graph
        assert v.accuracy.value == 100.0 and v.latency_ms.runs >= 30
    assert r.variant("fp32").runtime.delegate == "xnnpack"
    sel = next(v for v in r.variants if v.selected)
    cfg = json.loads((out / "ship" / "runtime.json").read_text())
    assert cfg["runtime"] == "litert" and cfg["options"] == (sel.runtime.options or {})
    assert cfg["threads"] == sel.runtime.threads and cfg["file"].endswith(".tflite")
    compiled = _shipped_as(r.variant("fp32@api=compiled"), model, tmp_path)
    assert compiled["options"] == {"api": "compiled"} and "CompiledModel" in compiled["apply"]["call"]
    assert compiled["apply"]["cpu_options"] == {"num_threads": 1, "kernel_mode": None}
    off = _shipped_as(r.variant("fp32@t2,xnnpack=off"), model, tmp_path)
    assert off["apply"]["experimental_op_resolver_type"] == "BUILTIN_WITHOUT_DEFAULT_DELEGATES"
    assert off["apply"]["num_threads"] == 2 and off["delegate"] is None


def test_the_agent_refuses_an_unknown_litert_option_value(tflite_data, tmp_path):
    from edgekit.devices.session import DeviceSession, MeasureFailure, RunSettings
    from edgekit.inputs.data import load_npz
    from edgekit.inputs.source import load_source
    from edgekit.inputs.targets import load_target
    from edgekit.metrics import MetricSpec
    from edgekit.metrics.evaluate import eval_plan

    model, ev = tflite_data
    src = load_source(model, workdir=tmp_path)
    ds = load_npz(ev, x_key="x", y_key="y", require_labels=False, role="eval")
    with DeviceSession(load_target("local"), None, source_io=src.artifact.io,
                       plan=eval_plan(MetricSpec(), src, ds)) as s:
        res = s.measure("x", src.artifact, RunSettings(measure=FAST, runtime_options={"xnnpack": "fast"}))
    assert isinstance(res, MeasureFailure) and res.kind == "bad_request"
    assert "xnnpack" in res.message and "'on', 'off'" in res.message


def test_a_candidate_whose_runtime_the_device_lacks_is_dropped_before_delivery(data, tmp_path, monkeypatch):
    """The device's --probe lists its runtimes: an OpenVINO candidate for a device without openvino is
    dropped before anything is sent, naming the runtime and the provisioning command; the rest is measured.
    (The probe is the real local agent's, with openvino taken out of its answer.)"""
    from edgekit.inputs.recipe import VariantSpec
    from edgekit.measure.cache import DeviceMeasurements

    real = DeviceMeasurements.probe_doc

    def without_openvino(self):
        doc = real(self)
        return {**doc, "runtimes": {k: v for k, v in (doc.get("runtimes") or {}).items() if k != "openvino"}}

    monkeypatch.setattr(DeviceMeasurements, "probe_doc", without_openvino)
    model, ev = data
    ov = VariantSpec(name="openvino-fp32", passes=[{"convert": {"to": "openvino", "precision": "fp32"}}])
    r = search(model, eval_data=ev, out=tmp_path / "out", target="local",
               options=SearchOptions(candidates=[ov], host_filter=False, measure=FAST, screening_runs=10,
                                     tune_runtime=False))
    rows = {c.name: c for c in r.search.candidates}
    assert rows["openvino-fp32"].status == "dropped" and rows["openvino-fp32"].dropped_at == "delivery", rows
    assert "the device has no openvino runtime" in rows["openvino-fp32"].reason
    # local is this host: the extra to install, not a provisioning command for a device
    assert "install it on this host: pip install 'edgekit[openvino]'" in rows["openvino-fp32"].reason
    assert {v.name for v in r.variants} == {"fp32"} and r.search.selected == "fp32"
