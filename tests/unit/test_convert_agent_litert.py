"""The agent's LiteRT runner with a real .tflite: int8 I/O quantize/dequantize from the scale and
zero point the host sends, the tflite_runtime fallback, and a clear error without any interpreter."""

import sys
import types

import numpy as np
import pytest

pytest.importorskip("ai_edge_litert")
tf = pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def int8_model(tmp_path_factory):
    """y = relu(2x + 1) over 4 values, full-integer INT8 with int8 inputs and outputs."""

    @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32)])
    def f(x):
        return tf.nn.relu(x * 2.0 + 1.0)

    conv = tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f)
    rng = np.random.default_rng(0)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([rng.uniform(-1, 1, (1, 4)).astype(np.float32)] for _ in range(50))
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = tf.int8
    conv.inference_output_type = tf.int8
    path = tmp_path_factory.mktemp("litert") / "relu.tflite"
    path.write_bytes(conv.convert())
    return path


@pytest.fixture
def agent():
    from edgekit.convert.tflite.host_harness import _agent

    return _agent()


def _specs(agent, path):
    r = agent.runners.LiteRTRunner(str(path), 1)
    (i,), (o,) = r.inputs, r.outputs
    ins = {"name": i["name"], "shape": [1, 4], "dtype": "int8", "scale": float(i["quantization"][0]),
           "zero_point": int(i["quantization"][1])}
    outs = {"name": o["name"], "shape": [1, 4], "dtype": "int8", "scale": float(o["quantization"][0]),
            "zero_point": int(o["quantization"][1])}
    return ins, outs


def test_int8_io_round_trip_with_host_specs(agent, int8_model):
    ins, outs = _specs(agent, int8_model)
    runner = agent.runners.LiteRTRunner(str(int8_model), 2, input_specs=[ins])
    assert runner.threads == 2 and runner.version.startswith("ai_edge_litert")
    x = np.array([[-0.9, -0.2, 0.3, 0.8]], np.float32)
    feed = agent.tensors.prepare(x, ins)
    assert feed.dtype == np.int8
    raw = runner.run([feed])[0]
    assert raw.dtype == np.int8
    y = agent.tensors.restore_output(raw, outs)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, np.maximum(2 * x + 1, 0), atol=3 * outs["scale"] + 2 * ins["scale"])


def test_float_data_for_int8_input_uses_the_tensors_own_scale(agent, int8_model):
    runner = agent.runners.LiteRTRunner(str(int8_model), 1)
    x = np.array([[0.1, 0.2, 0.3, 0.4]], np.float32)
    raw = runner.run([x])[0]  # no host spec: the runner quantizes with the tensor's parameters
    scale, zp = runner.output_quantization(0)
    np.testing.assert_allclose((raw.astype(np.float32) - zp) * scale, 2 * x + 1, atol=0.05)


def test_falls_back_to_tflite_runtime(agent, int8_model, monkeypatch):
    from ai_edge_litert.interpreter import Interpreter

    # a device with only tflite_runtime installed: same interpreter API under the other package name
    shim = types.ModuleType("tflite_runtime")
    shim.__version__ = "2.14.0"
    shim_interp = types.ModuleType("tflite_runtime.interpreter")
    shim_interp.Interpreter = Interpreter
    monkeypatch.setitem(sys.modules, "ai_edge_litert", None)
    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", None)
    monkeypatch.setitem(sys.modules, "tflite_runtime", shim)
    monkeypatch.setitem(sys.modules, "tflite_runtime.interpreter", shim_interp)
    runner = agent.runners.LiteRTRunner(str(int8_model), 1)
    assert runner.module == "tflite_runtime" and runner.version == "tflite_runtime 2.14.0"
    assert runner.run([np.zeros((1, 4), np.int8)])[0].shape == (1, 4)


def test_no_interpreter_is_a_clear_runtime_error(agent, int8_model, monkeypatch):
    for mod in ("ai_edge_litert", "ai_edge_litert.interpreter", "tflite_runtime", "tflite_runtime.interpreter"):
        monkeypatch.setitem(sys.modules, mod, None)
    with pytest.raises(agent.AgentFailure) as ei:
        agent.runners.LiteRTRunner(str(int8_model), 1)
    assert ei.value.kind == "runtime_missing" and "pip install ai-edge-litert" in ei.value.message
