"""`edgekit quantize | prune | distill` end to end in-process, and their bad inputs (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
ARCH = f"{ROOT / 'examples' / 'digits' / 'model.py'}:DigitsCNN"
MODELS = Path(__file__).resolve().parent / "_compress_models.py"


@pytest.mark.slow  # the dynamo export plus the search: ~10-30 s here
def test_quantize_accuracy_aware_writes_onnx_and_reports(cli, digits, tmp_path):
    out = tmp_path / "q.onnx"
    r = cli("quantize", digits.pt2, "--calib-data", digits.calib, "--eval-data", digits.eval,
            "--max-accuracy-drop", "0.5", "--out", out, "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["pass"] == "quantize_accuracy_aware" and doc["metrics"]["accuracy_drop"] <= 0.5
    assert out.is_file() and doc["size_bytes"] == out.stat().st_size
    assert [s["name"] for s in doc["lineage"]][-2:] == ["torch->onnx", "quantize_accuracy_aware"]


def test_prune_then_distill_cli(cli, digits, tmp_path):
    pruned = tmp_path / "pruned.pt2"
    r = cli("prune", digits.pt2, "--arch", ARCH, "--sparsity", "0.5", "--train-data", digits.train,
            "--eval-data", digits.eval, "--epochs", "1", "--out", pruned)
    assert r.exit_code == 0, r.stderr
    assert "params" in r.stdout and pruned.is_file()
    out = tmp_path / "distilled.onnx"
    r = cli("distill", pruned, "--teacher", digits.pt2, "--train-data", digits.train, "--eval-data", digits.eval,
            "--epochs", "1", "--out", out, "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["pass"] == "distill" and out.is_file()
    # a file read back starts a new lineage (the recipe keeps the whole chain in one run)
    assert [s["name"] for s in doc["lineage"]] == ["torch.export", "distill", "torch->onnx"]


@pytest.mark.parametrize("drop", ["-1", "100.5"])
def test_quantize_tolerance_out_of_range(cli, digits, tmp_path, drop):
    r = cli("quantize", digits.pt2, "--calib-data", digits.calib, "--max-accuracy-drop", drop, "--out", tmp_path / "q.onnx")
    assert r.exit_code == 2 and "--max-accuracy-drop must be in [0, 100]" in r.stderr
    assert not (tmp_path / "q.onnx").exists()


def test_quantize_eval_without_labels(cli, digits, tmp_path):
    r = cli("quantize", digits.pt2, "--calib-data", digits.calib, "--eval-data", digits.calib, "--out", tmp_path / "q.onnx")
    assert r.exit_code == 2 and "no labels" in r.stderr


def test_quantize_inc_on_onnx_explains_the_numpy_conflict(cli, digits, tmp_path):
    onnx_model = tmp_path / "m.onnx"
    onnx_model.write_bytes(b"not read")
    r = cli("quantize", onnx_model, "--backend", "inc", "--calib-data", digits.calib, "--eval-data", digits.eval,
            "--out", tmp_path / "q.onnx")
    assert r.exit_code == 2 and "numpy<2" in r.stderr and "--backend ort" in r.stderr


@pytest.mark.parametrize("sparsity", ["0", "1", "1.5", "-0.1"])
def test_prune_sparsity_out_of_range(cli, digits, tmp_path, sparsity):
    r = cli("prune", digits.pt2, "--arch", ARCH, "--sparsity", sparsity, "--out", tmp_path / "p.pt2")
    assert r.exit_code == 2 and "--sparsity must be in (0, 1)" in r.stderr


def test_distill_student_output_shape_mismatch(cli, digits, tmp_path):
    r = cli("distill", "--student", f"{MODELS}:five_class_student", "--teacher", digits.pt2,
            "--train-data", digits.train, "--out", tmp_path / "s.pt2")
    assert r.exit_code == 2 and "does not match the teacher's" in r.stderr
    assert not (tmp_path / "s.pt2").exists()


def test_distill_train_data_without_labels(cli, digits, tmp_path):
    r = cli("distill", "--student", f"{MODELS}:small_student", "--teacher", digits.pt2,
            "--train-data", digits.calib, "--out", tmp_path / "s.pt2")
    assert r.exit_code == 2 and "no labels" in r.stderr


def test_help_has_examples(cli):
    for cmd in ("quantize", "prune", "distill"):
        r = cli(cmd, "--help")
        assert r.exit_code == 0 and "Examples:" in r.stdout


@pytest.mark.slow
def test_quantize_inc_backend_meets_the_tolerance(cli, digits, tmp_path):
    """Real Intel Neural Compressor (PT2E) on digits meets 0.5 points and writes a QDQ ONNX model
    (its refusal is tested with the outlier model in test_pass_quantize_accuracy_aware.py)."""
    out = tmp_path / "inc.onnx"
    r = cli("quantize", digits.pt2, "--backend", "inc", "--calib-data", digits.calib, "--eval-data", digits.eval,
            "--max-accuracy-drop", "0.5", "--out", out, "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["pass"] == "quantize_inc" and doc["metrics"]["accuracy_drop"] <= 0.5 and out.is_file()
    assert any(n.op_type == "QuantizeLinear" for n in __import__("onnx").load(str(out)).graph.node)


def test_prune_to_onnx_without_any_data_is_refused_before_work(cli, digits, tmp_path):
    r = cli("prune", digits.pt2, "--unstructured", "--sparsity", "0.5", "--out", tmp_path / "p.onnx")
    assert r.exit_code == 2 and "no data was given" in r.stderr and not (tmp_path / "p.onnx").exists()
