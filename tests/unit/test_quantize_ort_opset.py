"""Per-channel INT8 of an older-opset ONNX model (PP-OCR's classifier is opset 11): onnxruntime's quantizer
writes a per-axis DequantizeLinear, which ONNX has only from opset 13, and the file then fails to load. The
pass upgrades such a model to opset 13 first, and no written file is one onnxruntime refuses."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper


def _opset11_conv(path):
    """x -> Conv (no bias) -> Add(bias) -> Relu -> Conv -> y, opset 11: the Conv+Add that onnxruntime's
    pre-processing fuses (its ConvAddFusion bias is where the bad DequantizeLinear appeared)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.1, (1, 8, 1, 1)).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.normal(0, 0.3, (4, 8, 3, 3)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "b2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c1", "b1"], ["a1"], name="add1"),
             helper.make_node("Relu", ["a1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


@pytest.fixture
def old_model(tmp_path):
    _opset11_conv(tmp_path / "m.onnx")
    x = np.random.default_rng(1).normal(0, 1, (16, 3, 16, 16)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=x)
    return tmp_path


def test_per_channel_int8_of_an_opset_11_model_loads_in_onnxruntime(cli, old_model):
    r = cli("quantize", old_model / "m.onnx", "--calib-data", old_model / "calib.npz", "--per-channel",
            "--out", old_model / "q.onnx", "--json")
    assert r.exit_code == 0, r.stdout + r.stderr
    step = [s for s in json.loads(r.stdout)["lineage"] if s.get("kind") == "pass"][-1]
    assert step["metrics"]["opset_upgraded"]["from"] == 11 and step["metrics"]["opset_upgraded"]["to"] == 13
    q = onnx.load(str(old_model / "q.onnx"))
    assert any(n.op_type == "DequantizeLinear" and any(a.name == "axis" for a in n.attribute) for n in q.graph.node), \
        "no per-axis DequantizeLinear: the weights were not quantized per channel"
    sess = ort.InferenceSession(str(old_model / "q.onnx"), providers=["CPUExecutionProvider"])
    x = np.load(old_model / "calib.npz")["x"][:1]
    ref = ort.InferenceSession(str(old_model / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = sess.run(None, {"x": x})[0]
    assert np.abs(got - ref).max() < 0.1 * np.abs(ref).max(), "the INT8 file does not compute what the model does"


def test_a_file_onnxruntime_cannot_load_is_an_error_and_nothing_is_written(cli, old_model, monkeypatch):
    # without the upgrade onnxruntime's quantizer writes the opset-11 per-axis DequantizeLinear it then refuses
    from edgekit.passes import quantize_ort

    monkeypatch.setattr(quantize_ort, "_per_axis_opset", lambda src, up, metrics: src)
    monkeypatch.setenv("EDGEKIT_NO_CACHE", "1")  # the other test's good file must not be reused
    (old_model / "q.onnx").write_bytes(b"the user's earlier file")
    r = cli("quantize", old_model / "m.onnx", "--calib-data", old_model / "calib.npz", "--per-channel",
            "--out", old_model / "q.onnx")
    assert r.exit_code == 2, r.stdout + r.stderr
    assert "onnxruntime cannot load" in r.stderr and "DequantizeLinear" in r.stderr, r.stderr
    assert (old_model / "q.onnx").read_bytes() == b"the user's earlier file"
    assert not [p.name for p in old_model.iterdir() if p.name.startswith(".")], "partial files left behind"
