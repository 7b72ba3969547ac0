"""A compression recipe through `edgekit deploy` on the local device (real agent, real
onnxruntime): prune -> distill -> accuracy-aware INT8, every variant measured and in the report
with its lineage; a re-run with nothing changed takes every pass from the cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from edgekit.report.model import Report

ROOT = Path(__file__).resolve().parents[2]
ARCH = f"{ROOT / 'examples' / 'digits' / 'model.py'}:DigitsCNN"


@pytest.mark.slow
def test_compress_recipe_deploys_every_variant_and_reruns_from_cache(cli, digits, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path / "home"))  # a cold pass cache
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "baseline": "fp32",
        "train_data": str(digits.train),
        "variants": [
            {"name": "int8-aa", "passes": [{"quantize_accuracy_aware": {"max_accuracy_drop": 0.5}}]},
            {"name": "pruned-distilled", "passes": [{"prune_structured": {"sparsity": 0.5, "finetune_epochs": 2}},
                                                    {"distill": {"epochs": 4}}]},
            {"name": "pruned-distilled-int8", "passes": [
                {"prune_structured": {"sparsity": 0.5, "finetune_epochs": 2}}, {"distill": {"epochs": 4}},
                {"quantize_accuracy_aware": {"max_accuracy_drop": 0.5}}]},
        ],
        "measure": {"warmup": 2, "runs": 20, "min_seconds": 0.1},
        "gate": {"max_accuracy_drop": 3.0},
    }))
    args = ["deploy", digits.pt2, "--arch", ARCH, "--target", "local", "--eval-data", digits.eval,
            "--calib-data", digits.calib, "--recipe", recipe]
    r = cli(*args, "--out", tmp_path / "out1")
    assert r.exit_code == 0, r.stderr
    rep = Report.load(tmp_path / "out1" / "report.json")
    by = {v.name: v for v in rep.variants}
    assert list(by) == ["fp32", "int8-aa", "pruned-distilled", "pruned-distilled-int8"]
    assert by["int8-aa"].accuracy_drop <= 0.5
    names = [s["name"] for s in by["pruned-distilled-int8"].lineage]
    assert names == ["torch.export", "prune_structured", "distill", "torch->onnx", "quantize_accuracy_aware"]
    pruned = by["pruned-distilled"]
    assert pruned.format == "onnx" and pruned.size_bytes < by["fp32"].size_bytes * 0.5
    assert pruned.speedup_vs_baseline is not None and pruned.speedup_vs_baseline > 0
    first = rep.settings["passes"]["cache"]
    assert first["misses"] >= 6  # every pass and export computed

    r = cli(*args, "--out", tmp_path / "out2")
    assert r.exit_code == 0, r.stderr
    rep2 = Report.load(tmp_path / "out2" / "report.json")
    again = rep2.settings["passes"]["cache"]
    assert again["misses"] == 0 and again["hits"] == first["misses"] + first["hits"]
    # same models, bit for bit
    assert {v.name: v.sha256 for v in rep2.variants} == {v.name: v.sha256 for v in rep.variants}
    assert all(s.get("metrics", {}).get("cache", {}).get("hit") for s in rep2.variants[2].lineage[1:])
