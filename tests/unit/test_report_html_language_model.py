"""A language model's HTML report (edgekit/report/html_language_model.py): the race on the device as a table
(decode tok/s with its CI, TTFT, perplexity, KLD, top-1, greedy divergence) in place of the fixed-graph
variants table, and each low-bit file's quantization account with the layers or tensors not at its scheme named
with why (the same figures report.md shows). Built from the report models, no deploy."""

from __future__ import annotations

from edgekit.inputs.recipe import GateConfig
from edgekit.llm.export_gguf import summarize
from edgekit.llm.layer_plan import LayerChoice, account
from edgekit.report.gate import evaluate_gate
from edgekit.report.html import render_html
from edgekit.report.markdown import render_markdown
from edgekit.report.model import Report, VariantResult
from tests.unit.html_tree import parse


def _lm_variant(name: str, fmt: str, precision: str, *, tok_s: float, ci: list[float], kld: float, ppl: float,
                lineage: list[dict], divergence: list[int | None]) -> VariantResult:
    return VariantResult(
        name=name, format=fmt, precision=precision, size_bytes=529_500,
        runtime={"name": "onnxruntime" if fmt == "onnx" else "llama.cpp", "version": "1.32.0", "threads": 1},
        sha256=(name.encode().hex() * 64)[:64], lineage=lineage,
        generation={"context": 96, "ttft_cold_ms": 0.734, "ttft_ms": 0.145,
                    "prefill": [{"tokens": 6, "tokens_per_s": 41389.0}, {"tokens": 48, "tokens_per_s": 130258.0}],
                    "decode_tokens_per_s": tok_s, "decode_tokens_per_s_ci95": ci,
                    "inter_token_ms": {"p50": 0.105, "p95": 0.157}, "decode_filled": {"tokens_per_s": 8960.5},
                    "peak_rss_mb": 65.8, "kv_cache_mb": 0.03, "kv_cache_source": "runtime"},
        quality={"positions": 270, "windows": 6, "top_k": 64, "perplexity": ppl, "perplexity_float": 21.13,
                 "perplexity_increase": ppl / 21.13 - 1, "kld_mean": kld, "kld_ci95": [kld * 0.85, kld * 1.16],
                 "top1_agreement": 0.957,
                 "greedy": {"prompts": len(divergence), "new_tokens": 32, "first_divergence": divergence,
                            "identical": sum(d is None for d in divergence)}},
    )


def _int4_lineage() -> list[dict]:
    plan = [LayerChoice("model.embed_tokens", "embedding", (384, 48), "float", None,
                        "the embedding stays float: a row gather per token, not a matmul"),
            LayerChoice("model.layers.0.self_attn.q_proj", "linear", (48, 48), "int4", 32,
                        "input width 48 is not a multiple of the group 32: the last group is zero-padded to 64"),
            LayerChoice("model.layers.0.mlp.up_proj", "linear", (96, 48), "int4", 32, None),
            LayerChoice("model.layers.0.mlp.gate_proj", "linear", (96, 48), "int4", 32, None),
            LayerChoice("model.layers.0.mlp.down_proj", "linear", (48, 96), "int8", None,
                        "recovery ladder: sensitivity rank 1 (output error 0.21)"),
            LayerChoice("lm_head", "output", (384, 48), "float", None,
                        "the output layer at float: an explicit choice (head=float)")]
    acc = account(plan, {"model.layers.0.mlp.down_proj": 0.21})
    acc["ladder"] = [{"int8_layers": [], "host_kld": 0.0312, "within": False},
                     {"int8_layers": ["model.layers.0.mlp.down_proj"], "host_kld": 0.0067, "within": True}]
    return [{"kind": "source", "name": "transformers", "config": {"path": "tiny-llama"}},
            {"kind": "convert", "name": "torch->onnx (kv cache)", "config": {"opset": 18}, "seconds": 3.2},
            {"kind": "pass", "name": "quantize int4", "config": {"group": 32, "head": "float"}, "seconds": 1.1,
             "metrics": {"int4_matmuls": 3, "int8_matmuls": 1, "quantization": acc}}]


def _gguf_lineage() -> list[dict]:
    tensors = [{"name": "token_embd.weight", "shape": [384, 64], "row_width": 64, "requested": "Q4_0",
                "actual": "Q4_0", "kind": "requested", "reason": None},
               {"name": "blk.0.attn_norm.weight", "shape": [64], "row_width": 64, "requested": "Q4_0",
                "actual": "F32", "kind": "float_1d", "reason": "1-D tensor (a norm or bias): stays F32"},
               {"name": "blk.0.ffn_down.weight", "shape": [64, 96], "row_width": 96, "requested": "Q4_0",
                "actual": "Q8_0", "kind": "block",
                "reason": "its row width 96 is not a multiple of Q4_0's block size 64: llama-quantize fell back to "
                          "Q8_0"},
               {"name": "output.weight", "shape": [384, 64], "row_width": 64, "requested": "Q4_0", "actual": "Q8_0",
                "kind": "rule", "reason": "the Q4_0 rules want Q6_K for it; its row width 64 is not a multiple of "
                                          "Q6_K's block size 256: llama-quantize fell back to Q8_0"}]
    return [{"kind": "source", "name": "transformers", "config": {"path": "tiny-llama"}},
            {"kind": "convert", "name": "hf->gguf", "config": {"file_type": "F16"}, "seconds": 2.0},
            {"kind": "pass", "name": "quantize (llama.cpp Q4_0)", "config": {"file_type": "Q4_0", "imatrix": None},
             "seconds": 0.4, "metrics": {"quantization": summarize(tensors), "notes": [], "tensors": tensors}}]


def _lm_report() -> Report:
    proof = {"tokens": 48, "prefix": 24, "prefill_max_abs_err": 3.81e-6, "cache_max_abs_err": 2.86e-6,
             "cache_vs_pytorch_max_abs_err": 3.81e-6, "logit_scale": 8.02, "tolerance": 8.12e-3,
             "prefill_cosine": 1.0, "top1_agreement": 1.0}
    base = [{"kind": "source", "name": "transformers", "config": {"path": "tiny-llama"}},
            {"kind": "convert", "name": "torch->onnx (kv cache)", "config": {"opset": 18}, "seconds": 3.2,
             "metrics": {"cache_parity": proof}}]
    vs = [_lm_variant("ort-fp32", "onnx", "fp32", tok_s=8856.3, ci=[8722.1, 8992.3], kld=1.7e-12, ppl=21.13,
                      lineage=base, divergence=[None, None, None, None]),
          _lm_variant("ort-int4", "onnx", "int4", tok_s=8784.0, ci=[8677.6, 8883.9], kld=0.00671, ppl=21.76,
                      lineage=_int4_lineage(), divergence=[9, 16, None, 2]),
          _lm_variant("gguf-q4_0", "gguf", "Q4_0", tok_s=9120.4, ci=[9001.2, 9240.8], kld=0.0123, ppl=22.3,
                      lineage=_gguf_lineage(), divergence=[5, None, 7, 3])]
    return Report(edgekit_version="0.1.0", created_at="2026-12-06T00:00:00+00:00", target="local",
                  device={"name": "localhost", "arch": "x86_64", "cores": 2, "transport": "local"},
                  model={"source": "tiny-llama", "task": "text-generation", "architecture": "LlamaForCausalLM",
                         "sha256": "c" * 64},
                  baseline="ort-fp32", variants=vs, gate=evaluate_gate(vs, "ort-fp32", GateConfig()))


def test_the_race_table_holds_every_variants_generation_and_quality():
    html = render_html(_lm_report())
    assert "<table id=variants" not in html  # the fixed-graph table (all n/a for a language model) gives way
    race = next(parse(html).iter("table", id="lm-race"))
    rows = [[c.text() for c in row] for row in race.rows()]
    head = rows[0]
    for col in ("variant", "TTFT ms (cold)", "decode tok/s (95% CI)", "perplexity (float)", "KLD (95% CI)",
                "top-1 agree", "greedy: first divergence"):
        assert col in head, col
    cell = {r[0].split(" ")[0]: dict(zip(head, r)) for r in rows[1:]}
    assert list(cell) == ["ort-fp32", "ort-int4", "gguf-q4_0"]
    int4 = cell["ort-int4"]
    assert int4["decode tok/s (95% CI)"] == "8784.0 (8677.6–8883.9)"
    assert int4["TTFT ms (cold)"] == "0.145 (0.734)" and int4["perplexity (float)"] == "21.76 (21.13)"
    assert int4["KLD (95% CI)"] == "0.00671 (0.0057–0.0078)" and int4["top-1 agree"] == "95.7%"
    assert int4["greedy: first divergence"] == "token 9, token 16, same, token 2 (of 32)"
    assert "(baseline)" in cell["ort-fp32"]["variant"]
    for r in rows[1:]:
        assert not any(x in "".join(r) for x in ("{'", '{"', "[None", "None"))  # no raw dicts or lists


def test_the_quantization_accounts_name_the_fallback_layers_and_tensors():
    html = render_html(_lm_report())
    section = html[html.index("<h2 id=quantization-accounts>"):html.index("<h2 id=gate>")]
    tree = parse(section)
    layers, tensors = list(tree.iter("table", cls="quant-account"))
    by_layer = {r[0].text(): [c.text() for c in r[1:]] for r in layers.rows()[1:]}
    assert by_layer["lm_head"][0] == "float" and "explicit choice (head=float)" in by_layer["lm_head"][2]
    assert by_layer["model.layers.0.mlp.down_proj"][0] == "int8 per channel"
    assert "recovery ladder: sensitivity rank 1" in by_layer["model.layers.0.mlp.down_proj"][2]
    assert by_layer["model.layers.0.self_attn.q_proj"][1] == "last group padded"
    assert "model.layers.0.mlp.up_proj" not in by_layer  # at the headline scheme: nothing to say
    ladder = [[c.text() for c in r] for r in next(tree.iter("table", cls="quant-ladder")).rows()[1:]]
    assert ladder == [["none", "0.0312", "over"], ["model.layers.0.mlp.down_proj", "0.0067", "within"]]
    by_tensor = {r[0].text(): [c.text() for c in r[1:]] for r in tensors.rows()[1:]}
    assert set(by_tensor) == {"blk.0.ffn_down.weight", "output.weight"}  # requested and 1-D tensors: not listed
    assert by_tensor["output.weight"][0] == "Q8_0" and "want Q6_K" in by_tensor["output.weight"][1]
    assert "gguf-q4_0" in section and "tensors (asked Q4_0)" in section and "1 1-D tensors" in section
    assert "{'" not in section and "{&quot;" not in section
    # the same accounts report.md lists
    md = render_markdown(_lm_report())
    assert "`lm_head`: float: the output layer at float" in md and "`output.weight` at Q8_0" in md


def test_a_file_under_several_settings_shows_its_account_once():
    r = _lm_report()
    twin = r.variants[1].model_copy(deep=True)
    twin.name, twin.runtime.threads = "ort-int4@t2", 2
    r.variants.append(twin)
    html = render_html(r)
    section = html[html.index("<h2 id=quantization-accounts>"):html.index("<h2 id=gate>")]
    assert section.count("<code>lm_head</code>") == 1 and "ort-int4, ort-int4@t2</b> layers" in section
    assert html.count("<table id=lm-race>") == 1 and "ort-int4@t2" in html[html.index("<table id=lm-race>"):]


def test_a_kv_cache_exports_proof_is_its_lineage_parity():
    html = render_html(_lm_report())
    tree = parse(html[html.index("<h2 id=lineage>"):])
    fp32 = next(tree.iter("details", cls="lineage"))
    rows = [[c.text() for c in r] for r in next(fp32.iter("table", cls="lineage-steps")).rows()]
    export = next(r for r in rows if r[2] == "torch->onnx (kv cache)")
    assert export[3] == "fp32" and "max |err| 3.81e-06" in export[4] and "top-1 100.0%" in export[4]
    assert "through the KV cache: max |err| 2.86e-06 (tolerance 8.12e-03)" in export[4]
