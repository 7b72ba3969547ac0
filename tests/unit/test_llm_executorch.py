"""ExecuTorch as a language-model runtime (issue #36): a static-KV-cache .pte (fp32 and ExecuTorch's own int8
weight-only) exported from transformers' recipe, proven against PyTorch at build, raced on the device
beside onnxruntime, its quality from the device's own log-probabilities. CI runs it in .ci/executorch.sh."""

from __future__ import annotations

import importlib.util

import pytest
from lm_zoo import build_tiny_lm, eval_text

from edgekit.llm.options import LMOptions
from edgekit.orchestration.generate import deploy_lm

pytestmark = [pytest.mark.executorch,
              pytest.mark.skipif(importlib.util.find_spec("executorch") is None,
                                 reason="executorch is not installed (pip install 'edgekit[executorch]'; CI: "
                                        "bash .ci/executorch.sh)")]


ORT_ET = ("ort-fp32", "ort-int8", "ort-int4", "et-fp32", "et-8da8w", "et-8da4w", "et-int8")


def test_executorch_and_onnxruntime_race_on_the_device(tmp_path):
    folder = build_tiny_lm("qwen2")  # the other family: tied embeddings, q/k/v biases
    text = eval_text(tmp_path / "t")
    report = deploy_lm(folder, eval_text=text, out=tmp_path / "o",
                       options=LMOptions(context=64, window=32, max_windows=6, runs=20, warmup=3, min_seconds=0.1,
                                         candidates=ORT_ET, threads=1))
    names = {v.name for v in report.variants}
    assert names == set(ORT_ET), report.decision
    et32, et8, dyn = report.variant("et-fp32"), report.variant("et-int8"), report.variant("et-8da8w")
    assert et32.runtime.name == "executorch" and et32.quality.kld_mean < 1e-6
    for v in (et8, dyn):
        assert 0 < v.quality.kld_mean < 0.05 and v.size_bytes < 0.75 * et32.size_bytes, v.name
    # per-token activation quantization: decoding through the cache computes exactly the full forward
    assert dyn.lineage[-1].metrics["cache_parity"]["cache_max_abs_err"] <= 1e-4
    # the static cache's size is the host's figure from the config (the runtime does not tell)
    assert et32.generation.kv_cache_source.startswith("config") and et32.generation.kv_cache_mb > 0
    for v in (et32, et8, dyn):
        par = v.lineage[-1].metrics["cache_parity"]
        assert par["cache_max_abs_err"] <= par["tolerance"], par
    # 8da4w: int4 in groups of 32 where the width allows (all of it at width 64), the output layer at int8
    q4 = report.variant("et-8da4w")
    acc = q4.lineage[-1].metrics["quantization"]
    assert q4.precision == "int4" and 0 < q4.quality.kld_mean < 0.05 and q4.size_bytes < dyn.size_bytes
    assert acc["headline"] == "int4 g32" and set(acc["not_headline"]) == {"model.embed_tokens", "lm_head"}
    assert acc["ladder"][0]["within"] and acc["activations"] == "int8 per token, dynamic"
    assert report.decision.ship in names and report.gate.passed
    assert set(report.decision.lost) == names - {report.decision.ship}


def test_8da4w_keeps_a_width_the_group_does_not_divide_at_int8_and_names_it(tmp_path):
    """torchao's group-wise int4 needs whole groups: at width 48 and groups of 32 the attention and MLP inputs
    are int8 per channel in the file, each named with why; down_proj (input 96) is int4; the file is proven."""
    from edgekit.llm.candidates import CANDIDATES
    from edgekit.llm.int4_ladder import Calibration
    from edgekit.llm.source import load_lm
    from edgekit.llm.text import load_eval_text

    src = load_lm(build_tiny_lm("llama", hidden=48))
    windows = load_eval_text(eval_text(tmp_path / "t"), src.tokenizer, window=48, max_windows=2).windows
    build = {c.name: c.build for c in CANDIDATES}["et-8da4w"]
    art = build(src, tmp_path, 96, {}, Calibration(windows=windows, max_kld=0.05))
    acc = art.lineage[-1].metrics["quantization"]
    narrow = {n: why for n, why in acc["not_headline"].items() if n.split(".")[-1].endswith("_proj")}
    assert len(narrow) == 12 and all("int8 per channel: input width 48 is not a multiple of the group 32" in w
                                     for w in narrow.values()), narrow
    assert acc["counts"]["int4 g32"] == 2 and not any("down_proj" in n for n in narrow)


def test_8da4w_recovers_a_planted_outlier_by_keeping_that_layer_at_8da8w(tmp_path):
    """The recovery ladder on ExecuTorch: plain 8da4w misses the KLD tolerance on the host because of one planted
    outlier layer; the first rung keeps exactly that layer (the most sensitive by its measured int4 error) at
    int8 and the rebuilt .pte is inside the tolerance."""
    from lm_zoo import planted_outlier_lm

    from edgekit.llm.candidates import CANDIDATES
    from edgekit.llm.int4_ladder import Calibration
    from edgekit.llm.source import load_lm
    from edgekit.llm.text import load_eval_text

    src = load_lm(planted_outlier_lm(build_tiny_lm("llama"), tmp_path / "po", layer=0, scale=64.0))
    windows = load_eval_text(eval_text(tmp_path / "t"), src.tokenizer, window=48, max_windows=2).windows
    build = {c.name: c.build for c in CANDIDATES}["et-8da4w"]
    art = build(src, tmp_path, 96, {}, Calibration(windows=windows, max_kld=0.05))
    ladder = art.lineage[-1].metrics["quantization"]["ladder"]
    assert [r["within"] for r in ladder] == [False, True], ladder
    assert ladder[1]["int8_layers"] == ["model.layers.0.mlp.down_proj"] and ladder[0]["host_kld"] > 0.05
