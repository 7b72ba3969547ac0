"""build_variants: PyTorch-level passes first (from the .pt2), ONNX-level after the export; a wrong
order or a torch pass on an ONNX model is refused before any pass runs."""

from __future__ import annotations

import pytest

from edgekit.artifact import Artifact, IOSpec
from edgekit.errors import PassError
from edgekit.formats import Format
from edgekit.inputs.recipe import Recipe
from edgekit.inputs.source import Source
from edgekit.orchestration.steps import build_variants
from edgekit.passes import PassContext


def _art(tmp_path, name, fmt):
    f = tmp_path / name
    f.write_bytes(name.encode())
    return Artifact.from_file(f, fmt, IOSpec(inputs=(), outputs=()))


def test_torch_pass_after_an_onnx_pass_is_refused_before_anything_runs(tmp_path):
    rec = Recipe.model_validate({"variants": [
        {"name": "ok", "passes": ["quantize"]},
        {"name": "bad", "passes": ["quantize", {"distill": {}}]}]})
    fp32 = _art(tmp_path, "fp32.onnx", Format.ONNX)
    ran = []
    with pytest.raises(PassError, match="variant bad: pass 'distill' works on the PyTorch model and must come before"):
        build_variants(fp32, rec, PassContext(workdir=tmp_path), ran.append)
    assert ran == []  # nothing started (the 'ok' variant's quantize would have been announced)


def test_torch_pass_on_an_onnx_source_names_the_fix(tmp_path):
    rec = Recipe.model_validate({"variants": [{"name": "p", "passes": [{"prune_structured": {}}]}]})
    fp32 = _art(tmp_path, "fp32.onnx", Format.ONNX)
    src = Source(artifact=fp32, reference=lambda xs: None, reference_name="onnx (source)")
    with pytest.raises(PassError, match="the model is not a PyTorch program") as err:
        build_variants(fp32, rec, PassContext(workdir=tmp_path), lambda m: None, source=src)
    assert ".pt2" in err.value.hint and err.value.exit_code == 2


def test_deploy_train_data_without_labels_is_exit_2(cli, digits, tmp_path):
    r = cli("deploy", digits.pt2, "--target", "local", "--eval-data", digits.eval, "--train-data", digits.calib,
            "--out", tmp_path / "out")
    assert r.exit_code == 2 and "no labels" in r.stderr
