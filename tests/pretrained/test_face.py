"""A multi-output detector nobody here wrote: MTCNN's ONet, the last stage of facenet-pytorch's face cascade
(the package's state dict and its own class, exported to model.pt2 as a user would), three outputs (box
offsets, five landmarks, the face/not-face softmax), scored on real photos (scikit-image's LFW subset, faces
vs non-face patches, labelled by the dataset: not agreement with fp32), as a user types the commands from
another working folder with relative paths.

Issue #25 found every INT8 variant of this cascade losing 5-12 points; full-integer TFLite lost all parity
(landmarks cosine 0.17): onnx2tf pads the ceil-mode MaxPools with float32's lowest value, which entered the
calibrated range. With the pools fed an edge-padded input (onnx2tf_prepare.edge_padded_max_pools) the INT8
file keeps parity and the accuracy."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests import pretrained

pytestmark = pytest.mark.slow
FAST = ("--runs", "10", "--min-seconds", "0", "--warmup", "2")


@pytest.fixture(scope="module")
def face(tmp_path_factory):
    where = tmp_path_factory.mktemp("face")
    pretrained.prepared("face", where)
    return where


@pytest.fixture
def in_face(face, monkeypatch):
    monkeypatch.chdir(face)  # the user's working folder: every path below is relative to it
    return face


def _eval():
    with np.load("face/eval.npz") as ev:
        return ev["x"], ev["y"]


def _face_top1(probs: np.ndarray, y: np.ndarray) -> float:
    return 100.0 * float(np.mean(np.argmax(probs, axis=1) == y))


def test_full_int8_tflite_converts_as_typed_and_keeps_the_accuracy(cli, in_face):
    r = cli("convert", "face/model.pt2", "--to", "tflite", "--precision", "int8", "--calib-data", "face/calib.npz",
            "--eval-data", "face/eval.npz", "--out", "out/onet_int8.tflite", "--json")
    assert r.exit_code == 0, r.stdout + r.stderr
    hop = [s for s in json.loads(r.stdout)["lineage"] if s["name"] == "onnx->tflite"][-1]
    assert hop["metrics"]["parity_violations"] == [] and hop["metrics"]["max_pools_edge_padded"], hop["metrics"]
    # all three outputs within parity, each matched to its own source output (shapes 4, 10, 2)
    outs = hop["metrics"]["parity_outputs"]
    assert len(outs) == 3 and all(o["cosine"] >= 0.98 for o in outs.values()), outs
    # argmax agreement is held on the face/not-face softmax only: the box offsets and landmarks are regressions
    # (their "argmax" read 0.906 and 0.922 here, one flip from the bar, and crossed it on another CPU)
    assert [o["top1_held"] for o in outs.values()] == [False, False, True], outs
    assert list(outs.values())[2]["top1_agreement"] >= 0.9, outs
    # the file, run by LiteRT as the agent runs it, still tells faces from the rest on the photos
    import ai_edge_litert.interpreter as litert

    x, y = _eval()
    it = litert.Interpreter(model_path=str(in_face / "out" / "onet_int8.tflite"))
    inp = it.get_input_details()[0]
    it.resize_tensor_input(inp["index"], [1, 48, 48, 3])
    it.allocate_tensors()
    probs = []
    for i in range(len(x)):
        it.set_tensor(inp["index"], np.transpose(x[i:i + 1], (0, 2, 3, 1)).astype(np.float32))
        it.invoke()
        outs2 = [it.get_tensor(o["index"]) for o in it.get_output_details()]
        probs.append(next(o for o in outs2 if o.shape[-1] == 2)[0])
    assert _face_top1(np.array(probs), y) >= pretrained.MODELS["face"].fp32_floor - 1.0


def test_the_default_deploy_races_int8_and_the_shipped_file_scores_the_report_from_ship_alone(cli, in_face):
    m = pretrained.MODELS["face"]
    r = cli("deploy", "face/model.pt2", "--target", "local", "--eval-data", "face/eval.npz", "--calib-data",
            "face/calib.npz", "--metric", m.metric, *m.deploy_args, "--out", "out-deploy", *FAST)
    assert r.exit_code in (0, 1), r.stdout + r.stderr
    rep = json.loads((in_face / "out-deploy" / "report.json").read_text())
    fp32 = next(v for v in rep["variants"] if v["name"] == "fp32")
    assert fp32["accuracy"]["outputs"] == ["output_2"] and fp32["accuracy"]["value"] >= m.fp32_floor, fp32["accuracy"]
    cands = {c["name"]: c for c in rep["search"]["candidates"]}
    # full-integer TFLite builds now (it was dropped at build with cosine 0.17 on the landmarks)
    t8 = cands["tflite-int8"]
    assert not (t8["status"] == "dropped" and t8["dropped_at"] == "build"), t8
    for c in cands.values():
        if c["status"] == "dropped":
            assert c.get("reason"), c
    # every INT8 file measured kept the accuracy (the host check and the gate say so; nothing silently lost)
    for v in rep["variants"]:
        if v["precision"] == "int8" and v["accuracy"] is not None:
            assert fp32["accuracy"]["value"] - v["accuracy"]["value"] <= 1.0 + 1e-9, (v["name"], v["accuracy"])
    ship = rep["decision"]["ship"]
    assert ship is not None, rep["decision"]
    shipped = next(v for v in rep["variants"] if v["name"] == ship)
    face = json.loads((in_face / "out-deploy" / "ship" / "ship.json").read_text())["interface"]
    assert [o["source_name"] for o in face["outputs"]] == ["output_0", "output_1", "output_2"]
    from edgekit.metrics import get_metric
    from edgekit.orchestration.run_shipped import run_shipped

    x, y = _eval()
    ys = run_shipped(in_face / "out-deploy" / "ship", {face["inputs"][0]["source_name"]: x})
    assert [ys[f"output_{i}"].shape[1] for i in range(3)] == [4, 10, 2]
    rescored = get_metric("top1").evaluate([ys["output_2"]], y).value
    assert rescored == pytest.approx(shipped["accuracy"]["value"], abs=1e-6), (ship, rescored, shipped["accuracy"])
