"""The agent's Runner contract: one RUNNERS dict from which --probe's runtimes and request dispatch
both come, a base that does the construction bookkeeping, and subclasses that only probe/load/run."""

import json

import numpy as np
import pytest

from agent_loader import load_agent, tiny_onnx, tiny_request


@pytest.fixture
def agent():
    return load_agent()


def test_runners_is_the_single_list(agent):
    assert {"onnxruntime", "litert"} <= set(agent.runners.RUNNERS)
    for name, cls in agent.runners.RUNNERS.items():
        assert issubclass(cls, agent.runners.Runner) and cls.name == name
        assert cls.probe is not agent.runners.Runner.probe and cls.load is not agent.runners.Runner.load


def test_available_runtimes_is_derived_from_runners(agent, monkeypatch):
    class Fake(agent.runners.Runner):
        name = "fake-rt"

        @classmethod
        def probe(cls):
            return "fake 1.0", None

    class Missing(agent.runners.Runner):
        name = "missing-rt"

        @classmethod
        def probe(cls):
            return None, "not installed"

    monkeypatch.setitem(agent.runners.RUNNERS, "fake-rt", Fake)
    monkeypatch.setitem(agent.runners.RUNNERS, "missing-rt", Missing)
    found = agent.runners.available_runtimes()
    assert found["fake-rt"] == "fake 1.0" and "missing-rt" not in found
    import onnxruntime

    assert found["onnxruntime"] == onnxruntime.__version__
    assert agent.cli.probe()["runtimes"]["fake-rt"] == "fake 1.0"


def test_probe_reports_version_or_reason(agent, monkeypatch):
    version, reason = agent.runners.OnnxRunner.probe()
    assert version and reason is None
    for mod in ("ai_edge_litert", "tflite_runtime"):
        monkeypatch.setitem(__import__("sys").modules, mod, None)
    version, reason = agent.runners.LiteRTRunner.probe()
    assert version is None and "ai_edge_litert" in reason and "tflite_runtime" in reason
    assert "litert" not in agent.runners.available_runtimes()


def test_open_and_constructor_load_the_same_way(agent, tmp_path):
    model = tiny_onnx(tmp_path / "tiny.onnx")
    req = tiny_request(model, threads=2)
    a = agent.runners.OnnxRunner.open(str(model), req)
    b = agent.runners.OnnxRunner(str(model), 2, input_specs=req["inputs"])
    x = np.ones((1, 64), np.float32)
    assert a.threads == b.threads == 2 and a.version == b.version
    np.testing.assert_array_equal(a.run([x])[0], b.run([x])[0])
    assert a.batch_dynamic() is False and a.static_batch() == 1


def test_base_defaults_and_abstract_methods(agent):
    r = agent.runners.Runner()
    assert r.threads == 1 and r.version is None
    assert r.batch_dynamic() is False and r.static_batch() == 1
    with pytest.raises(NotImplementedError):
        agent.runners.Runner.probe()
    with pytest.raises(NotImplementedError):
        r.load("m", {})
    with pytest.raises(NotImplementedError):
        r.run([])


def test_a_new_runner_is_dispatched_by_a_request(agent, tmp_path, monkeypatch, capsys):
    """A runner added to RUNNERS alone is what a request's runtime picks: measure() has no list of its own."""
    calls = {}

    class Doubler(agent.runners.Runner):
        name = "doubler"

        @classmethod
        def probe(cls):
            return "doubler 0.1", None

        def load(self, model_path, request):
            calls["load"] = (model_path, request["threads"])
            self.threads, self.version = int(request["threads"]), "doubler 0.1"

        def batch_dynamic(self):
            return True

        def run(self, inputs):
            return [np.asarray(inputs[0]) * 2]

    monkeypatch.setitem(agent.runners.RUNNERS, "doubler", Doubler)
    model = tmp_path / "m.bin"
    model.write_bytes(b"x")
    req = tiny_request(model, runtime="doubler", warmup=1, runs=3, min_seconds=0.0)
    path = tmp_path / "req.json"
    path.write_text(json.dumps(req))
    assert agent.cli.main(["agent", str(path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["runtime"]["name"] == "doubler" and doc["runtime"]["version"] == "doubler 0.1"
    assert calls["load"] == (str(model), 1) and doc["latency_ms"]["runs"] >= 3


def test_unknown_runtime_lists_the_runners(agent, tmp_path, capsys):
    model = tiny_onnx(tmp_path / "tiny.onnx")
    path = tmp_path / "req.json"
    path.write_text(json.dumps(tiny_request(model, runtime="nope")))
    assert agent.cli.main(["agent", str(path)]) == agent.EXIT_BAD_REQUEST
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["kind"] == "bad_request" and "litert" in doc["error"]["message"]


def test_the_host_loads_the_agent_once_under_one_name():
    import sys
    from pathlib import Path

    from edgekit.agent import inprocess
    from edgekit.agent.bundle import agent_source
    from edgekit.convert.tflite.host_harness import _agent

    mod = inprocess.load_agent()
    assert mod is inprocess.load_agent() is _agent() is sys.modules[inprocess.MODULE_NAME]
    # imported from the very file the device runs (zipimport of the built agent), every module of it
    pyz = mod.__edgekit_pyz__
    assert Path(pyz).read_bytes() == agent_source().read_bytes()  # the same bytes (the cache folder may differ)
    assert mod.__file__ == f"{pyz}/edgekit_agent/__init__.py"
    assert mod.runners.Runner.__module__ == f"{inprocess.MODULE_NAME}.runners.base"
    assert all(m.__file__.startswith(pyz + "/") for name, m in sys.modules.items()
               if name == inprocess.MODULE_NAME or name.startswith(inprocess.MODULE_NAME + "."))
    assert inprocess.runs_on_host("onnxruntime") and inprocess.runs_on_host("litert")
    assert not inprocess.runs_on_host("coreml") and not inprocess.runs_on_host(None)


# --- runtime options (edgekit/variant_search/tuning.py varies them; each runner applies and reports them)

def test_onnxruntime_execution_mode_is_set_on_the_session(agent, tmp_path):
    import onnxruntime as ort

    model = tiny_onnx(tmp_path / "tiny.onnx")
    x = np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)
    seq = agent.runners.OnnxRunner(str(model), 2)
    par = agent.runners.OnnxRunner(str(model), 2, runtime_options={"execution_mode": "parallel"})
    read = par.session.get_session_options()  # what the session itself runs with
    assert read.execution_mode == ort.ExecutionMode.ORT_PARALLEL and read.inter_op_num_threads == 2
    assert read.intra_op_num_threads == 2
    assert par.options == {"execution_mode": "parallel", "inter_op_threads": 2}
    assert seq.session.get_session_options().execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert seq.options == {}
    three = agent.runners.OnnxRunner(str(model), 2, runtime_options={"execution_mode": "parallel", "inter_op_threads": 3})
    assert three.session.get_session_options().inter_op_num_threads == 3
    np.testing.assert_array_equal(seq.run([x])[0], par.run([x])[0])
    basic = agent.runners.OnnxRunner(str(model), 1, runtime_options={"graph_optimization_level": "basic"})
    assert basic.session.get_session_options().graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC


@pytest.mark.parametrize("opts, words", [
    ({"execution_mode": "turbo"}, ["execution_mode", "sequential", "parallel"]),
    ({"inter_op_threads": 2}, ["inter_op_threads", "parallel"]),  # means nothing in sequential mode
    ({"execution_mode": "parallel", "inter_op_threads": 0}, ["positive integer"]),
    ({"intra": 2}, ["intra", "execution_mode", "graph_optimization_level"]),
])
def test_onnxruntime_refuses_options_it_cannot_apply(agent, tmp_path, opts, words):
    model = tiny_onnx(tmp_path / "tiny.onnx")
    with pytest.raises(agent.AgentFailure) as err:
        agent.runners.OnnxRunner.open(str(model), tiny_request(model, runtime_options=opts))
    assert err.value.kind == "bad_request" and all(w in str(err.value) for w in words), str(err.value)


needs_litert = pytest.mark.skipif(__import__("importlib").util.find_spec("ai_edge_litert") is None
                                  or __import__("importlib").util.find_spec("tensorflow") is None,
                                  reason="ai-edge-litert and tensorflow are needed (pip install 'edgekit[tflite]')")


@pytest.fixture(scope="module")
def conv_tflite(tmp_path_factory):
    from agent_loader import tiny_tflite

    return tiny_tflite(tmp_path_factory.mktemp("litert-opts") / "conv.tflite")


@needs_litert
def test_litert_xnnpack_off_leaves_the_graph_to_litert_kernels(agent, conv_tflite):
    x = np.random.default_rng(2).standard_normal((1, 16, 16, 3)).astype(np.float32)
    default = agent.runners.LiteRTRunner(str(conv_tflite), 2)
    on = agent.runners.LiteRTRunner(str(conv_tflite), 2, runtime_options={"xnnpack": "on"})
    off = agent.runners.LiteRTRunner(str(conv_tflite), 2, runtime_options={"xnnpack": "off"})
    # the allocated graph: XNNPACK replaced the nodes with one DELEGATE node, or it did not
    assert default.delegated_nodes == on.delegated_nodes == 1 and default.delegate == on.delegate == "xnnpack"
    assert off.delegated_nodes == 0 and off.delegate is None
    assert [o["op_name"] for o in off.interp._get_ops_details()] == ["CONV_2D", "CONV_2D", "MEAN"]
    assert off.options == {"xnnpack": "off"} and default.options == {}
    ref = default.run([x])[0]
    np.testing.assert_allclose(off.run([x])[0], ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(on.run([x])[0], ref)


@needs_litert
def test_litert_compiled_model_has_the_interpreters_output_contract(agent, conv_tflite):
    x = np.random.default_rng(3).standard_normal((1, 16, 16, 3)).astype(np.float32)
    interp = agent.runners.LiteRTRunner(str(conv_tflite), 1)
    cm = agent.runners.LiteRTRunner(str(conv_tflite), 1, runtime_options={"api": "compiled"})
    assert cm.interp is None and cm.cm is not None and cm.fully_accelerated and cm.delegate == "xnnpack"
    assert cm.inputs[0]["name"] == interp.inputs[0]["name"] and cm.static_batch() == interp.static_batch() == 1
    a, b = interp.run([x]), cm.run([x])
    assert len(a) == len(b) == 1 and b[0].shape == a[0].shape == (1, 16) and b[0].dtype == a[0].dtype
    np.testing.assert_array_equal(b[0], a[0])  # both XNNPACK: the same kernels
    b0 = b[0].copy()
    cm.run([x + 1.0])
    np.testing.assert_array_equal(b[0], b0)  # each call returns its own copy, like get_tensor
    builtin = agent.runners.LiteRTRunner(str(conv_tflite), 1, runtime_options={"api": "compiled", "xnnpack": "off"})
    assert not builtin.fully_accelerated and builtin.delegate is None
    np.testing.assert_allclose(builtin.run([x])[0], a[0], rtol=1e-4, atol=1e-4)


@needs_litert
def test_litert_compiled_model_through_the_agent_measures_and_returns_outputs(agent, conv_tflite, tmp_path, capsys):
    """A request with api=compiled: raw timings and every eval output, the same as the Interpreter's."""
    xs = np.random.default_rng(4).standard_normal((5, 1, 16, 16, 3)).astype(np.float32).reshape(5, 16, 16, 3)
    np.savez(tmp_path / "eval.npz", x=xs)
    docs = {}
    for api in ("interpreter", "compiled"):
        req = {"protocol": 2, "variant": api, "model": str(conv_tflite), "runtime": "litert", "threads": 1,
               "warmup": 2, "runs": 10, "min_seconds": 0.0, "max_runs": 10,
               "inputs": [{"name": "x", "shape": [1, 16, 16, 3], "dtype": "float32"}],
               "outputs": [{"name": "Identity", "shape": [1, 16], "dtype": "float32"}],
               "eval": {"path": str(tmp_path / "eval.npz"), "x_keys": ["x"], "batch_size": 8},
               "outputs_path": str(tmp_path / f"{api}.npz"), "runtime_options": {"api": api}}
        (tmp_path / "req.json").write_text(json.dumps(req))
        assert agent.cli.main(["agent", str(tmp_path / "req.json")]) == 0
        docs[api] = json.loads(capsys.readouterr().out)
    for api, doc in docs.items():
        assert doc["ok"] and doc["runtime"]["options"] == {"api": api} and doc["runtime"]["delegate"] == "xnnpack"
        assert doc["latency_ms"]["runs"] == 10 and len(doc["latency_ms"]["raw"]) == 10
        assert all(t > 0 for t in doc["latency_ms"]["raw"]) and doc["eval"]["samples"] == 5
    a, b = np.load(tmp_path / "interpreter.npz")["output_0"], np.load(tmp_path / "compiled.npz")["output_0"]
    assert a.shape == (5, 16)
    np.testing.assert_array_equal(a, b)


@needs_litert
@pytest.mark.parametrize("opts, words", [
    ({"xnnpack": "maybe"}, ["xnnpack", "on", "off"]),
    ({"api": "gpu"}, ["api", "interpreter", "compiled"]),
    ({"num_threads": 2}, ["num_threads", "xnnpack", "api"]),
])
def test_litert_refuses_unknown_options(agent, conv_tflite, opts, words):
    with pytest.raises(agent.AgentFailure) as err:
        agent.runners.LiteRTRunner(str(conv_tflite), 1, runtime_options=opts)
    assert err.value.kind == "bad_request" and all(w in str(err.value) for w in words), str(err.value)


@needs_litert
def test_compiled_model_is_refused_on_tflite_runtime(agent, conv_tflite, monkeypatch):
    """A device with only tflite_runtime (the same Interpreter API, no CompiledModel) says so."""
    import sys
    import types

    from ai_edge_litert import interpreter as real

    shim = types.ModuleType("tflite_runtime")
    shim.__version__ = "2.14.0"
    shim_interp = types.ModuleType("tflite_runtime.interpreter")
    shim_interp.Interpreter, shim_interp.OpResolverType = real.Interpreter, real.OpResolverType
    shim.interpreter = shim_interp
    for mod in ("ai_edge_litert", "ai_edge_litert.interpreter"):
        monkeypatch.setitem(sys.modules, mod, None)
    monkeypatch.setitem(sys.modules, "tflite_runtime", shim)
    monkeypatch.setitem(sys.modules, "tflite_runtime.interpreter", shim_interp)
    with pytest.raises(agent.AgentFailure) as err:
        agent.runners.LiteRTRunner(str(conv_tflite), 1, runtime_options={"api": "compiled"})
    assert err.value.kind == "bad_request" and "CompiledModel" in str(err.value) and "tflite_runtime" in str(err.value)
    assert agent.runners.LiteRTRunner(str(conv_tflite), 1, runtime_options={"xnnpack": "off"}).delegated_nodes == 0


@needs_litert
def test_litert_compiled_model_runs_integer_io(agent, tmp_path):
    """A full-integer model with int8 I/O: float data quantized with the tensor's own parameters (the
    Interpreter's metadata, which CompiledModel's details lack), int8 back, the same as the Interpreter."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32)])
    def f(x):
        return tf.nn.relu(x * 2.0 + 1.0)

    conv = tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f)
    rng = np.random.default_rng(0)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([rng.uniform(-1, 1, (1, 4)).astype(np.float32)] for _ in range(50))
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type, conv.inference_output_type = tf.int8, tf.int8
    path = tmp_path / "relu8.tflite"
    path.write_bytes(conv.convert())
    x = np.array([[-0.9, -0.2, 0.3, 0.8]], np.float32)
    interp = agent.runners.LiteRTRunner(str(path), 1)
    cm = agent.runners.LiteRTRunner(str(path), 1, runtime_options={"api": "compiled"})
    a, b = interp.run([x])[0], cm.run([x])[0]
    assert b.dtype == np.int8 and cm.output_quantization(0) == interp.output_quantization(0)
    np.testing.assert_array_equal(a, b)
    scale, zp = cm.output_quantization(0)
    np.testing.assert_allclose((b.astype(np.float32) - zp) * scale, np.maximum(2 * x + 1, 0), atol=0.05)


@needs_litert
def test_a_graph_xnnpack_cannot_prepare_is_measured_without_it_and_the_report_says_so(agent, conv_tflite, tmp_path,
                                                                                      capsys, monkeypatch):
    """Fault injection on the real interpreter: XNNPACK refuses the graph at prepare (as it does for some
    INT8 face-detector stages). The agent measures the same file on LiteRT's own kernels, and its answer
    says so in the options (xnnpack=off: what ship/runtime.json tells the application) and a warning;
    asked for XNNPACK explicitly, it fails as before."""
    import ai_edge_litert.interpreter as li

    real, resolver = li.Interpreter, li.OpResolverType
    msg = "tensorflow/lite/core/subgraph.cc BytesRequired number of elements overflowed.\nNode number 3 " \
          "(TfLiteXNNPackDelegate) failed to prepare."

    class XnnpackRefuses(real):
        def __init__(self, *a, experimental_op_resolver_type=resolver.AUTO, **k):
            self.builtin_only = experimental_op_resolver_type == resolver.BUILTIN_WITHOUT_DEFAULT_DELEGATES
            super().__init__(*a, experimental_op_resolver_type=experimental_op_resolver_type, **k)

        def allocate_tensors(self):
            if not self.builtin_only:
                raise RuntimeError(msg)
            return super().allocate_tensors()

    x = np.random.default_rng(5).standard_normal((3, 16, 16, 3)).astype(np.float32)
    ref = np.concatenate([agent.runners.LiteRTRunner(str(conv_tflite), 1).run([x[i:i + 1]])[0] for i in range(3)])
    np.savez(tmp_path / "eval.npz", x=x)
    monkeypatch.setattr(li, "Interpreter", XnnpackRefuses)

    def run(options):
        req = {"protocol": 2, "variant": "v", "model": str(conv_tflite), "runtime": "litert", "threads": 1,
               "warmup": 1, "runs": 3, "min_seconds": 0.0, "max_runs": 3,
               "inputs": [{"name": "x", "shape": [1, 16, 16, 3], "dtype": "float32"}],
               "outputs": [{"name": "Identity", "shape": [1, 16], "dtype": "float32"}],
               "eval": {"path": str(tmp_path / "eval.npz"), "x_keys": ["x"]},
               "outputs_path": str(tmp_path / "out.npz"), "runtime_options": options}
        (tmp_path / "req.json").write_text(json.dumps(req))
        code = agent.cli.main(["agent", str(tmp_path / "req.json")])
        return code, json.loads(capsys.readouterr().out)

    code, doc = run(None)
    assert code == 0 and doc["ok"], doc
    assert doc["runtime"]["options"] == {"xnnpack": "off"} and doc["runtime"]["delegate"] is None
    assert any("XNNPACK failed to prepare" in w and "Node number 3" in w for w in doc["warnings"]), doc["warnings"]
    with np.load(tmp_path / "out.npz") as z:
        np.testing.assert_allclose(z["output_0"], ref, rtol=1e-4, atol=1e-4)
    code, doc = run({"xnnpack": "on"})  # asked for by name: never silently replaced
    assert code != 0 and doc["error"]["kind"] == "model_load_failed" and "failed to prepare" in doc["error"]["message"]
    # A/B blocks (the release gate's re-measurement) say it for each side too
    req = json.loads((tmp_path / "req.json").read_text())
    req.update(runtime_options=None, eval=None, outputs_path=None,
               ab={"model": str(conv_tflite), "blocks": 2, "block_seconds": 0.01, "min_runs": 2, "max_runs": 3})
    (tmp_path / "req.json").write_text(json.dumps(req))
    assert agent.cli.main(["agent", str(tmp_path / "req.json")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [w[:3] for w in doc["warnings"] if "XNNPACK failed to prepare" in w] == ["A: ", "B: "], doc["warnings"]
