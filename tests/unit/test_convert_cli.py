"""`edgekit convert`: bad input exits 2 with the cause and the fix, and leaves nothing at --out."""

import json

import numpy as np
import pytest


def test_int8_without_calibration_is_refused(cli, digits, tmp_path):
    out = tmp_path / "m.tflite"
    r = cli("convert", digits.pt2, "--to", "tflite", "--precision", "int8", "--eval-data", digits.eval, "--out", out)
    assert r.exit_code == 2 and "calibration set" in r.stderr and "--calib-data" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_calibration_with_the_wrong_shape_is_refused(cli, digits, tmp_path):
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((10, 1, 6, 6), np.float32))
    out = tmp_path / "m.tflite"
    r = cli("convert", digits.pt2, "--to", "tflite", "--precision", "int8", "--calib-data", bad, "--out", out)
    assert r.exit_code == 2 and "(1, 6, 6)" in r.stderr and "(1, 8, 8)" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.npz"]


@pytest.mark.parametrize("args, needle", [
    (["--to", "coreml", "--io", "int8"], "TFLite options"),
    (["--to", "onnx", "--precision", "int8"], "fp32 model"),
    (["--to", "tflite", "--precision", "fp16", "--io", "int8"], "io: int8 needs precision: int8"),
    (["--to", "tflite", "--out", "model.onnx"], "written as .tflite"),
    (["--to", "tflite", "--input-shape", "x=1,2"], "NAME:D0,D1"),
    (["--to", "jpeg"], "jpeg"),
])
def test_bad_options_exit_2(cli, digits, tmp_path, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    r = cli("convert", digits.pt2, "--calib-data", digits.calib, *args)
    assert r.exit_code == 2 and needle in (r.stderr + r.stdout)
    assert list(tmp_path.iterdir()) == []


def test_unconvertible_onnx_fails_naming_op_and_node(cli, tmp_path):
    """LpPool runs on ONNX Runtime but onnx2tf has no converter for it: refused before converting."""
    pytest.importorskip("onnx2tf")
    import onnx
    from onnx import TensorProto, helper

    from edgekit.convert.opcheck import onnx2tf_supported_ops

    assert "LpPool" not in onnx2tf_supported_ops(), "pick another op onnx2tf lacks for this test"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 2, 2])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["a"], name="relu0"),
                           helper.make_node("LpPool", ["a"], ["y"], name="pool.lp", kernel_shape=[2, 2],
                                            strides=[2, 2], p=2)], "g", [x], [y])
    m = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), m)
    data = tmp_path / "d.npz"
    np.savez(data, x=np.random.default_rng(0).standard_normal((4, 2, 4, 4)).astype(np.float32))
    out = tmp_path / "m.tflite"
    r = cli("convert", m, "--to", "tflite", "--calib-data", data, "--out", out)
    assert r.exit_code == 2 and "LpPool at 'pool.lp'" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.npz", "m.onnx"]


def test_dynamic_onnx_is_sized_by_the_data_or_by_input_shape(cli, tmp_path):
    """A dynamic-axis ONNX model converts to (static) TFLite at the data's shapes, recorded as such;
    without data it needs --input-shape, and says so."""
    pytest.importorskip("onnx2tf")
    import torch
    from torch import nn

    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(4, 5)).eval()
    onnx_path = tmp_path / "dyn.onnx"
    torch.onnx.export(m, (torch.randn(1, 3, 16, 16),), str(onnx_path), dynamo=False, input_names=["input"],
                      output_names=["y"], dynamic_axes={"input": {0: "N", 2: "H", 3: "W"}}, opset_version=17)
    out = tmp_path / "dyn.tflite"
    r = cli("convert", onnx_path, "--to", "tflite", "--out", out)
    assert r.exit_code == 2 and "dynamic sizes" in r.stderr and "--input-shape input:" in r.stderr
    assert not out.exists()
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(0).standard_normal((8, 3, 24, 20)).astype(np.float32))
    r = cli("convert", onnx_path, "--to", "tflite", "--calib-data", calib, "--out", out, "--json")
    assert r.exit_code == 0, r.stderr
    hop = [s for s in json.loads(r.stdout)["lineage"] if s["name"] == "onnx->tflite"][-1]
    assert hop["config"]["input_shapes"] == {"input": [1, 3, 24, 20]} and hop["config"]["input_shapes_from"] == "data"
    out.unlink()
    r = cli("convert", onnx_path, "--to", "tflite", "--calib-data", calib, "--out", out,
            "--input-shape", "input:1,3,16,16")
    assert r.exit_code == 2 and "does not match the data's samples (3, 24, 20)" in r.stderr and not out.exists()
    np.savez(calib, x=np.random.default_rng(0).standard_normal((8, 3, 16, 16)).astype(np.float32))
    r = cli("convert", onnx_path, "--to", "tflite", "--calib-data", calib, "--out", out,
            "--input-shape", "input:1,3,16,16")
    assert r.exit_code == 0, r.stderr
    assert out.is_file() and "onnx->tflite" in r.stdout and "OK" in r.stdout
