"""`edgekit deploy`: the closed loop on a target, ending in the gate's verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from .common import (
    CONST_HELP,
    EXIT_GATE_FAILED,
    HOST_THREADS_HELP,
    PANEL_DATA,
    PANEL_FLEET,
    PANEL_GATE,
    PANEL_HOST,
    PANEL_LM,
    PANEL_MEASURE,
    PANEL_OUTPUT,
    PANEL_RELEASE,
    PANEL_SEARCH,
    PANEL_TARGET,
    STATE_HELP,
    out_console,
    progress_display,
)

HELP = """Compress a model, measure every variant on the device, write the report, apply the gate.

Examples:

  edgekit deploy examples/digits/artifacts/model.pt2 --target local \\
      --eval-data examples/digits/artifacts/eval.npz \\
      --calib-data examples/digits/artifacts/calib.npz

  edgekit deploy model.onnx --target rpi4 --device lab-pi \\
      --eval-data eval.npz --max-accuracy-drop 0.5

  edgekit deploy model.pt2 --target local --eval-data eval.npz \\
      --baseline release-1.2/report.json

  edgekit deploy text.pt2 --eval-data eval.npz \\
      --x-key input_ids,attention_mask --out results/run1

  edgekit deploy seg.onnx --eval-data eval.npz --metric miou \\
      --max-metric-drop 1.5 --output logits

  edgekit deploy silero_vad.onnx --eval-data eval.npz --calib-data calib.npz \\
      --metric frame_accuracy --const sr=16000 --state stateN:state

  edgekit deploy my-llama/ --eval-text eval.txt --out out

A language model (a transformers model folder or a .gguf file) takes --eval-text instead of
--eval-data: its KV-cache exports race on the device (decode tokens/s, time to first token) inside
a quality gate on the device's own log-probabilities (--max-kld, --max-perplexity-increase).

Exit codes: 0 gate passed, 1 gate failed, 2 bad input, 3 device or transport failure.
"""


def deploy_cmd(
    model: Path = typer.Argument(..., help="A .pt2 (torch.export), .onnx, or .pt/.pth state dict with --arch; or a language model: a transformers model folder (config.json, weights, tokenizer) or a .gguf file, with --eval-text."),
    eval_data: Optional[Path] = typer.Option(None, "--eval-data", rich_help_panel=PANEL_DATA, help=".npz with the inputs (x, or arrays named like the model's inputs) and labels y (what --metric reads)."),
    eval_text: Optional[Path] = typer.Option(None, "--eval-text", rich_help_panel=PANEL_LM, help="A language model's eval text: plain UTF-8 text, or .jsonl with a text/prompt field a line; scored on the device in teacher-forced windows."),
    context: Optional[int] = typer.Option(None, "--context", rich_help_panel=PANEL_LM, help="A language model's context (the KV cache's positions; default: the model's, at most 512); refused when it cannot fit the target's memory."),
    max_kld: Optional[float] = typer.Option(None, "--max-kld", rich_help_panel=PANEL_LM, help="Largest mean KL divergence from the float model, nats a token (default 0.05: between llama.cpp's Q4_K_M 0.031 and Q4_0 0.072 on Llama-3-8B)."),
    max_perplexity_increase: Optional[float] = typer.Option(None, "--max-perplexity-increase", rich_help_panel=PANEL_LM, help="Largest perplexity increase over the float model, a fraction (default 0.05)."),
    lm_variants: Optional[str] = typer.Option(
        None, "--lm-variants", rich_help_panel=PANEL_LM,
        help="A language model's variants to build and race, comma-separated (default: the short search, those of "
        "ort-fp32, ort-int8, ort-int4, ort-int4-b128, et-8da4w, gguf-q8_0, gguf-q4_0, gguf-q4_k_m whose runtime the "
        "target runs; --search adds et-fp32, et-8da8w, et-int8 and ExecuTorch's other int4 group sizes: "
        "et-8da4w-g64, et-8da4w-g128). Unless --threads fixes them, each runtime's best file is measured again at "
        "other thread counts (FILE@tN)."),
    top_k: Optional[int] = typer.Option(
        None, "--top-k", rich_help_panel=PANEL_LM,
        help="A language model's KLD: the float model's top-K tokens a position whose log-probs the device returns. "
        "Default: at each position the fewest tokens that hold 99.5% of the float model's probability mass (the "
        "flattest positions cut to a common K past 4M ids a variant; the report says what was covered). With "
        "--top-k K the gate refuses to judge a KLD whose top-K hold under 95% of that mass."),
    output_layer: Optional[str] = typer.Option(
        None, "--output-layer", rich_help_panel=PANEL_LM,
        help="A language model's output layer (lm_head) in its int4 files: float, int8 (default) or int4; the "
        "embedding stays float."),
    calib_data: Optional[Path] = typer.Option(None, "--calib-data", rich_help_panel=PANEL_DATA, help=".npz with x for INT8 calibration."),
    train_data: Optional[Path] = typer.Option(None, "--train-data", rich_help_panel=PANEL_DATA, help=".npz with x and y for pruning fine-tunes and distillation (overrides the recipe's train_data)."),
    arch: Optional[str] = typer.Option(None, "--arch", rich_help_panel=PANEL_DATA, help="module:Class for a .pt/.pth state dict."),
    x_key: str = typer.Option("x", "--x-key", rich_help_panel=PANEL_DATA, help="Array name(s) of the inputs in the .npz files, comma-separated in the model's input order (arrays named like the model's inputs need none)."),
    y_key: str = typer.Option("y", "--y-key", rich_help_panel=PANEL_DATA, help="Array name of the labels in the eval .npz."),
    metric: Optional[str] = typer.Option(None, "--metric", "-m", rich_help_panel=PANEL_DATA, help="top1 (default), top5, pixel_accuracy, miou, map50, map50_95, mse, mae, psnr, snr, cosine, multilabel_f1, mask_iou, mask_f1, ctc_accuracy, ctc_char_accuracy, frame_accuracy (options: --metric-option or the recipe's metric: section), or a user metric module:function / file.py:function."),
    metric_option: list[str] = typer.Option([], "--metric-option", rich_help_panel=PANEL_DATA, help="A metric option as KEY=VALUE (repeat), over the recipe's metric: options, e.g. threshold=0.5 (mask_iou), blank=0 (ctc_accuracy)."),
    output: list[str] = typer.Option([], "--output", rich_help_panel=PANEL_DATA, help="The output(s) the metric reads, by name or index (repeat or comma-separate; default: the first, detection: the first two)."),
    postprocess: Optional[str] = typer.Option(None, "--postprocess", rich_help_panel=PANEL_DATA, help="Detection: module:function turning the raw outputs into per-image (boxes cxcywh, scores, classes)."),
    const: list[str] = typer.Option([], "--const", rich_help_panel=PANEL_DATA, help=CONST_HELP + " On the host and the device."),
    state: list[str] = typer.Option([], "--state", rich_help_panel=PANEL_DATA, help=STATE_HELP + " On the host and the device."),
    eval_samples: Optional[int] = typer.Option(None, "--eval-samples", rich_help_panel=PANEL_DATA, help="Score a fixed, seeded, stratified subset of N eval samples (recorded in the report)."),
    target: str = typer.Option("local", "--target", "-t", rich_help_panel=PANEL_TARGET, help="Target class (`edgekit targets list`) or a target .yaml."),
    device: Optional[str] = typer.Option(None, "--device", "-d", rich_help_panel=PANEL_TARGET, help="Device name from the inventory (not needed for local)."),
    recipe: Optional[Path] = typer.Option(None, "--recipe", "-r", rich_help_panel=PANEL_SEARCH, help="Recipe YAML: variants, passes, measure, gate."),
    search: Optional[bool] = typer.Option(None, "--search/--no-search", rich_help_panel=PANEL_SEARCH, help="--search: build every variant the target can run (runtimes x fp32/fp16/INT8 encodings; a language model: every runtime, precision and int4 group size), measure them on the device, and ship the best inside the tolerance to OUT/ship/. Without a recipe, deploy runs a short search over the target's likeliest winners; --no-search measures the fixed default variants instead (fp32 + INT8 static, or dynamic without --calib-data)."),
    objective: str = typer.Option("p50", "--objective", rich_help_panel=PANEL_SEARCH, help="The search's 'best' (no recipe, or --search): p50, p99, energy or size; a language model: decode (tokens/s, the default), ttft or prefill."),
    time_budget: Optional[float] = typer.Option(None, "--time-budget", rich_help_panel=PANEL_SEARCH, help="The search's total seconds (default: 300 for the short search, 900 with --search; a language model: 900, 1800 with --search); candidates not reached are dropped with that reason."),
    no_cache: bool = typer.Option(False, "--no-cache", rich_help_panel=PANEL_SEARCH, help="Recompute every pass instead of reusing cached outputs."),
    max_accuracy_drop: Optional[float] = typer.Option(None, "--max-accuracy-drop", "--max-metric-drop", rich_help_panel=PANEL_GATE, help="How much worse than the baseline the metric may get, in its units and direction (default 1: one point of top-1)."),
    relative: bool = typer.Option(False, "--relative-drop", rich_help_panel=PANEL_GATE, help="Read --max-accuracy-drop as percent of the baseline's accuracy."),
    strict_stats: bool = typer.Option(False, "--strict-stats", rich_help_panel=PANEL_GATE, help="Fail the accuracy check only when the drop is above the tolerance AND significant on the paired eval samples."),
    min_speedup: Optional[float] = typer.Option(None, "--min-speedup", rich_help_panel=PANEL_GATE, help="Fail a variant whose device-measured speed-up over the baseline is below this (e.g. 1.0: never ship a slower 'compressed' model); without it a slower variant is a warning."),
    latency_budget_ms: Optional[float] = typer.Option(None, "--latency-budget-ms", rich_help_panel=PANEL_GATE, help="p50 latency budget per shipped variant. With --train-data and --arch a goal: the search prunes channels, measured on the device, until the p50's 95% CI upper bound meets it (docs/guides/search.md)."),
    memory_budget_mb: Optional[float] = typer.Option(
        None, "--memory-budget-mb", rich_help_panel=PANEL_GATE,
        help="Peak memory budget of the inference process, MB. With --train-data and --arch a goal: the search prunes "
        "channels, their peak memory measured on the device, until it holds."),
    size_budget_mb: Optional[float] = typer.Option(
        None, "--size-budget-mb", rich_help_panel=PANEL_GATE,
        help="File size budget of the shipped variant, MB (10^6 bytes; the gate's model_size_mb). With --train-data "
        "and --arch a goal: the search prunes channels until the file fits."),
    teacher: Optional[str] = typer.Option(
        None, "--teacher", rich_help_panel=PANEL_DATA,
        help="The teacher the distilled student learns from instead of the source model: the .pt2 `edgekit train` "
        "wrote (or its checkpoint last.pt); its outputs must match the model's (exit 2 otherwise, before any "
        "training)."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", rich_help_panel=PANEL_RELEASE, help="A previous report.json (the last release) to compare with; the gate fails on a significant regression."),
    baseline_artifacts: Optional[Path] = typer.Option(None, "--baseline-artifacts", rich_help_panel=PANEL_RELEASE, help="With --baseline: the folder holding the baseline run's models (its out/artifacts) when they are not at the paths its report records; they are re-measured A/B against this run's."),
    release_method: str = typer.Option("auto", "--release-method", rich_help_panel=PANEL_RELEASE, help="With --baseline: how latency is judged: ab (re-measure the baseline's models interleaved with the new ones, in this session), normalized (each variant relative to the unchanged reference variant of its own run), direct (raw timings of the two runs), auto (the first that applies)."),
    max_latency_regression: Optional[float] = typer.Option(None, "--max-latency-regression", rich_help_panel=PANEL_RELEASE, help="With --baseline: allowed p50 slowdown as a fraction (default 0.1); fails only when also significant."),
    max_release_accuracy_drop: Optional[float] = typer.Option(None, "--max-release-accuracy-drop", rich_help_panel=PANEL_RELEASE, help="With --baseline: allowed accuracy drop in points vs the baseline report (default: --max-accuracy-drop)."),
    max_memory_increase: Optional[float] = typer.Option(None, "--max-memory-increase", rich_help_panel=PANEL_RELEASE, help="With --baseline: allowed peak memory increase as a fraction (default 0.1)."),
    max_size_increase: Optional[float] = typer.Option(None, "--max-size-increase", rich_help_panel=PANEL_RELEASE, help="With --baseline: allowed model size increase as a fraction (default 0.1)."),
    threads: Optional[int] = typer.Option(None, "--threads", rich_help_panel=PANEL_MEASURE, help="Runtime threads (default: the target's)."),
    warmup: Optional[int] = typer.Option(None, "--warmup", rich_help_panel=PANEL_MEASURE, help="Untimed runs before measuring (default: the target's)."),
    runs: Optional[int] = typer.Option(None, "--runs", rich_help_panel=PANEL_MEASURE, help="Minimum timed runs (default: the target's)."),
    min_seconds: Optional[float] = typer.Option(None, "--min-seconds", rich_help_panel=PANEL_MEASURE, help="Minimum timed seconds (default: the target's)."),
    warmup_mode: Optional[str] = typer.Option(None, "--warmup-mode", rich_help_panel=PANEL_MEASURE, help="fixed: --warmup runs; auto: warm up until latency stabilizes (at least --warmup runs)."),
    sustained: Optional[float] = typer.Option(None, "--sustained", rich_help_panel=PANEL_MEASURE, help="Run each variant this many seconds and report latency over time (first vs last minute) to catch thermal throttling."),
    remeasure: bool = typer.Option(False, "--remeasure", rich_help_panel=PANEL_MEASURE, help="Measure on the device again even when the measurement cache holds this exact measurement (same model, runtime, settings, device, agent)."),
    profile: bool = typer.Option(False, "--profile", rich_help_panel=PANEL_MEASURE, help="Per-op profile of every variant on the device (the runtime's own profiler, ops mapped to PyTorch modules; default: the baseline and any variant slower than it)."),
    energy_command: Optional[str] = typer.Option(None, "--energy-command", rich_help_panel=PANEL_MEASURE, help="Command on the device that prints cumulative joules (a USB meter / Joulescope script); used after the target's energy sources."),
    benchmark_binary: Optional[str] = typer.Option(None, "--benchmark-binary", rich_help_panel=PANEL_MEASURE, help="Also measure each .tflite variant with this TFLite benchmark_model binary for the device (pushed, never downloaded), or 'device' for one already on it (e.g. /data/local/tmp/benchmark_model)."),
    devices: Optional[str] = typer.Option(None, "--devices", rich_help_panel=PANEL_FLEET, help="A fleet run: measure on every one of these inventory devices in parallel (comma-separated, e.g. pi-1,pi-2,pi-3); the gate judges the worst unit."),
    pool: Optional[str] = typer.Option(None, "--pool", rich_help_panel=PANEL_FLEET, help="A fleet run on every inventory device of TARGET with LABEL (TARGET:LABEL, e.g. rpi4:lab-a; labels: `devices add --label`)."),
    shard_eval: bool = typer.Option(False, "--shard-eval", rich_help_panel=PANEL_FLEET, help="Fleet: each unit scores its part of the eval set; the parts are combined into one metric (default: every unit scores all of it)."),
    fleet_gate: str = typer.Option("worst", "--fleet-gate", rich_help_panel=PANEL_FLEET, help="Fleet: judge the worst unit (default) or the median unit."),
    min_devices: Optional[int] = typer.Option(None, "--min-devices", rich_help_panel=PANEL_FLEET, help="Fleet: units that must be measured for the gate to pass (default: all)."),
    no_wait: bool = typer.Option(False, "--no-wait", rich_help_panel=PANEL_FLEET, help="Fail at once (exit 3) when another deploy holds the device, instead of waiting."),
    lock_timeout: Optional[float] = typer.Option(None, "--lock-timeout", rich_help_panel=PANEL_FLEET, help="Seconds to wait for a busy device before failing (default: wait)."),
    host_threads: Optional[int] = typer.Option(None, "--host-threads", rich_help_panel=PANEL_HOST, help=HOST_THREADS_HELP),
    out: Path = typer.Option(Path("edgekit-out"), "--out", "-o", rich_help_panel=PANEL_OUTPUT, help="Folder for report.json, report.md and artifacts."),
    as_json: bool = typer.Option(False, "--json", rich_help_panel=PANEL_OUTPUT, help="Print the report JSON on stdout instead of the summary."),
):
    from ..pipeline.deploy import DeployOptions, deploy
    from .common import parse_key_values

    if _is_lm(model):  # a language model: the generation workload (edgekit/orchestration/generate.py)
        given = {"--eval-data": eval_data, "--calib-data": calib_data, "--recipe": recipe, "--metric": metric,
                 "--arch": arch, "--devices": devices, "--pool": pool,
                 "--profile": profile or None, "--train-data": train_data, "--teacher": teacher,
                 "--size-budget-mb": size_budget_mb}
        refused = [k for k, v in given.items() if v]
        report = _deploy_lm(model, eval_text, refused, target, device, out, as_json, context=context, max_kld=max_kld,
                            max_ppl=max_perplexity_increase, objective=objective, threads=threads, warmup=warmup,
                            runs=runs, min_seconds=min_seconds, remeasure=remeasure, no_wait=no_wait,
                            lock_timeout=lock_timeout, memory_budget_mb=memory_budget_mb, sustained=sustained,
                            output_layer=output_layer, lm_variants=lm_variants, baseline=baseline,
                            max_latency_regression=max_latency_regression, top_k=top_k, search=search,
                            time_budget=time_budget)
        _finish(report, out, as_json)
        return
    if eval_data is None or eval_text is not None or context is not None or max_kld is not None \
            or max_perplexity_increase is not None or output_layer is not None or lm_variants is not None \
            or top_k is not None:
        from ..errors import BadInputError

        raise BadInputError("--eval-text, --context, --max-kld, --max-perplexity-increase, --output-layer and "
                            "--lm-variants are for a language model (a transformers model folder or a .gguf)"
                            if eval_data is not None else
                            f"{model} needs --eval-data (.npz of inputs and labels)",
                            hint="a fixed-graph model takes --eval-data; a language model folder takes --eval-text")

    opts = DeployOptions(max_accuracy_drop=max_accuracy_drop, relative_accuracy_drop=relative or None,
                         latency_budget_ms=latency_budget_ms, memory_budget_mb=memory_budget_mb, warmup=warmup,
                         runs=runs, min_seconds=min_seconds, threads=threads)
    opts.size_budget_mb, opts.teacher = size_budget_mb, teacher
    opts.baseline_report, opts.baseline_artifacts, opts.release_method = baseline, baseline_artifacts, release_method
    opts.metric, opts.postprocess, opts.strict_stats = metric, postprocess, strict_stats or None
    opts.eval_samples, opts.min_speedup = eval_samples, min_speedup
    opts.outputs = [o.strip() for v in output for o in v.split(",") if o.strip()] or None
    opts.metric_options = parse_key_values(metric_option, "--metric-option") or None
    from ..inputs.stateful import parse_constants, parse_state

    opts.constants, opts.state = parse_constants(const) or None, parse_state(state) or None
    opts.remeasure, opts.warmup_mode, opts.sustained_seconds = remeasure, warmup_mode, sustained
    opts.train_data, opts.use_cache = train_data, not no_cache
    opts.energy_command, opts.profile = energy_command, profile
    from ..agent.benchmark_model import validate_binary_option

    opts.benchmark_binary = validate_binary_option(benchmark_binary)
    opts.lock_wait, opts.lock_timeout = not no_wait, lock_timeout
    opts.host_threads = host_threads
    opts.devices = [d.strip() for d in devices.split(",") if d.strip()] if devices else None
    opts.pool, opts.shard_eval, opts.fleet_gate, opts.min_devices = pool, shard_eval, fleet_gate, min_devices
    opts.max_latency_regression, opts.max_release_accuracy_drop = max_latency_regression, max_release_accuracy_drop
    opts.max_memory_increase, opts.max_size_increase = max_memory_increase, max_size_increase
    if (recipe is not None or search is False) and not search and (objective != "p50" or time_budget is not None):
        from ..errors import BadInputError

        raise BadInputError("--objective and --time-budget steer a search; "
                            + ("a --recipe run measures the recipe's variants" if recipe is not None
                               else "--no-search measures the fixed default variants"),
                            hint="drop them, or drop " + ("--recipe" if recipe is not None else "--no-search"))
    sopts = _search_options(objective, time_budget, search)
    with progress_display(not as_json) as progress:
        report = deploy(model, eval_data=eval_data, target=target, device=device, calib_data=calib_data,
                        recipe=recipe, out=out, arch=arch, x_key=x_key, y_key=y_key, options=opts,
                        progress=progress, search=search, search_options=sopts)
    _finish(report, out, as_json)


def _finish(report, out: Path, as_json: bool) -> None:
    from .report import print_summary

    if report.search is not None and not as_json:
        _print_search(report)
    if as_json:
        print(json.dumps(report.model_dump(mode="json")))
    else:
        print_summary(report)
        out_console.print(f"report: {Path(out) / 'report.json'}, {Path(out) / 'report.md'}, "
                          f"{Path(out) / 'report.html'}, {Path(out) / 'junit.xml'}")
    if not report.gate.passed:
        raise typer.Exit(EXIT_GATE_FAILED)


def _is_lm(model: Path) -> bool:
    from ..llm.source import is_lm_source

    return is_lm_source(model)


def _deploy_lm(model: Path, eval_text: Path | None, refused: list[str], target: str, device: str | None, out: Path,
               as_json: bool, *, context, max_kld, max_ppl, objective: str, threads, warmup, runs, min_seconds,
               remeasure: bool, no_wait: bool, lock_timeout, memory_budget_mb, sustained, output_layer=None,
               lm_variants=None, baseline=None, max_latency_regression=None, top_k=None, search=None,
               time_budget=None):
    from ..errors import BadInputError
    from ..llm.judge import DEFAULT_MAX_KLD, DEFAULT_MAX_PPL_INCREASE, LMGate
    from ..llm.options import LMOptions
    from ..llm.release import ReleaseGate
    from ..pipeline.deploy import deploy

    if eval_text is None:
        raise BadInputError(f"{model} is a language model: it needs --eval-text FILE (plain text or JSONL of prompts)",
                            hint="e.g. --eval-text eval.txt: a few thousand tokens of text like what the app will see")
    if search and lm_variants:
        raise BadInputError("--search races every language-model variant; --lm-variants names some",
                            hint="drop one of them")
    if time_budget is not None and time_budget <= 0:
        raise BadInputError(f"--time-budget {time_budget:g}: a language model's budget is > 0 seconds",
                            hint="the default (900 s, 1800 s with --search) fits a ~100M model on 2 cores")
    if refused:
        raise BadInputError(f"a language model does not take {', '.join(refused)} (yet)",
                            hint="the language-model loop takes --eval-text, --context, --max-kld, "
                            "--max-perplexity-increase, --output-layer, --lm-variants, --baseline, --objective "
                            "decode|ttft|prefill, --time-budget and the measure options")
    opts = LMOptions(context=context, objective="decode" if objective == "p50" else objective,
                     gate=LMGate(max_kld=DEFAULT_MAX_KLD if max_kld is None else max_kld,
                                 max_perplexity_increase=DEFAULT_MAX_PPL_INCREASE if max_ppl is None else max_ppl,
                                 peak_memory_mb=memory_budget_mb),
                     threads=threads, warmup=warmup, runs=runs, min_seconds=min_seconds, remeasure=remeasure,
                     lock_wait=not no_wait, lock_timeout=lock_timeout, sustained_seconds=sustained,
                     head=output_layer or "int8",
                     candidates=tuple(v.strip() for v in lm_variants.split(",") if v.strip()) if lm_variants else None,
                     top_k=top_k, search=bool(search), time_budget_s=time_budget,
                     baseline=baseline, release=ReleaseGate() if max_latency_regression is None else
                     ReleaseGate(max_decode_regression=max_latency_regression))
    with progress_display(not as_json) as progress:
        return deploy(model, eval_text=eval_text, target=target, device=device, out=out, lm_options=opts,
                      progress=progress)  # the one entry (pipeline/deploy.py) a fixed graph takes too


def _search_options(objective: str, time_budget: float | None, search: bool | None):
    from ..errors import BadInputError
    from ..pipeline.deploy import QUICK_SEARCH_BUDGET_S
    from ..variant_search import SearchOptions

    if objective not in ("p50", "p99", "energy", "size"):
        raise BadInputError(f"--objective {objective!r} is not one of p50, p99, energy, size")
    if time_budget is not None and time_budget < 0:
        raise BadInputError(f"--time-budget {time_budget:g}: must be >= 0 seconds")
    budget = time_budget if time_budget is not None else (900.0 if search else QUICK_SEARCH_BUDGET_S)
    return SearchOptions(objective=objective, time_budget_s=budget)


def _print_search(report) -> None:
    s = report.search
    kind = "short search (no recipe; --search tries every candidate)" if s.mode == "quick" else "search"
    budgets = (s.budget or {}).get("budgets") or {}  # budget.py: {quantity: {limit, unit}}
    by = ("accuracy inside the " + " and ".join(f"{b['limit']:g} {b['unit']} {q}" for q, b in budgets.items())
          + (" budgets" if len(budgets) > 1 else " budget") if budgets else s.objective)
    out_console.print(f"{kind}: selected {s.selected or 'nothing'} by {by} in {s.seconds:.0f} s"
                      + (f"; shipping file {s.shipped.file}" if s.shipped else "")
                      + " (why each other candidate lost: below, under 'ship')", highlight=False)
    if s.timeline is not None:  # where the time went, and on what host
        from ..timeline import timeline_line

        host = (s.host or {}).get("summary")
        out_console.print(timeline_line(s.timeline) + (f"; {host}" if host else ""), highlight=False)
