"""The default deploy's short search on a model INT8 cannot serve (issue #24): when none of its full-INT8
candidates keeps the accuracy on the host, OpenVINO at the CPU's default precision (bf16/fp16 where the CPU has
it; no calibration) joins it, so such a model is not left with the fp32 files alone; where INT8 keeps the
accuracy the fallback is not built (the short search stays short)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("openvino", reason="the openvino extra is part of `all` (.ci/install.sh installs it)")
FAST = ("--runs", "10", "--min-seconds", "0", "--warmup", "2")


@pytest.fixture(autouse=True)
def _no_amx(monkeypatch):
    """On a CPU with native bf16 (AMX, AVX-512 BF16) openvino-auto is in the local short search from the start
    (candidates.quick_here); these tests are about the fallback, so the host reads as one without it."""
    from edgekit.variant_search import candidates

    monkeypatch.setattr(candidates, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_vnni"})


def _linear(path, outlier: bool, n: int = 256):
    """y = x @ W + b, 64 features -> 16 classes (1024 weights: TFLite's dynamic range quantizes no smaller
    tensor). With ``outlier`` the last feature is +-1000 and weighs nothing, and the one before weighs 1000 in
    every class and is always 0: a per-tensor INT8 scale for x (static INT8 here
    quantizes activations per tensor) rounds the 62 features that decide the class to a step of ~8, and an INT8
    scale per weight column (dynamic-range INT8 keeps activations in float) rounds their weights to 0, so top-1
    collapses; bf16 keeps every value to 0.4%."""
    rng = np.random.default_rng(3)
    w = rng.normal(0, 1, (64, 16)).astype(np.float32)
    w[63] = 0.0
    if outlier:
        w[62] = 1000.0
    b = np.zeros(16, np.float32)
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path / "m.onnx"))
    for name, seed in (("eval", 1), ("calib", 2)):
        x = np.random.default_rng(seed).normal(0, 1, (n, 64)).astype(np.float32)
        if outlier:
            x[:, 63] = np.random.default_rng(seed + 10).choice([-1000.0, 1000.0], n)
            x[:, 62] = 0.0
        np.savez(path / f"{name}.npz", x=x, y=(x @ w + b).argmax(1))


def _deploy(cli, d):
    r = cli("deploy", d / "m.onnx", "--target", "local", "--eval-data", d / "eval.npz", "--calib-data", d / "calib.npz",
            "--max-metric-drop", "3", "--out", d / "out", *FAST)
    assert r.exit_code in (0, 1), r.stdout + r.stderr
    rep = json.loads((d / "out" / "report.json").read_text())
    return rep, {c["name"]: c for c in rep["search"]["candidates"]}


def test_where_int8_misses_the_short_search_races_openvino_at_the_cpu_s_default_precision(cli, tmp_path):
    _linear(tmp_path, outlier=True)
    rep, cands = _deploy(cli, tmp_path)
    # the model is what the test says: every full-INT8 candidate misses (on the host, or its converter's parity)
    for name in ("ort-int8-qdq-u8s8", "ort-int8-dynamic", "tflite-int8", "tflite-dynamic"):
        assert cands[name]["status"] == "dropped" and cands[name]["dropped_at"] in ("host", "build"), cands[name]
    ov = cands["openvino-auto"]
    assert ov["status"] != "skipped" and ov.get("joined", "").startswith("no full-INT8 candidate kept"), ov
    # built, delivered and measured: screened on the device (and raced, or a finalist), at the fp32 accuracy
    assert ov["status"] in ("finalist", "selected") or ov["dropped_at"] in ("racing", "finals"), ov
    fp32 = next(v for v in rep["variants"] if v["name"] == "fp32")
    assert ov["screening"]["accuracy"] >= fp32["accuracy"]["value"] - 3, (ov["screening"], fp32["accuracy"])


def test_where_int8_keeps_the_accuracy_the_fallback_is_not_built(cli, tmp_path):
    _linear(tmp_path, outlier=False)
    rep, cands = _deploy(cli, tmp_path)
    # INT8 serves this one: kept the accuracy on the host (which decides the fallback); it may still lose the
    # race to a float file (CI, on a loaded host: every INT8 file dropped at racing behind tflite-fp32)
    kept = [n for n in ("tflite-int8", "tflite-dynamic", "ort-int8-qdq-u8s8")
            if cands[n]["status"] != "skipped" and cands[n]["dropped_at"] not in ("build", "host")]
    assert kept, {n: (c["status"], c["dropped_at"], c["reason"]) for n, c in cands.items()}
    assert cands["openvino-auto"]["status"] == "skipped" and "joined" not in cands["openvino-auto"], cands["openvino-auto"]


def test_a_dynamic_range_int8_file_that_keeps_the_accuracy_does_not_spare_the_fallback():
    """Found on PP-OCRv4's recognizer (VNNI/AMX host): static INT8 lost 40-100 points on the host, tflite-dynamic
    kept the accuracy (and ran 2.8x slower than tflite-fp32), and the float fallback was not built."""
    from edgekit.artifact import Artifact
    from edgekit.inputs.recipe import VariantSpec
    from edgekit.variant_search.choice import Candidate
    from edgekit.variant_search.run import full_int8_kept

    def cand(name, status="built", precision="int8"):
        c = Candidate(VariantSpec(name=name, passes=[]), status=status)
        c.artifact = Artifact.model_construct(precision=precision)
        return c

    static_lost = [cand("tflite-int8", "dropped"), cand("ort-int8-qdq-u8s8", "dropped"), cand("tflite-fp32", precision="fp32")]
    assert not full_int8_kept([*static_lost, cand("tflite-dynamic"), cand("ort-int8-dynamic")])
    assert full_int8_kept([*static_lost, cand("ort-int8-qdq-s8s8")])
    assert full_int8_kept([cand("tflite-int8"), cand("tflite-dynamic", "dropped")])
