"""Issues #36/#37's table: language models of ~100M parameters through `edgekit deploy MODEL_DIR --eval-text` with
every runtime and precision edgekit builds (onnxruntime fp32 / int8 / int4 MatMulNBits; ExecuTorch fp32 / 8da8w /
8da4w / int8 weight-only; llama.cpp GGUF Q8_0 / Q4_0 / Q4_K_M), beside each runtime's own benchmark tool on the
same file in the same session (ExecuTorch's TextLLMRunner; llama.cpp's llama-bench, and llama-perplexity
--kl-divergence against the f16 GGUF's logits beside edgekit's KLD against the PyTorch model).

Per model family (a Llama-style model and a Qwen2-style one: grouped-query attention, tied embeddings and q/k/v
biases for Qwen2) and variant it prints: size, TTFT (cold, warm), prefill tokens/s at each prompt length,
decode tokens/s with its 95% CI, inter-token p50/p95, peak RSS, KV cache, perplexity, KLD from the float model,
top-1 agreement; and, for the .pte files, ExecuTorch's own LLM runner (``TextLLMRunner``: its Stats' decode
rate) decoding greedily from the same prompt length on the same thread count, with edgekit's figure as a
fraction of it. Plain onnxruntime has no generation benchmark of its own (onnxruntime-genai's benchmark_e2e
needs a GenAI model folder, which edgekit does not use: see edgekit/llm/export_onnx.py), so its rows have none.

The models are built here from transformers' own classes at ~100M parameters with random weights (no weights
can be downloaded here): speed figures are what such a model costs; quality figures (perplexity, KLD) measure
the quantization error of random weights, not a trained model's loss. The tokenizer is the test zoo's
byte-level BPE (tests/lm_zoo.py), the eval text its held-out licence text. The CPU's ISA, the edgekit commit and
the command are printed with the table.

    .venv/bin/python benchmarks/llm_runtimes.py [--families llama,qwen2] [--threads 1] [--context 256]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cpu import isa  # noqa: E402
from _docs import commit  # noqa: E402

CONFIGS = {  # ~100M parameters each (embeddings included)
    "llama": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                  num_key_value_heads=4, vocab_size=32000, tie_word_embeddings=False),
    "qwen2": dict(hidden_size=768, intermediate_size=2560, num_hidden_layers=12, num_attention_heads=12,
                  num_key_value_heads=2, vocab_size=32000, tie_word_embeddings=True),
}


def build_model(family: str, dest: Path, context: int) -> Path:
    """A ~100M-parameter model folder of ``family`` with the zoo's tokenizer (random weights, seeded)."""
    import torch
    from lm_zoo import build_tiny_lm
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if (dest / "config.json").is_file():
        return dest
    torch.manual_seed(0)
    cfg_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[family]
    model = model_cls(cfg_cls(max_position_embeddings=context, **CONFIGS[family])).eval()
    model.save_pretrained(dest)
    AutoTokenizer.from_pretrained(build_tiny_lm(family), local_files_only=True).save_pretrained(dest)
    return dest


def executorch_runner(pte: Path, tokenizer: Path, prompt: str, new_tokens: int, threads: int) -> dict:
    """ExecuTorch's own LLM runner on the file, in a child process (its thread pool is process-wide)."""
    code = (
        "import json, sys\n"
        "from executorch.extension.pybindings import _C\n"
        f"_C._unsafe_reset_threadpool({threads})\n"
        "from executorch.extension.llm.runner import TextLLMRunner, GenerationConfig\n"
        "r = TextLLMRunner(sys.argv[1], sys.argv[2])\n"
        "cfg = GenerationConfig(max_new_tokens=int(sys.argv[4]), temperature=0.0, echo=False, warming=True)\n"
        "r.generate(sys.argv[3], cfg)\n"  # a warm-up generation, as the runner's --warmup does
        "r.reset()\n"
        "st = {}\n"
        "cfg = GenerationConfig(max_new_tokens=int(sys.argv[4]), temperature=0.0, echo=False)\n"
        "r.generate(sys.argv[3], cfg, stats_callback=lambda s: st.update(json.loads(s.to_json_string())))\n"
        "print(json.dumps(st))\n")
    out = subprocess.run([sys.executable, "-c", code, str(pte), str(tokenizer), prompt, str(new_tokens)],
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        return {"error": (out.stderr or out.stdout).strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def llama_bench(gguf: Path, threads: int, new_tokens: int = 64) -> dict:
    """llama.cpp's own `llama-bench` on the file: token generation (tg) tokens/s, 3 repetitions."""
    from edgekit.llm.llama_cpp import tools

    out = subprocess.run([str(tools().tool("llama-bench")), "-m", str(gguf), "-p", "0", "-n", str(new_tokens),
                          "-r", "3", "-t", str(threads), "-o", "json"], capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        return {"error": (out.stderr or out.stdout).strip().splitlines()[-1:]}
    return json.loads(out.stdout)[0]


def llama_perplexity_kld(gguf: Path, base: Path, text: Path, threads: int, work: Path, ctx: int = 128,
                         chunks: int = 8) -> dict:
    """`llama-perplexity --kl-divergence` of the file against the f16 base's logits on the same text (llama.cpp
    scores the second half of each chunk of ``ctx`` tokens, over the whole vocabulary)."""
    import re

    from edgekit.llm.llama_cpp import tools

    exe = str(tools().tool("llama-perplexity"))
    logits = work / f"{base.parent.parent.name}-{base.stem}-kld-base.bin"  # one a model (FAMILY-out/artifacts)
    common = ["-f", str(text), "-c", str(ctx), "--chunks", str(chunks), "-t", str(threads)]
    if not logits.is_file():
        subprocess.run([exe, "-m", str(base), "--kl-divergence-base", str(logits), *common], capture_output=True,
                       text=True, timeout=3600, check=True)
    out = subprocess.run([exe, "-m", str(gguf), "--kl-divergence-base", str(logits), "--kl-divergence", *common],
                         capture_output=True, text=True, timeout=3600)
    m = re.search(r"Mean\s+KLD:\s+([0-9.eE+-]+)", out.stdout + out.stderr)
    return {"kld": float(m.group(1))} if m else {"error": (out.stderr or out.stdout).strip().splitlines()[-1:]}


def edgekit_kld_on_peer_chunks(gguf: Path, base: Path, text: Path, threads: int, ctx: int = 128,
                               chunks: int = 8) -> dict:
    """edgekit's KLD computation (``quality.kl_per_position``, the whole vocabulary) on exactly the positions
    ``llama-perplexity --kl-divergence`` scores, against the same f16 file: the text tokenized by the GGUF's own
    tokenizer (BOS where the vocabulary adds one), chunks of ``ctx`` tokens whose first token becomes BOS, the
    logits at positions ctx/2 .. ctx-2 of each chunk; both files run by the agent's llama.cpp decoder (the bytes
    the device runs). The deploy's own KLD differs from llama.cpp's by design (its windows spread over the text,
    no BOS, the PyTorch model as the reference): this isolates the computation."""
    import numpy as np

    from edgekit.agent.inprocess import load_agent
    from edgekit.llm.quality import kl_per_position

    runners = load_agent().runners
    runners.llamacpp_runner.import_llama_cpp()  # LLAMA_CPP_LIB_PATH set to edgekit's build
    import llama_cpp

    vocab = llama_cpp.Llama(str(gguf), vocab_only=True, verbose=False)
    toks = vocab.tokenize(text.read_bytes(), add_bos=True, special=False)
    bos = vocab.token_bos()
    add_bos = bool(toks) and toks[0] == bos
    if len(toks) < ctx * chunks:
        return {"error": f"{len(toks)} tokens, fewer than {chunks} chunks of {ctx}"}

    def log_probs(path: Path) -> np.ndarray:
        dec = runners.decoder_for("llama.cpp").open(str(path), {"threads": threads, "generate": {"context": ctx}})
        rows = []
        for i in range(chunks):
            chunk = list(toks[i * ctx:(i + 1) * ctx])
            if add_bos:
                chunk[0] = bos
            logits = np.asarray(dec.forward(chunk, 0), dtype=np.float64)[ctx // 2:ctx - 1]
            rows.append(logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True))
        return np.concatenate(rows)

    kl, _ = kl_per_position(log_probs(base), log_probs(gguf))
    return {"kld": float(kl.mean()), "positions": int(kl.size), "bos": add_bos}


def paired_with_llama_bench(gguf: Path, threads: int, context: int, rounds: int = 5, n: int = 64) -> dict:
    """edgekit's decode loop (the agent's llama.cpp decoder, the bytes the device runs, greedy from an empty cache
    as the generation workload decodes) and `llama-bench` tg``n`` alternated round by round, so both see the
    same moment of a shared host: per-round ratios and their median."""
    from edgekit.agent.inprocess import load_agent

    dec = load_agent().runners.decoder_for("llama.cpp").open(str(gguf), {"threads": threads,
                                                                          "generate": {"context": context}})
    ours, theirs = [], []
    for _ in range(rounds):
        lb = llama_bench(gguf, threads, n)
        theirs.append(float(lb.get("avg_ts") or 0.0))
        tok = 1
        dec.forward([tok], 0)  # a new sequence, as llama-bench's tg starts from an empty cache
        t0 = time.perf_counter()
        for i in range(1, n + 1):
            tok = int(dec.forward([tok], i)[-1].argmax())
        ours.append(n / (time.perf_counter() - t0))
    ratios = sorted(a / b for a, b in zip(ours, theirs) if b)
    return {"edgekit": ours, "llama_bench": theirs, "ratio_median": ratios[len(ratios) // 2] if ratios else None}


def peers_only(work: Path, text: Path, threads: int, context: int) -> list[str]:
    """The GGUF files a earlier run kept under ``work``: edgekit's decode loop beside llama-bench (alternated),
    and llama-perplexity's KLD against the f16 file beside edgekit's (report.json: the device's, over the float
    model's top-256 plus a tail bucket, against PyTorch)."""
    lines = [f"| model | file | edgekit decode tok/s (median of rounds) | llama-bench tg64 (median) | edgekit / "
             f"llama-bench (median of per-round ratios), context {context} | the same at context 72 | edgekit deploy "
             "KLD (its windows, vs PyTorch) | edgekit KLD on llama-perplexity's positions (vs the f16 GGUF) | "
             "llama-perplexity KLD (vs the f16 GGUF) | edgekit / llama-perplexity (same positions) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    print("\n".join(lines), flush=True)
    for out in sorted(work.glob("*-out")):
        rep = json.loads((out / "report.json").read_text())
        def deploy_kld(q: dict) -> str:  # the report's KLD, said to be a bound where its top-K missed the mass
            tail = q.get("float_tail_mass_mean") or 0.0
            return f"{q['kld_mean']:.2e}" + (f" (top-{q.get('top_k')}: a lower bound, {tail:.0%} of the float mass "
                                             "outside)" if tail > 0.05 else "")

        kld = {v["name"]: deploy_kld(v["quality"]) for v in rep["variants"]}
        for f in sorted((out / "artifacts").glob("gguf-q*.gguf")):
            pr = paired_with_llama_bench(f, threads, context)
            # the same at llama-bench's own context (tg64 makes a 64-position context; ours needs one more): how
            # much of a gap is the deploy's larger KV cache rather than the decode loop
            small = paired_with_llama_bench(f, threads, 72)
            base = out / "artifacts" / "gguf-f16.gguf"
            pk = llama_perplexity_kld(f, base, text, threads, work)
            ek = edgekit_kld_on_peer_chunks(f, base, text, threads)
            med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
            nan = float("nan")
            lines.append(f"| {out.name[:-4]} | {f.stem} | {med(pr['edgekit']):.1f} | {med(pr['llama_bench']):.1f} | "
                         f"{pr['ratio_median']:.2f} | {small['ratio_median']:.2f} | "
                         f"{kld.get(f.stem, 'not measured')} | "
                         f"{ek.get('kld', nan):.2e} | {pk.get('kld', nan):.2e} | "
                         f"{ek.get('kld', nan) / pk.get('kld', nan):.3f} |")
            print(lines[-1], flush=True)
    return lines


def short_vs_search(report) -> str:
    """Issue #37's bar, read from one --search run: the fastest file inside the quality gate among the default
    deploy's short search (candidates.SHORT) against the fastest inside the gate among every row measured. "Inside"
    is the deploy's own per-file checks (judge.variant_checks) at the default gate, which is what this script's
    deploys use on the local target (no memory limit)."""
    from edgekit.llm.candidates import SHORT
    from edgekit.llm.judge import LMGate, variant_checks

    inside = [v for v in report.variants if v.generation and v.generation.decode_tokens_per_s
              and all(c.passed for c in variant_checks(v, LMGate()))]
    if not inside:
        return "- short search vs --search: no file inside the gate"
    best = max(inside, key=lambda v: v.generation.decode_tokens_per_s)
    short = [v for v in inside if v.name.split("@")[0] in SHORT]
    if not short:
        return f"- short search vs --search: no short-search file inside the gate (--search's best {best.name})"
    s = max(short, key=lambda v: v.generation.decode_tokens_per_s)
    return (f"- the short search's best inside the gate, {s.name} ({s.generation.decode_tokens_per_s:.1f} tok/s), is "
          f"{s.generation.decode_tokens_per_s / best.generation.decode_tokens_per_s:.2f}x --search's, {best.name} "
          f"({best.generation.decode_tokens_per_s:.1f} tok/s); {len(inside)} of {len(report.variants)} files inside")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default="llama,qwen2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--runs", type=int, default=64, help="timed decode tokens per variant (at least)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the models and outputs here (reused)")
    ap.add_argument("--variants", default=None, help="comma-separated variant names (default: every one)")
    ap.add_argument("--top-k", type=int, default=32000,
                    help="the KLD's top-K (default: the whole vocabulary; random weights spread their mass)")
    ap.add_argument("--docs", action="store_true",
                    help="write the tables into docs/benchmarks/language-models.md: each family's between the "
                    "`benchmark llm_runtimes FAMILY` markers; with --peers-only, the `llm_runtimes --peers-only` one")
    ap.add_argument("--peers-only", action="store_true",
                    help="with --keep: only the GGUF files an earlier run kept, beside llama-bench and "
                    "llama-perplexity")
    args = ap.parse_args(argv)

    from lm_zoo import eval_text

    from edgekit.llm.options import LMOptions
    from edgekit.orchestration.generate import deploy_lm

    if args.docs and not args.peers_only and not args.variants:
        # the page's tables say "every runtime": a run here without one of them would say less than its heading
        from edgekit.llm.candidates import CANDIDATES

        lacking = sorted({c.exporter for c in CANDIDATES if c.missing()})
        if lacking:
            raise SystemExit(f"--docs: {', '.join(lacking)} not installed here, so the table would leave out its "
                             "rows; install them (bash .ci/executorch.sh, bash .ci/llama_cpp.sh) or drop --docs")
    work = args.keep or Path(tempfile.mkdtemp(prefix="edgekit-llm-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    text = eval_text(work / "text")
    print(f"# llm_runtimes: {isa()}; edgekit {commit()}; threads {args.threads}; context {args.context}")
    print(f"# command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    if args.peers_only:
        lines = peers_only(work, text, args.threads, args.context)
        if args.docs:
            from _docs import write_section

            write_section(ROOT / "docs" / "benchmarks" / "language-models.md", "llm_runtimes --peers-only",
                          "One thread; decode rounds of 64 tokens alternated with llama-bench tg64.\n\n"
                          + "\n".join(lines))
        return 0
    rows = []
    section: list[str] = []  # what a family's docs section holds: every line it prints below

    def say(line: str = "") -> None:
        print(line, flush=True)
        section.append(line)

    for family in args.families.split(","):
        section.clear()
        t0 = time.perf_counter()
        folder = build_model(family, work / f"{family}-100m", args.context)
        report = deploy_lm(folder, eval_text=text, out=work / f"{family}-out", options=LMOptions(
            context=args.context, window=128, max_windows=8, threads=args.threads, runs=args.runs, warmup=8,
            min_seconds=1.0, remeasure=True, top_k=args.top_k, search=not args.variants,
            candidates=tuple(args.variants.split(",")) if args.variants else None),
            progress=lambda m: print(f"  .. {m}", file=sys.stderr, flush=True))
        params = report.model["parameters"]
        print()
        say(f"**{family}** ({report.model['architecture']}, {params / 1e6:.0f}M parameters; threads {args.threads}, "
            f"context {args.context}, KLD over the top {args.top_k} tokens, "
            f"{'every candidate (--search)' if not args.variants else 'variants ' + args.variants}): deploy "
            f"{time.perf_counter() - t0:.0f} s; shipped {report.decision.ship}: {report.decision.reason}")
        say()
        say("| variant | size MB | TTFT ms cold/warm | prefill tok/s by prompt | decode tok/s [95% CI] | "
              "itl p50/p95 ms | decode tok/s at a full cache | peak RSS MB | KV MB | ppl | KLD | top-1 | "
              "runtime's own tool: decode tok/s | edgekit / tool | llama-perplexity KLD |")
        say("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        prompt = text.read_text(encoding="utf-8")[:200]
        for v in report.variants:
            g, q = v.generation, v.quality
            tool, ratio, peer_kld = "none (plain onnxruntime)", "", ""
            if v.format == "executorch":
                st = executorch_runner(Path(v.artifact_path), folder / "tokenizer.json", prompt, 64, args.threads)
                if "decode_token_per_sec" in st:
                    tool = f"{st['decode_token_per_sec']:.1f} (TextLLMRunner, {st.get('generated_tokens')} tokens)"
                    ratio = f"{g.decode_tokens_per_s / st['decode_token_per_sec']:.2f}"
                else:
                    tool = f"failed: {st.get('error')}"
            if v.format == "gguf":
                lb = llama_bench(Path(v.artifact_path), args.threads)
                if "avg_ts" in lb:
                    tool = f"{lb['avg_ts']:.1f} (llama-bench tg{lb.get('n_gen')})"
                    ratio = f"{g.decode_tokens_per_s / lb['avg_ts']:.2f}"
                else:
                    tool = f"failed: {lb.get('error')}"
                pk = llama_perplexity_kld(Path(v.artifact_path), Path(v.artifact_path).parent / "gguf-f16.gguf",
                                          text, args.threads, work)
                peer_kld = f"{pk['kld']:.2e}" if "kld" in pk else f"failed: {pk.get('error')}"
            ci = g.decode_tokens_per_s_ci95 or [0, 0]
            pre = ", ".join(f"{p['tokens']}: {p['tokens_per_s']:.0f}" for p in g.prefill)
            row = (f"| {v.name}{' (shipped)' if v.selected else ''} | {v.size_bytes / 2**20:.0f} | "
                   f"{g.ttft_cold_ms:.1f}/{g.ttft_ms:.1f} | {pre} | {g.decode_tokens_per_s:.1f} [{ci[0]:.1f}, "
                   f"{ci[1]:.1f}] | {g.inter_token_ms['p50']:.2f}/{g.inter_token_ms['p95']:.2f} | "
                   f"{g.decode_filled.get('tokens_per_s') or 0:.1f} | {g.peak_rss_mb:.0f} | {g.kv_cache_mb:.1f} | "
                   f"{q.perplexity:.1f} | {q.kld_mean:.2e} | {q.top1_agreement:.1%} | {tool} | {ratio} | {peer_kld} |")
            say(row)
            rows.append({"family": family, "variant": v.name, "decode_tokens_per_s": g.decode_tokens_per_s,
                         "tool": tool, "ratio": ratio, "kld": q.kld_mean, "peer_kld": peer_kld})
        say()
        for name, why in (report.settings.get("skipped") or {}).items():  # rows this host could not build
            say(f"- not built: {name}: {why}")
        for name, why in report.decision.lost.items():
            say(f"- not {name}: {why}")
        say(short_vs_search(report))
        for v in report.variants:  # the int4 files' layer accounts (edgekit/llm/layer_plan.py)
            acc = next((s.metrics["quantization"] for s in v.lineage if "layers" in s.metrics.get("quantization", {})),
                       None)
            if acc:
                rungs = "; ".join(f"{len(r['int8_layers'])} kept at int8: host KLD {r['host_kld']:.2e}"
                                  for r in acc.get("ladder", []))
                say(f"- {v.name} layers: {acc['counts']}; ladder: {rungs}")
        if args.docs:
            from _docs import write_section

            write_section(ROOT / "docs" / "benchmarks" / "language-models.md", f"llm_runtimes {family}",
                          "\n".join(section))
    (work / "llm_runtimes.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
