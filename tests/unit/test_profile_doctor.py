"""`edgekit profile` (a model as it is, incl. a .tflite in its own layout) and `edgekit doctor`."""

import json

import numpy as np

from edgekit.report.model import Report


def test_profile_onnx_and_tflite(cli, digits, tmp_path):
    import edgekit

    rep = edgekit.profile(digits.pt2, eval_data=digits.eval, out=tmp_path / "a", runs=10, min_seconds=0, warmup=1)
    assert [v.name for v in rep.variants] == ["model"] and rep.variant("model").format == "onnx"
    # a TFLite file built from the exported ONNX, profiled with NHWC data as the .tflite takes it
    from edgekit.inputs.data import load_npz
    from edgekit.inputs.source import load_onnx
    from edgekit.passes.base import PassContext
    from edgekit.passes.registry import get_pass

    onnx_art = load_onnx(__import__("pathlib").Path(rep.variant("model").artifact_path)).artifact
    ctx = PassContext(workdir=tmp_path / "w", eval=load_npz(digits.eval))
    tfl = get_pass("convert")(onnx_art, {"to": "tflite", "precision": "fp32"}, ctx)
    d = np.load(digits.eval)
    nhwc = tmp_path / "eval_nhwc.npz"
    np.savez(nhwc, x=d["x"].transpose(0, 2, 3, 1), y=d["y"])
    r = cli("profile", tfl.path, "--eval-data", nhwc, "--out", tmp_path / "b", "--runs", "10", "--min-seconds", "0")
    assert r.exit_code == 0, r.stderr
    v = Report.load(tmp_path / "b" / "report.json").variant("model")
    assert v.format == "tflite" and v.runtime.name == "litert" and v.accuracy.value > 90
    # NCHW data for an NHWC .tflite is refused with the shapes named
    r = cli("profile", tfl.path, "--eval-data", digits.eval, "--out", tmp_path / "c")
    assert r.exit_code == 2 and "(8, 8, 1)" in r.stderr


def test_doctor_json(cli):
    r = cli("doctor", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] and doc["local_agent"]["ok"] and "onnxruntime" in doc["local_agent"]["runtimes"]
    assert "local" in doc["targets"] and not doc["target_errors"]
    assert {p["package"] for p in doc["packages"]} >= {"torch", "onnxruntime", "paramiko"}
