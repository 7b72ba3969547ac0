"""INT4 language-model files that never skip or degrade silently (issue #37, item 2), on tiny models trained
here (tests/lm_zoo.py), with the real onnxruntime quantizer and kernels: every layer's fate in the account
(a width the group does not divide named, with what was done instead), each layer's output error measured,
a planted outlier layer that makes plain int4 miss the tolerance recovered by the ladder keeping exactly that
layer at int8, and the account in report.json and report.md. ExecuTorch's 8da4w: test_llm_executorch.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from lm_zoo import build_tiny_lm, eval_text, planted_outlier_lm

from edgekit.errors import ConversionError
from edgekit.llm.candidates import CANDIDATES
from edgekit.llm.int4_ladder import Calibration
from edgekit.llm.layer_plan import fake_quant, layer_errors, plan_int4
from edgekit.llm.options import LMOptions
from edgekit.llm.source import load_lm
from edgekit.llm.text import load_eval_text
from edgekit.orchestration.generate import deploy_lm

BUILD = {c.name: c.build for c in CANDIDATES}
NARROW = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj")  # input width = hidden = 48


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> Path:
    return eval_text(tmp_path_factory.mktemp("text"))


def _windows(src, text: Path, n: int = 4) -> np.ndarray:
    return load_eval_text(text, src.tokenizer, window=48, max_windows=n).windows


def test_int4_rounding_is_the_schemes_own():
    w = torch.tensor([[0.7, -0.1, 0.16, 0.0, 0.35, 0.2]])
    q = fake_quant(w, "int4", 4)  # groups [0.7 -0.1 0.16 0] (scale 0.1) and [0.35 0.2 pad pad] (scale 0.05)
    assert torch.allclose(q, torch.tensor([[0.7, -0.1, 0.2, 0.0, 0.35, 0.2]]), atol=1e-6), q
    q8 = fake_quant(w, "int8", None)  # one scale a row: 0.7/127
    assert torch.allclose(q8, torch.round(w / (0.7 / 127)) * (0.7 / 127))


def test_a_width_the_group_does_not_divide_is_named_never_skipped():
    src = load_lm(build_tiny_lm("llama", hidden=48))
    et = {c.name: c for c in plan_int4(src.model, group=32, pads=False)}
    ort = {c.name: c for c in plan_int4(src.model, group=32, pads=True, int8_group=32)}
    narrow = [n for n in et if n.split(".")[-1] in NARROW]
    assert len(narrow) == 2 * len(NARROW)  # two layers
    for n in narrow:
        assert et[n].scheme == "int8" and "input width 48 is not a multiple of the group 32" in et[n].reason
        assert ort[n].scheme == "int4" and "zero-padded to 64" in ort[n].reason
    downs = [n for n in et if n.endswith("down_proj")]  # input 96 = 3 groups of 32
    assert downs and all(et[n].scheme == "int4" and et[n].reason is None for n in downs)
    assert et["lm_head"].scheme == "int8" and "explicit choice" in et["lm_head"].reason
    assert et["model.embed_tokens"].scheme == "float" and et["model.embed_tokens"].kind == "embedding"
    assert plan_int4(src.model, group=32, head="float")[-1].scheme == "float"


def test_the_onnx_int4_file_holds_what_its_account_says(text, tmp_path):
    src = load_lm(build_tiny_lm("llama", hidden=48))
    cal = Calibration(windows=_windows(src, text), max_kld=0.05)
    built = {"ort-fp32": BUILD["ort-fp32"](src, tmp_path, 96, {}, cal)}
    art = BUILD["ort-int4"](src, tmp_path, 96, built, cal)
    m = art.lineage[-1].metrics
    acc = m["quantization"]
    assert art.precision == "int4" and acc["headline"] == "int4 g32"
    # the file itself: 14 MatMulNBits at 4 bits, the output layer at 8, nothing left in float
    assert (m["int4_matmuls"], m["int8_matmuls"], m["float_matmuls_left"]) == (14, 1, [])
    assert set(acc["padded"]) == {f"model.layers.{i}.{k}" for i in (0, 1) for k in
                                  ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                   "mlp.gate_proj", "mlp.up_proj")}
    errors = {row["name"]: row["output_rel_error"] for row in acc["layers"] if "output_rel_error" in row}
    assert len(errors) == 15 and all(0 < e < 0.5 for e in errors.values()), errors
    assert errors["lm_head"] < min(e for n, e in errors.items() if n != "lm_head")  # int8 beside int4
    assert acc["ladder"] == [{"int8_layers": [], "host_kld": acc["ladder"][0]["host_kld"], "within": True}]
    assert art.size_bytes < 0.75 * built["ort-fp32"].size_bytes  # the float embedding and graph dominate here


def test_a_planted_outlier_misses_at_int4_and_the_ladder_keeps_that_layer_at_int8(text, tmp_path):
    folder = planted_outlier_lm(build_tiny_lm("llama"), tmp_path / "po", layer=0, scale=64.0)
    src = load_lm(folder)
    windows = _windows(src, text)
    plain = plan_int4(src.model, group=32)
    at4 = layer_errors(src.model, windows[:2], plain)
    worst = max(at4, key=at4.get)
    assert worst == "model.layers.0.mlp.down_proj", at4  # the measured sensitivity finds the planted layer
    cal = Calibration(windows=windows, max_kld=0.05)
    art = BUILD["ort-int4"](src, tmp_path, 96, {"ort-fp32": BUILD["ort-fp32"](src, tmp_path, 96, {}, cal)}, cal)
    acc = art.lineage[-1].metrics["quantization"]
    first, second = acc["ladder"]
    assert not first["within"] and first["host_kld"] > 0.05 and first["int8_layers"] == []
    assert second["within"] and second["int8_layers"] == ["model.layers.0.mlp.down_proj"]
    assert "recovery ladder: sensitivity rank 1" in acc["not_headline"]["model.layers.0.mlp.down_proj"]
    assert art.lineage[-1].metrics["int8_matmuls"] == 2  # the kept layer and the output layer
    # a tolerance no int4 file can meet: every rung is named and the variant is dropped, not shipped
    with pytest.raises(ConversionError) as e:
        BUILD["ort-int4"](src, tmp_path / "tight", 96, {"ort-fp32": BUILD["ort-fp32"](src, tmp_path, 96, {}, cal)},
                          Calibration(windows=windows, max_kld=1e-7))
    assert "misses the KLD tolerance" in e.value.message and "1 at int8: KLD" in e.value.message


def test_the_account_reaches_the_report(text, tmp_path):
    folder = build_tiny_lm("llama", hidden=48)
    out = tmp_path / "o"
    report = deploy_lm(folder, eval_text=text, out=out, options=LMOptions(
        context=96, window=48, max_windows=6, candidates=("ort-fp32", "ort-int4"), runs=15, warmup=2,
        min_seconds=0.1, head="float", threads=1))
    v = report.variant("ort-int4")
    assert v is not None and v.precision == "int4" and 0 < v.quality.kld_mean < 0.05, report.decision
    doc = json.loads((out / "report.json").read_text())
    acc = next(s["metrics"]["quantization"] for s in doc["variants"][1]["lineage"] if "quantization" in s["metrics"])
    assert acc["not_headline"]["lm_head"].startswith("float: the output layer at float")
    md = (out / "report.md").read_text()
    assert "## Quantization accounts" in md and "`model.layers.1.mlp.up_proj`: input width 48" in md
    assert "host check, layers kept at int8: none" in md


def test_gpt2s_conv1d_layers_are_quantized_not_skipped(text, tmp_path):
    """GPT-2's family computes its projections with transformers' Conv1D, which no exporter or quantizer treats as
    a linear layer: before the fix every "int8" ONNX file of such a model held 0 quantized MatMuls and raced as
    int8. The source turns each Conv1D into the nn.Linear it is (same function), and a quantization pass that
    finds nothing to quantize is an error, never a silently float "int8" file."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from edgekit.llm.export_onnx import quantize_onnx_int8

    torch.manual_seed(0)
    folder = tmp_path / "gpt2"
    model = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=384, n_positions=128)).eval()
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(build_tiny_lm("llama"), local_files_only=True).save_pretrained(folder)
    src = load_lm(folder)
    assert not any(type(m).__name__ == "Conv1D" for m in src.model.modules())
    ids = torch.randint(0, 384, (1, 24))
    with torch.no_grad():
        assert torch.equal(src.model(ids).logits, model(ids).logits)  # the same function
    cal = Calibration(windows=_windows(src, text), max_kld=0.05)
    base = BUILD["ort-fp32"](src, tmp_path, 96, {}, cal)
    q = quantize_onnx_int8(base, tmp_path / "q.onnx")
    # c_attn, attn c_proj, c_fc, mlp c_proj in each of 2 blocks; the output layer shares the embedding's weight
    # (tied), not a constant of its MatMul: it stays float and is named
    assert q.lineage[-1].metrics["quantized_matmuls"] == 4 * 2
    assert q.lineage[-1].metrics["float_matmuls_left"] == ["lm_head"]
    with pytest.raises(ConversionError, match="no MatMul with a constant weight"):
        quantize_onnx_int8(q, tmp_path / "again.onnx")  # nothing left to quantize: an error, not a copy


def test_the_ladder_picks_its_rung_on_the_host_and_lowers_once(text, tmp_path, monkeypatch):
    """Issue #45 item 3: each rung is checked on the PyTorch model with its weights rounded as the file stores them;
    only the chosen rung is lowered, once. Another gate setting that picks the same rung restores it from the build
    cache, named in the lineage."""
    from edgekit.llm import candidates

    monkeypatch.setenv("EDGEKIT_HOME", str(tmp_path / "home"))
    lowered: list[set] = []
    real = candidates.quantize_onnx_nbits
    monkeypatch.setattr(candidates, "quantize_onnx_nbits", lambda *a, **k: lowered.append(k["int8"]) or real(*a, **k))
    src = load_lm(planted_outlier_lm(build_tiny_lm("llama"), tmp_path / "po", layer=0, scale=64.0))
    windows = _windows(src, text)
    base = {"ort-fp32": BUILD["ort-fp32"](src, tmp_path, 96, {}, Calibration(windows=windows, max_kld=0.05))}
    art = BUILD["ort-int4"](src, tmp_path, 96, base, Calibration(windows=windows, max_kld=0.05))
    acc = art.lineage[-1].metrics["quantization"]
    first, second = acc["ladder"]  # the plain rung misses on the host model: never lowered
    assert not first["within"] and second["within"] and second["int8_layers"] == ["model.layers.0.mlp.down_proj"]
    assert lowered == [{"model.layers.0.mlp.down_proj", "lm_head"}], lowered
    assert acc["lowered"]["times"] == 1 and acc["lowered"]["rungs"][0]["int8_layers"] == 1
    assert acc["lowered"]["rungs"][0]["host_kld"] <= 0.05 and "fake_quant" in acc["lowered"]["picked_on"]
    again = BUILD["ort-int4"](src, tmp_path / "again", 96, base, Calibration(windows=windows, max_kld=0.04))
    assert len(lowered) == 1 and again.sha256 == art.sha256
    assert again.lineage[-1].metrics["cache"].startswith("cache hit ")
    assert again.lineage[-1].metrics["quantization"]["host_check"].endswith("own logits")
