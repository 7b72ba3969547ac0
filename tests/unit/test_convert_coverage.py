"""`edgekit convert` covers what onnx2tf covers: no data for static shapes (synthetic parity inputs),
any fixed batch size, relative paths from any working directory, every output's parity, and a
clean exit 2 (never a traceback) for a broken file."""

import json

import numpy as np
import pytest

from edgekit.convert.parity import compare_outputs, parity_metrics
from edgekit.inputs.source import run_batched


# --- fast, no TensorFlow -------------------------------------------------------------------
def test_run_batched_feeds_exactly_the_static_batch_and_trims_the_padding():
    seen = []

    def model(feed):  # a batch-2 model: anything else is refused, like onnxruntime does
        seen.append(len(feed[0]))
        assert len(feed[0]) == 2
        return [feed[0] * 2, feed[0].sum(axis=1)]

    x = np.arange(10, dtype=np.float32).reshape(5, 2)
    y, s = run_batched(model, [x], 2)
    assert seen == [2, 2, 2] and y.shape == (5, 2) and s.shape == (5,)
    np.testing.assert_array_equal(y, x * 2)
    np.testing.assert_array_equal(s, x.sum(axis=1))
    seen.clear()
    (y,) = run_batched(lambda f: (seen.append(len(f[0])), [f[0]])[1], [x], None, chunk=3)  # dynamic batch
    assert seen == [3, 2] and y.shape == (5, 2)


def test_compare_outputs_judges_every_output_and_integers_exactly():
    ref_logits = np.array([[1.0, 2.0], [3.0, 0.5]], np.float32)
    ref_idx = np.array([1, 0], np.int64)
    res = compare_outputs([ref_logits, ref_idx], [ref_logits + 1e-6, np.array([1.0, 1.0], np.float32)], "onnx",
                          ["logits", "idx"])
    assert list(res) == ["logits", "idx"]
    assert res["logits"].exact_agreement is None and res["idx"].exact_agreement == 0.5
    m = parity_metrics(res, "fp32")
    assert m["parity"]["max_abs_err"] < 1e-5  # the first output, as before
    assert set(m["parity_outputs"]) == {"logits", "idx"}
    assert m["parity_violations"] == ["idx: exact agreement 0.500 < 0.99 (integer output)"]
    # one output: no name prefix; NaN where the reference has NaN is agreement, elsewhere it is not
    nan = np.array([[np.nan, 1.0]])
    assert parity_metrics(compare_outputs([nan], [nan.copy()], "r", ["y"]), "fp32")["parity_violations"] == []
    bad = parity_metrics(compare_outputs([nan], [np.array([[0.0, np.nan]])], "r", ["y"]), "fp32")
    assert bad["parity_violations"] and not bad["parity_violations"][0].startswith("y:")


def test_garbage_onnx_exits_2_with_a_message(cli, tmp_path):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x08\x07 this is not a protobuf \xff\xfe" * 20)
    r = cli("convert", bad, "--to", "tflite", "--out", tmp_path / "o.tflite")
    assert r.exit_code == 2, r
    assert "broken.onnx" in r.stderr and "ONNX" in r.stderr and "Traceback" not in r.stderr + r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.onnx"]


def test_dynamic_onnx_without_data_asks_for_input_shape(cli, tmp_path):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("img", TensorProto.FLOAT, ["N", 3, "H", "W"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, "H", "W"])
    m = tmp_path / "dyn.onnx"
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Relu", ["img"], ["y"])], "g", [x], [y]),
                                opset_imports=[helper.make_opsetid("", 17)]), m)
    r = cli("convert", m, "--to", "tflite", "--out", tmp_path / "o.tflite")
    assert r.exit_code == 2 and "--input-shape" in r.stderr and "img" in r.stderr, r.stderr
    assert not (tmp_path / "o.tflite").exists()


# --- real conversions (onnx2tf / TensorFlow / LiteRT) ----------------------------------------
def _onnx(tmp_path, module, example, name="m.onnx", **kw):
    import torch

    path = tmp_path / name
    torch.onnx.export(module.eval(), example, str(path), dynamo=False, opset_version=17, **kw)
    return path


def test_static_pt2_converts_without_data(cli, digits, tmp_path):
    pytest.importorskip("onnx2tf")
    out = tmp_path / "m.tflite"
    r = cli("convert", digits.pt2, "--to", "tflite", "--out", out, "--json")
    assert r.exit_code == 0, r.stderr
    assert "synthetic" in r.stderr and "--eval-data" in r.stderr  # the warning: real data checks more
    art = json.loads(r.stdout)
    steps = [s for s in art["lineage"] if s["kind"] == "convert"]
    assert [s["name"] for s in steps] == ["torch->onnx", "onnx->tflite"]
    for s in steps:
        assert s["metrics"]["parity_inputs"] == "synthetic" and s["metrics"]["parity_violations"] == []
        assert s["metrics"]["parity"]["max_abs_err"] < 1e-3 and s["metrics"]["parity"]["n"] >= 8
    assert out.is_file()


def test_fixed_batch_2_onnx_converts_with_5_samples(cli, tmp_path):
    pytest.importorskip("onnx2tf")
    import torch
    from torch import nn

    from edgekit.inputs.source import load_onnx

    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    path = _onnx(tmp_path, m, (torch.randn(2, 3, 6, 6),), input_names=["x"], output_names=["y"])
    x = np.random.default_rng(1).standard_normal((5, 3, 6, 6)).astype(np.float32)
    ref = load_onnx(path).reference_all([x])  # batch-2 model, 5 samples: chunks of 2, the last one padded
    with torch.no_grad():
        np.testing.assert_allclose(ref[0], m(torch.from_numpy(x)).numpy(), atol=1e-5)
    data = tmp_path / "e.npz"
    np.savez(data, x=x)
    out = tmp_path / "m.tflite"
    r = cli("convert", path, "--to", "tflite", "--eval-data", data, "--out", out, "--json")
    assert r.exit_code == 0, r.stderr
    m_ = json.loads(r.stdout)["lineage"][-1]["metrics"]
    assert m_["parity_inputs"] == "data" and m_["parity"]["n"] == 5 and m_["parity_violations"] == []
    assert "warning" not in r.stderr


def test_relative_paths_from_another_working_directory(cli, tmp_path, monkeypatch):
    pytest.importorskip("onnx2tf")
    import torch
    from torch import nn

    (tmp_path / "models").mkdir()
    (tmp_path / "data").mkdir()
    _onnx(tmp_path / "models", nn.Sequential(nn.Linear(6, 4), nn.Tanh()), (torch.randn(1, 6),), "m.onnx",
          input_names=["x"], output_names=["y"])
    np.savez(tmp_path / "data" / "e.npz", x=np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32))
    monkeypatch.chdir(tmp_path)
    r = cli("convert", "models/m.onnx", "--to", "tflite", "--eval-data", "data/e.npz", "--out", "out/m.tflite")
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "out" / "m.tflite").is_file()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["m.tflite"]  # no work folder left behind


class _TwoHeads(__import__("torch").nn.Module):
    def __init__(self):
        import torch

        super().__init__()
        self.body = torch.nn.Linear(8, 6)
        self.cls = torch.nn.Linear(6, 3)

    def forward(self, x):
        h = self.body(x).relu()
        logits = self.cls(h)
        return logits, h * 2.0, logits.argmax(dim=1)


def test_multi_output_parity_per_output_in_the_lineage(cli, tmp_path):
    pytest.importorskip("onnx2tf")
    import torch

    torch.manual_seed(0)
    path = _onnx(tmp_path, _TwoHeads(), (torch.randn(1, 8),), input_names=["x"],
                 output_names=["logits", "feat", "cls"])
    from edgekit.inputs.source import load_onnx

    src = load_onnx(path)
    outs = src.reference_all([np.zeros((3, 8), np.float32)])
    assert [o.dtype.name for o in outs] == ["float32", "float32", "int64"] and outs[2].shape == (3,)
    assert src.reference([np.zeros((3, 8), np.float32)]).shape == (3, 3)  # still the first output
    data = tmp_path / "e.npz"
    np.savez(data, x=np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32))
    r = cli("convert", path, "--to", "tflite", "--eval-data", data, "--out", tmp_path / "m.tflite", "--json")
    assert r.exit_code == 0, r.stderr
    m = json.loads(r.stdout)["lineage"][-1]["metrics"]
    assert list(m["parity_outputs"]) == ["logits", "feat", "cls"]
    assert m["parity_outputs"]["cls"]["exact_agreement"] == 1.0
    assert m["parity_outputs"]["feat"]["max_abs_err"] < 1e-4 and m["parity"] == m["parity_outputs"]["logits"]
    assert m["parity_violations"] == []


def test_inputs_without_a_common_batch_axis_run_whole(cli, tmp_path):
    """A 2x3 @ 3x4 product: the arrays share no sample count, and the model takes them whole."""
    pytest.importorskip("onnx2tf")
    import onnx
    from onnx import TensorProto, helper

    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    m = tmp_path / "mm.onnx"
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "g", [a, b], [y]),
                                opset_imports=[helper.make_opsetid("", 17)]), m)
    rng = np.random.default_rng(0)
    data = tmp_path / "e.npz"
    np.savez(data, a=rng.standard_normal((2, 3)).astype(np.float32), b=rng.standard_normal((3, 4)).astype(np.float32))
    for extra in (["--eval-data", data], []):  # with the model's own inputs, and with synthetic ones
        r = cli("convert", m, "--to", "tflite", *extra, "--out", tmp_path / "mm.tflite", "--json")
        assert r.exit_code == 0, r.stderr
        met = json.loads(r.stdout)["lineage"][-1]["metrics"]
        assert met["parity_violations"] == [] and met["parity"]["max_abs_err"] < 1e-4


def test_a_litert_crash_is_a_conversion_error_not_a_dead_edgekit(tmp_path, monkeypatch):
    """A LiteRT kernel that aborts (seen: 'free(): double free' on a full-integer detector) is probed in a
    child process: edgekit survives, and the error names the crash."""
    from edgekit.convert.tflite import host_harness as o2t
    from edgekit.errors import ConversionError

    f = tmp_path / "m.tflite"
    f.write_bytes(b"not a flatbuffer")
    monkeypatch.setattr(o2t, "_PROBE", "import os, sys; sys.stderr.write('free(): double free detected\\n'); os.abort()")
    with pytest.raises(ConversionError, match=r"crashes .*signal 6.*double free"):
        o2t.probe_litert(f)
    monkeypatch.setattr(o2t, "_PROBE", "print('ok')")
    g = tmp_path / "n.tflite"
    g.write_bytes(b"x")
    o2t.probe_litert(g)  # a clean child run passes
