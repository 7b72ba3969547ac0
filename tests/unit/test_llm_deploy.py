"""Language models through the loop (issue #36), on tiny models trained here (tests/lm_zoo.py), with the real
exporter, the real onnxruntime and the real agent (a local subprocess): KV-cache exports proven against
PyTorch (and a cache broken by hand caught), quality from the device's own log-probabilities equal to a hand
computation, a planted degenerate variant failing the gate, bad inputs refused with exit 2, and `edgekit run`
reproducing the report's perplexity from ship/."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from lm_zoo import build_tiny_lm, eval_text

from edgekit.errors import BadInputError, ConversionError
from edgekit.llm.options import LMOptions
from edgekit.orchestration.generate import deploy_lm
from edgekit.report.decision import separate_runs_ratio

ORT_ONLY = ("ort-fp32", "ort-int8")
FAST = dict(runs=20, warmup=3, min_seconds=0.1, threads=1)  # threads fixed: no FILE@tN rows


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> tuple[Path, Path]:
    folder = build_tiny_lm("llama")
    text = eval_text(tmp_path_factory.mktemp("text"))
    return folder, text


@pytest.fixture(scope="module")
def deployed(llama, tmp_path_factory):
    folder, text = llama
    out = tmp_path_factory.mktemp("lm-out")
    report = deploy_lm(folder, eval_text=text, out=out,
                       options=LMOptions(context=96, window=48, max_windows=8, candidates=ORT_ONLY, **FAST))
    return report, out


def test_the_loop_ships_a_variant_inside_the_quality_gate(deployed):
    report, out = deployed
    assert report.model["task"] == "text-generation" and report.model["architecture"] == "LlamaForCausalLM"
    names = {v.name for v in report.variants}
    assert names == set(ORT_ONLY), report.decision
    for v in report.variants:
        g, q = v.generation, v.quality
        # every figure measured: TTFT at three prompt lengths, decode tok/s with a CI that brackets it
        assert [p["tokens"] for p in g.prefill] == [6, 24, 48] and g.ttft_ms > 0 and g.ttft_cold_ms > 0
        lo, hi = g.decode_tokens_per_s_ci95
        assert lo <= g.decode_tokens_per_s <= hi and g.inter_token_ms["n"] >= 20
        assert g.decode_filled["tokens"] == 32 and g.decode_filled["start"] == 96 - 32 - 1
        # onnxruntime holds the cache as arrays: its size is what the config says it must be
        per_tok = 2 * 2 * 2 * 16 * 4  # 2 (k, v) x layers x kv heads x head dim x fp32
        assert g.kv_cache_source == "runtime" and g.kv_cache_mb == pytest.approx(per_tok * 95 / 2 ** 20)
        assert q.positions == 8 * 47
        # the KLD's tokens sized by default to hold 99.5% of the float mass at every position: judged, tight
        assert q.coverage_target == 0.995 and q.top_k_capped_at is None and q.kld_bound == "lower"
        assert q.float_tail_mass_max <= 0.005 + 1e-5 and 1 <= q.top_k_mean <= q.top_k <= 384
        assert q.scoring_bytes == q.scored_ids * 8 + (q.positions + 1) * 8
        # a trained model: perplexity far below the vocabulary's 384
        assert 5 < q.perplexity < 100, q.perplexity
    fp32, int8 = report.variant("ort-fp32"), report.variant("ort-int8")
    assert fp32.quality.kld_mean < 1e-6 and fp32.quality.top1_agreement == 1.0
    assert 0 < int8.quality.kld_mean < 0.05 and int8.quality.greedy["prompts"] == 4
    assert report.decision.ship in ORT_ONLY and report.gate.passed
    ship = json.loads((out / "ship" / "ship.json").read_text())
    assert ship["task"] == "text-generation" and (out / "ship" / "tokenizer.json").is_file()
    assert Path(ship["file"]).name == f"{report.decision.ship}.onnx"
    # the cache parity each file passed at build is in its lineage
    par = fp32.lineage[-1].metrics["cache_parity"]
    assert par["cache_max_abs_err"] <= par["tolerance"] and par["prefill_max_abs_err"] <= par["tolerance"]
    assert json.loads((out / "report.json").read_text())["variants"][0]["generation"]["decode_tokens_per_s"] > 0
    md = (out / "report.md").read_text()
    assert "decode tok/s (95% CI)" in md and f"| {report.decision.ship}" in md and "TTFT ms" in md
    assert len(report.model["sha256"]) == 64


def test_edgekit_run_reproduces_the_reports_perplexity_and_generates(deployed, llama, cli):
    report, out = deployed
    _, text = llama
    r = cli("run", str(out / "ship"), "--eval-text", str(text), "--json")
    assert r.exit_code == 0, r.stdout + r.stderr
    ans = json.loads(r.stdout.strip().splitlines()[-1])
    shipped = report.variant(report.decision.ship).quality.perplexity
    assert ans["perplexity"] == pytest.approx(shipped, rel=1e-5), (ans, shipped)
    r = cli("run", str(out / "ship"), "--prompt", "This License", "--max-new-tokens", "8", "--json")
    assert r.exit_code == 0, r.stdout + r.stderr
    gen = json.loads(r.stdout.strip().splitlines()[-1])
    assert 1 <= gen["new_tokens"] <= 8 and isinstance(gen["text"], str)


def test_quality_equals_a_hand_computation_from_full_logits(llama, tmp_path):
    """With K = the whole vocabulary the device's KLD is exact: it equals KL(softmax(float) || softmax(device))
    computed here from the full logits of the same windows (the ONNX file's, run by the same decoder)."""
    import torch

    from edgekit.agent.inprocess import load_agent
    from edgekit.llm.export_onnx import export_onnx, quantize_onnx_int8
    from edgekit.llm.quality import quality, reference
    from edgekit.llm.source import load_lm

    src = load_lm(llama[0])
    windows = np.random.default_rng(0).integers(0, src.vocab_size, size=(3, 20)).astype(np.int32)
    ref = reference(src.model, windows, k=src.vocab_size)
    art = quantize_onnx_int8(export_onnx(src, tmp_path / "f.onnx", context=64), tmp_path / "q.onnx")
    dec = load_agent().runners.decoder_for("onnxruntime").open(str(art.path), {"threads": 1})
    dev = load_agent().generation.score_windows(dec, windows, ref.top_ids, ref.offsets)
    q = quality(ref, dev)
    kl, nll_v, nll_f, agree = [], [], [], []
    for i in range(3):
        with torch.no_grad():
            lf = torch.log_softmax(src.model(torch.as_tensor(windows[i:i + 1].astype(np.int64))).logits[0, :-1].double(), -1)
        lq = torch.log_softmax(torch.as_tensor(dec.forward(windows[i].tolist(), 0)[:-1]).double(), -1)
        kl += (lf.exp() * (lf - lq)).sum(-1).tolist()
        tgt = torch.as_tensor(windows[i, 1:].astype(np.int64))
        nll_v += (-lq[torch.arange(19), tgt]).tolist()
        nll_f += (-lf[torch.arange(19), tgt]).tolist()
        agree += (lq.argmax(-1) == lf.argmax(-1)).double().tolist()
    assert q["kld_bound"] == "exact"
    assert q["kld_mean"] == pytest.approx(float(np.mean(kl)), rel=1e-3, abs=1e-9)
    assert q["perplexity"] == pytest.approx(float(np.exp(np.mean(nll_v))), rel=1e-5)
    assert q["perplexity_float"] == pytest.approx(float(np.exp(np.mean(nll_f))), rel=1e-5)
    assert q["top1_agreement"] == pytest.approx(float(np.mean(agree)))
    # top-K with K < vocabulary: a lower bound, never above the exact figure
    small = reference(src.model, windows, k=8)
    q8 = quality(small, load_agent().generation.score_windows(dec, windows, small.top_ids, small.offsets))
    assert q8["kld_bound"] == "lower" and q8["kld_mean"] <= q["kld_mean"] + 1e-12


def _break_cache(src_onnx: Path, dest: Path) -> None:
    """A file whose first layer's present key is scaled by 0.5: its full-window forward is untouched (the
    present output feeds nothing inside), but every decode step reads a wrong cache."""
    import onnx
    from onnx import helper

    m = onnx.load(str(src_onnx))
    out = next(o for o in m.graph.output if o.name == "present.0.key")
    for n in m.graph.node:
        n.output[:] = ["present.0.key.raw" if o == out.name else o for o in n.output]
        n.input[:] = ["present.0.key.raw" if i == out.name else i for i in n.input]
    half = helper.make_tensor("half", onnx.TensorProto.FLOAT, [], [0.5])
    m.graph.initializer.append(half)
    m.graph.node.append(helper.make_node("Mul", ["present.0.key.raw", "half"], [out.name]))
    onnx.save(m, str(dest))


def test_cache_parity_catches_a_cache_broken_by_hand(llama, tmp_path):
    from edgekit.artifact import Artifact
    from edgekit.formats import Format
    from edgekit.llm.export_onnx import export_onnx, lm_io
    from edgekit.llm.parity import cache_parity
    from edgekit.llm.source import load_lm

    src = load_lm(llama[0])
    good = export_onnx(src, tmp_path / "good.onnx", context=64)
    tokens = list(range(5, 37))
    ok = cache_parity(good, src.model, tokens, context=64)
    assert ok["cache_max_abs_err"] < 1e-4 and ok["prefill_max_abs_err"] < 1e-4
    _break_cache(good.path, tmp_path / "broken.onnx")
    broken = Artifact.from_file(tmp_path / "broken.onnx", Format.ONNX, lm_io(src))
    with pytest.raises(ConversionError, match="the cache is broken") as err:
        cache_parity(broken, src.model, tokens, context=64)
    assert "differs from the full-sequence forward" in str(err.value)


def _planted_degenerate(src_onnx: Path, dest: Path, token: int) -> None:
    """A file whose logits get +30 on one token: it runs, its cache is consistent, it says one word."""
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.load(str(src_onnx))
    vocab = [d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim][-1]
    bias = np.zeros(vocab, np.float32)
    bias[token] = 30.0
    for n in m.graph.node:
        n.output[:] = ["logits.raw" if o == "logits" else o for o in n.output]
    m.graph.initializer.append(numpy_helper.from_array(bias, "planted_bias"))
    m.graph.node.append(helper.make_node("Add", ["logits.raw", "planted_bias"], ["logits"]))
    onnx.save(m, str(dest))


def test_a_planted_degenerate_variant_fails_the_gate_on_the_device(llama, tmp_path):
    """Measured on the device like any variant (past the build's parity on purpose): the gate's quality checks,
    not luck, keep it from shipping."""
    from edgekit.artifact import Artifact
    from edgekit.formats import Format
    from edgekit.inputs.targets import load_target
    from edgekit.llm.export_onnx import export_onnx, lm_io
    from edgekit.llm.judge import LMGate, judge
    from edgekit.orchestration import generate as d

    folder, text = llama
    o = LMOptions(context=64, window=32, max_windows=4, **FAST)
    p = d.prepare_generation(folder, text, load_target("local"), tmp_path / "out", o, lambda _m: None)
    good = export_onnx(p.src, tmp_path / "out" / "artifacts" / "good.onnx", context=64)
    _planted_degenerate(good.path, tmp_path / "bad.onnx", token=7)
    bad = Artifact.from_file(tmp_path / "bad.onnx", Format.ONNX, lm_io(p.src), precision="int8")
    with d.open_session(p, o, None, None, lambda _m: None) as session:  # the run's one session, as deploy_lm opens it
        d.use_generation(session, p, o)
        results, dropped, _, _ = d.measure(session, p, {"ort-fp32": good, "planted": bad}, o, lambda _m: None)
    assert not dropped
    gate, decision = judge(results, "ort-fp32", LMGate(), "decode", {})
    planted = next(v for v in results if v.name == "planted")
    assert planted.quality.greedy["repeat_share"] > 0.9 and planted.quality.kld_mean > 1.0
    assert decision.ship == "ort-fp32" and "degenerate" in decision.lost["planted"], decision.lost
    assert "kld" in decision.lost["planted"] and "perplexity_increase" in decision.lost["planted"]


def test_bad_inputs_are_refused_before_any_build(llama, tmp_path, cli):
    folder, text = llama
    # a folder that needs its own code
    remote = tmp_path / "remote"
    shutil.copytree(folder, remote)
    cfg = json.loads((remote / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (remote / "config.json").write_text(json.dumps(cfg))
    r = cli("deploy", str(remote), "--eval-text", str(text), "--out", str(tmp_path / "o1"))
    assert r.exit_code == 2 and "its own Python code" in r.stdout + r.stderr
    # an eval text too short for one window says how many tokens it holds
    short = tmp_path / "short.txt"
    short.write_text("GNU General Public License")
    r = cli("deploy", str(folder), "--eval-text", str(short), "--out", str(tmp_path / "o2"))
    assert r.exit_code == 2 and "fewer than one window" in r.stdout + r.stderr and "holds" in r.stdout + r.stderr
    # a language model without --eval-text, and fixed-graph options it does not take
    r = cli("deploy", str(folder), "--out", str(tmp_path / "o3"))
    assert r.exit_code == 2 and "--eval-text" in r.stdout + r.stderr
    r = cli("deploy", str(folder), "--eval-text", str(text), "--metric", "top1", "--out", str(tmp_path / "o4"))
    assert r.exit_code == 2 and "--metric" in r.stdout + r.stderr
    # an output-layer scheme that does not exist, and a variant that does not exist
    r = cli("deploy", str(folder), "--eval-text", str(text), "--output-layer", "int3", "--out", str(tmp_path / "o6"))
    assert r.exit_code == 2 and "--output-layer 'int3'" in r.stdout + r.stderr and "int8" in r.stdout + r.stderr
    r = cli("deploy", str(folder), "--eval-text", str(text), "--lm-variants", "ort-int2", "--out", str(tmp_path / "o7"))
    assert r.exit_code == 2 and "ort-int2" in r.stdout + r.stderr and "ort-int4" in r.stdout + r.stderr
    # a tokenizer that does not fit the model's vocabulary
    small = tmp_path / "small-vocab"
    shutil.copytree(folder, small)
    cfg = json.loads((small / "config.json").read_text())
    cfg["vocab_size"] = 100
    (small / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(Exception) as err:
        deploy_lm(small, eval_text=text, out=tmp_path / "o5", options=LMOptions(candidates=ORT_ONLY))
    assert "vocab" in str(err.value).lower() or "size mismatch" in str(err.value).lower()
    for o in ("o1", "o2", "o3", "o4", "o6", "o7"):
        assert not (tmp_path / o / "report.json").exists()


def test_a_context_that_cannot_fit_the_target_is_refused_by_name(llama, tmp_path):
    import yaml

    from edgekit.llm.memory import check_fits, memory_plan
    from edgekit.llm.source import load_lm

    folder, text = llama
    spec = yaml.safe_load((Path(__file__).resolve().parents[2] / "targets" / "local.yaml").read_text())
    # 80% of 188 MB is 150.4 MB: the runtime's ~150 MB and 0.47 MB of weights leave no room for a cache
    spec.update(name="tiny-board", memory_mb=188)
    target = tmp_path / "tiny-board.yaml"
    target.write_text(yaml.safe_dump(spec))
    with pytest.raises(BadInputError) as err:
        deploy_lm(folder, eval_text=text, target=str(target), out=tmp_path / "o",
                  options=LMOptions(context=256, candidates=ORT_ONLY))
    msg = str(err.value)
    assert "a context of 256 tokens does not fit target tiny-board" in msg and "512 bytes/token" in msg
    assert "leave no room for a cache" in msg
    assert not (tmp_path / "o" / "artifacts").exists()  # refused before any build
    # with room for ~180 positions the hint names the longest context that fits, and that one passes
    src = load_lm(folder)
    with pytest.raises(BadInputError) as err:
        check_fits(memory_plan(src, 256, 188.2), "tiny-board")
    fits = int(str(err.value).split("use --context ")[1].split()[0])
    assert 100 < fits < 256, str(err.value)
    check_fits(memory_plan(src, fits, 188.2), "tiny-board")
    with pytest.raises(BadInputError):
        check_fits(memory_plan(src, fits + 1, 188.2), "tiny-board")


def test_a_gguf_is_a_source_and_a_truncated_one_is_exit_2(tmp_path, cli):
    from gguf_fixtures import tiny_llama_gguf

    gguf = tiny_llama_gguf(tmp_path / "g")
    text = eval_text(tmp_path / "t")
    report = deploy_lm(gguf, eval_text=text, out=tmp_path / "o",
                       options=LMOptions(context=64, window=32, max_windows=4, candidates=("ort-fp32",), **FAST))
    assert report.model["origin"]["gguf"] == str(gguf) and report.model["origin"]["quantization"]
    assert report.variant("ort-fp32").quality.kld_mean < 1e-6  # the GGUF's float model, exported and run
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(gguf.read_bytes()[: gguf.stat().st_size // 2])
    r = cli("deploy", str(cut), "--eval-text", str(text), "--out", str(tmp_path / "o2"))
    assert r.exit_code == 2 and "cut.gguf" in r.stdout + r.stderr and "truncated" in (r.stdout + r.stderr).lower()
    assert not (tmp_path / "o2" / "report.json").exists()


def test_a_sustained_decode_reports_tokens_over_time(llama, tmp_path):
    folder, text = llama
    r = deploy_lm(folder, eval_text=text, out=tmp_path / "o", options=LMOptions(
        context=64, window=32, max_windows=2, candidates=("ort-fp32",), sustained_seconds=2.0, **FAST))
    v = r.variant("ort-fp32")
    s = v.sustained
    assert s["seconds"] >= 2.0 and len(s["bins"]) >= 2 and s["first"]["runs"] > 0 and s["last"]["runs"] > 0
    # the decode wraps at the context (a new sequence) instead of overflowing it: thousands of tokens in 2 s
    assert v.latency_ms.runs > 64 and v.generation.decode_tokens_per_s > 0


def test_a_kld_whose_top_k_misses_the_mass_is_not_judged(llama, tmp_path, cli):
    """The device's KLD covers the float model's top-K tokens plus one tail bucket: a lower bound. With a fixed
    --top-k 4 most of the float model's mass is outside them, and the gate fails the check (asking for more
    tokens) instead of passing a figure that could hide a loss; nothing ships, and `edgekit run` on the ship/
    folder says so (an earlier run's file there is gone). By default (no --top-k) each position's tokens are
    sized to hold 99.5% of the float mass and the same file passes."""
    folder, text = llama
    out = tmp_path / "o"
    full = deploy_lm(folder, eval_text=text, out=out, options=LMOptions(
        context=64, window=32, max_windows=2, candidates=("ort-int8",), **FAST))
    q = full.variant("ort-int8").quality
    assert q.float_tail_mass_max <= 0.005 + 1e-5 and q.coverage_target == 0.995 and full.gate.passed
    assert (out / "ship" / "ort-int8.onnx").is_file()
    small = deploy_lm(folder, eval_text=text, out=out, options=LMOptions(
        context=64, window=32, max_windows=2, candidates=("ort-int8",), top_k=4, **FAST))
    q = small.variant("ort-int8").quality
    assert q.top_k == 4 and q.coverage_target is None and q.kld_bound == "lower" and q.float_tail_mass_mean > 0.05
    check = next(c for c in small.gate.checks if c.name == "kld")
    assert not check.passed and "KLD not judgeable" in check.message and "--top-k" in check.message
    assert small.decision.ship is None and not small.gate.passed
    assert not (out / "ship" / "ort-int8.onnx").exists()
    r = cli("run", str(out / "ship"), "--eval-text", str(text))
    assert r.exit_code == 2 and "nothing shipped" in r.stdout + r.stderr, r.stdout + r.stderr
    assert "no variant passes the quality checks" in r.stdout + r.stderr


def test_a_distribution_too_flat_for_the_transfer_cap_leaves_the_kld_unjudged(llama, tmp_path, monkeypatch):
    """Past the transfer cap the flattest positions are cut to a common K; where the cut leaves more than 5% of
    the float mass out on average, the KLD is reported but not judged (a skipped check, with the reason), and
    the perplexity and degeneration checks decide: the default deploy still ships a file."""
    import edgekit.llm.quality as quality_mod

    folder, text = llama
    monkeypatch.setattr(quality_mod, "MAX_SCORED_IDS", 2 * 31 * 2)  # 2 tokens a position over 2 windows of 32
    r = deploy_lm(folder, eval_text=text, out=tmp_path / "o", options=LMOptions(
        context=64, window=32, max_windows=2, candidates=("ort-int8",), **FAST))
    q = r.variant("ort-int8").quality
    assert q.top_k_capped_at == 2 and q.scored_ids <= 2 * 31 * 2 and q.float_tail_mass_mean > 0.05
    check = next(c for c in r.gate.checks if c.name == "kld")
    assert check.skipped and check.passed and "KLD not judged" in check.message and "too flat" in check.message
    assert {c.name for c in r.gate.checks} >= {"perplexity_increase", "degenerate"}
    assert r.decision.ship == "ort-int8" and r.gate.passed


def test_threads_are_tuned_per_runtime_and_a_setting_ships_only_when_clearly_faster(llama, tmp_path):
    """Issue #37's race: after the files are measured, each runtime's best file inside the gate is measured again
    (timings and scoring) at the other thread counts the device allows (FILE@tN); a setting ships only when its
    decode CI is above its file's at the measured threads, and ship/runtime.json carries the shipped threads.
    --threads fixes them: nothing is tuned."""
    import json
    import os

    from edgekit.llm.threads import file_of

    folder, text = llama
    opts = dict(context=64, window=32, max_windows=2, candidates=ORT_ONLY, runs=20, warmup=3, min_seconds=0.1)
    r = deploy_lm(folder, eval_text=text, out=tmp_path / "o", options=LMOptions(**opts))
    limit = min(2, len(os.sched_getaffinity(0)))  # the local target has 2 cores; this process may use fewer
    rows = [v for v in r.variants if "@t" in v.name]
    assert [v.runtime.threads for v in rows] == ([2] if limit == 2 else []), [v.name for v in r.variants]
    assert r.settings["threads_tuned"]["rows"] == [v.name for v in rows]
    for row in rows:
        base = r.variant(file_of(row.name))
        assert base.runtime.threads == 1 and row.sha256 == base.sha256
        assert row.quality.positions == base.quality.positions > 0  # scored again on the device, not copied
        rg, bg = row.generation, base.generation
        ratio = separate_runs_ratio(base.name, bg.decode_tokens_per_s, bg.decode_tokens_per_s_ci95, row.name,
                                    rg.decode_tokens_per_s, rg.decode_tokens_per_s_ci95, higher_is_better=True)
        if r.decision.ship == row.name:
            assert ratio.faster, ratio.describe()
        else:
            assert row.name in r.decision.lost
            why = r.decision.lost[row.name]
            # not clearly faster than its own file (the one tie rule), or it was (and so raced) but lost to another
            assert (("not proved faster" in why and not ratio.faster)
                    or (why.startswith("slower at") and ratio.slower)
                    or (ratio.faster and not why.startswith("slower at"))), why
    shipped = r.variant(r.decision.ship)
    runtime = json.loads((tmp_path / "o" / "ship" / "runtime.json").read_text())
    assert runtime["threads"] == shipped.runtime.threads
    fixed = deploy_lm(folder, eval_text=text, out=tmp_path / "f", options=LMOptions(**opts, threads=1))
    assert not [v for v in fixed.variants if "@" in v.name] and fixed.settings["threads_tuned"] is None


def test_the_short_search_leaves_the_slow_rows_to_search(llama, tmp_path, monkeypatch):
    """Without --lm-variants the race builds the short list (each runtime's likeliest winners); the rest are named
    in settings.skipped with the flag that races them; --search races every row."""
    from edgekit.llm import candidates
    from edgekit.orchestration import generate as deploy

    seen: list[list[str]] = []

    def stop(p, chosen, progress, cal, **_kw):
        seen.append([c.name for c in chosen])
        raise BadInputError("stop after choosing")

    monkeypatch.setattr(deploy, "build", stop)
    folder, text = llama
    for search in (False, True):
        with pytest.raises(BadInputError, match="stop after choosing"):
            deploy_lm(folder, eval_text=text, out=tmp_path / f"o{search}", options=LMOptions(
                context=64, window=32, max_windows=2, search=search))
    runnable, skipped = candidates.candidates_for(deploy.target_spec("local"))
    assert seen[0] == [c.name for c in runnable if c.name in candidates.SHORT]
    assert seen[1] == [c.name for c in runnable]
    assert "ort-int4" in seen[0] and "et-int8" not in seen[0] and "ort-int4-b128" in seen[0]
    # the rows only --search races are ExecuTorch's: raced where executorch is installed, else named as missing
    # (CI's default step runs before executorch is installed)
    slow = {"et-int8", "et-8da4w-g64"}
    if importlib.util.find_spec("executorch") is not None:
        assert slow <= set(seen[1]) - set(seen[0])
    else:
        assert all("executorch" in skipped[name] for name in slow) and not slow & set(seen[1])
