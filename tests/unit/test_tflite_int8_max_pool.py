"""Full-integer INT8 of a model with padded MaxPools (issue #25: every INT8 variant of a face-detector cascade
lost its accuracy). onnx2tf pads a MaxPool's input with float32's lowest value, and that value entered the
calibrated range of the padded tensor: MTCNN's ONet (ceil-mode pools) lost all parity. edgekit now feeds such
pools an edge-padded input (``onnx2tf_prepare.edge_padded_max_pools``), which changes no maximum."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgekit.convert.onnx2tf_prepare import edge_padded_max_pools

ort = pytest.importorskip("onnxruntime")


def _pool_model(shape, opset=17, **attrs):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = onnx.ValueInfoProto(name="y")  # no type: shape inference fills it
    node = helper.make_node("MaxPool", ["x"], ["y"], name="pool", **attrs)
    m = helper.make_model(helper.make_graph([node], "g", [x], [y]), opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m, strict_mode=True)


def _run(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("shape,attrs", [
    ((2, 3, 46, 46), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),  # MTCNN ONet's first pool
    ((1, 4, 11, 9), dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),  # odd sizes, both axes padded
    ((1, 2, 12, 13), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),  # ResNet's stem pool
    ((1, 2, 9, 10), dict(kernel_shape=[3, 2], strides=[2, 3], pads=[1, 0, 1, 1], ceil_mode=1)),
    ((1, 3, 17), dict(kernel_shape=[4], strides=[3], pads=[1, 1], ceil_mode=1)),  # 1-D
], ids=["onet", "odd", "resnet-stem", "mixed", "1d"])
def test_the_edge_padded_pool_computes_what_the_model_computes(shape, attrs, opset=17):
    model = _pool_model(shape, opset=opset, **attrs)
    new, changed = edge_padded_max_pools(model)
    assert new is not None and changed == ["pool"]
    ops = [n.op_type for n in new.graph.node]
    assert ops == ["Pad", "MaxPool"]
    pool = new.graph.node[1]
    assert {a.name for a in pool.attribute} <= {"kernel_shape", "strides"}  # no pads, no ceil_mode of its own
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 3 - 5).astype(np.float32)  # mostly negative: padding with 0 would show
    np.testing.assert_array_equal(_run(new, x), _run(model, x))


def test_opset_10_pad_takes_its_pads_as_an_attribute():
    model = _pool_model((1, 2, 12, 12), opset=10, kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    new, _ = edge_padded_max_pools(model)
    x = np.random.default_rng(1).standard_normal((1, 2, 12, 12)).astype(np.float32) - 4
    np.testing.assert_array_equal(_run(new, x), _run(model, x))


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[2, 2], strides=[2, 2]),  # no padding at all
    dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1, dilations=[2, 2]),  # a dilated window may skip the edge
    # a ceil-mode window that would start in the end pad: onnxruntime drops it (as PyTorch does), ONNX's shape
    # inference counts it; the model's sizes are ambiguous, so it is left to onnx2tf and parity
    dict(kernel_shape=[3, 3], strides=[3, 3], pads=[2, 2, 2, 2], ceil_mode=1),
], ids=["unpadded", "dilated", "window-in-the-pad"])
def test_pools_edge_padding_cannot_serve_are_left_as_they_are(attrs):
    assert edge_padded_max_pools(_pool_model((1, 2, 7, 7), **attrs)) == (None, [])


def _pool_net(d, kind):
    """mtcnn: Conv -> PReLU -> MaxPool(3, 2, ceil_mode) -> Conv -> PReLU -> Linear (MTCNN's pattern, small);
    resnet: Conv(7, 2, 3) -> BatchNorm -> ReLU -> MaxPool(3, 2, 1) -> Conv -> Linear (ResNet's stem)."""
    import torch

    torch.manual_seed(0)
    nn = torch.nn
    if kind == "mtcnn":
        net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.PReLU(8), nn.MaxPool2d(3, 2, ceil_mode=True), nn.Conv2d(8, 8, 3),
                            nn.PReLU(8), nn.Flatten(), nn.Linear(8 * 9 * 9, 4))
    else:
        net = nn.Sequential(nn.Conv2d(3, 8, 7, 2, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                            nn.Conv2d(8, 8, 3), nn.Flatten(), nn.Linear(8 * 4 * 4, 4))
    net.eval()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 3, 24, 24)).astype(np.float32)
    np.savez(d / "calib.npz", x=x[:64])
    np.savez(d / "eval.npz", x=x[64:], y=np.zeros(32, np.int64))
    ep = torch.export.export(net, (torch.from_numpy(x[:1]),))
    torch.export.save(ep, d / "m.pt2")


# onnx2tf's own padding once, on the commoner stem (ResNet's: cosine 0.04 here), to show what the fix is for
@pytest.mark.parametrize("kind,rewrite", [("mtcnn", True), ("resnet", True), ("resnet", False)],
                         ids=["mtcnn", "resnet", "resnet-onnx2tf-padding"])
def test_full_int8_keeps_parity_through_a_padded_pool(cli, tmp_path, monkeypatch, rewrite, kind):
    pytest.importorskip("onnx2tf", reason="the tflite extra (onnx2tf) is part of the default install")
    _pool_net(tmp_path, kind)
    if not rewrite:  # what edgekit did before: onnx2tf's own padding
        monkeypatch.setattr("edgekit.convert.onnx_to_tflite.edge_padded_max_pools", lambda m: (None, []))
        monkeypatch.setenv("EDGEKIT_NO_CACHE", "1")
    r = cli("convert", tmp_path / "m.pt2", "--to", "tflite", "--precision", "int8", "--calib-data",
            tmp_path / "calib.npz", "--eval-data", tmp_path / "eval.npz", "--out", tmp_path / "m.tflite", "--json")
    if not rewrite:
        assert r.exit_code == 2 and "no route converted the model" in r.stderr, r.stdout + r.stderr
        assert not (tmp_path / "m.tflite").exists()
        return
    assert r.exit_code == 0, r.stdout + r.stderr
    hop = [s for s in json.loads(r.stdout)["lineage"] if s["name"] == "onnx->tflite"][-1]
    assert hop["metrics"]["parity_violations"] == [] and hop["metrics"]["max_pools_edge_padded"], hop["metrics"]
    out = next(iter(hop["metrics"]["parity_outputs"].values()))
    assert out["cosine"] >= 0.99, out
