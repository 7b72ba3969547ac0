"""The closed loop: model -> ONNX (parity) -> passes -> device agent -> report -> gate.

``deploy`` is what `edgekit deploy` and release pipelines call. It validates every input before
doing heavy work, writes artifacts under ``out/artifacts/`` and the report files atomically, and
never writes a report for a run that failed (exit 2/3): an earlier report in ``out`` stays.
"""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import __version__
from .agent.bundle import BundleDeployer
from .agent.protocol import AgentResult, build_request, run_request
from .artifact import Artifact
from .convert.parity import compare
from .data import Dataset, check_fits, load_npz
from .errors import BadInputError, DeviceError, PassError
from .formats import Format, RUNTIME_FOR_FORMAT
from .fsutil import ensure_writable_dir
from .measure.stats import latency_stats
from .passes.base import PassContext
from .passes.registry import get_pass
from .recipe import GateConfig, Recipe, default_recipe, load_recipe
from .report.gate import compare_with_baseline, evaluate_gate
from .report.model import Report, VariantResult
from .source import Source, load_source
from .targets import MeasureDefaults, TargetSpec, load_target
from .transport.base import Transport

Progress = Callable[[str], None]


@dataclass
class DeployOptions:
    """Command-line / API overrides on top of the recipe and the target file (None = keep)."""

    max_accuracy_drop: float | None = None  # in the metric's units (points for top1); alias max_metric_drop
    relative_accuracy_drop: bool | None = None
    metric: str | None = None  # top1 | top5 | miou | map50 | mse ... or module:function (see edgekit.metrics)
    outputs: list[str] | None = None  # the outputs the metric reads (names or indices)
    postprocess: str | None = None  # detection: module:function turning raw outputs into boxes
    strict_stats: bool | None = None  # the accuracy check fails only on a statistically significant drop
    min_speedup: float | None = None  # fail a variant below this device-measured speed-up over the baseline
    latency_budget_ms: float | None = None
    memory_budget_mb: float | None = None
    warmup: int | None = None
    runs: int | None = None
    min_seconds: float | None = None
    threads: int | None = None
    max_seconds: float = 120.0
    extra_warnings: list[str] = field(default_factory=list)
    remeasure: bool = False  # measure again even when the measurement cache holds a valid result
    warmup_mode: str | None = None  # "fixed" (warmup runs) or "auto" (until latency stabilizes)
    sustained_seconds: float | None = None  # run each variant this long and report latency over time
    energy_command: list[str] | str | None = None  # device-side command printing cumulative joules
    train_data: str | Path | None = None  # .npz (x, y) for pruning fine-tunes and distillation (else the recipe's)
    use_cache: bool = True  # reuse pass outputs from edgekit.cache when nothing they depend on changed
    lock_wait: bool = True  # False: fail at once (exit 3) when another deploy holds the device
    lock_timeout: float | None = None  # seconds to wait for the device's lock (None = as long as it takes)
    # A previous report (the last release) to compare with; the release checks of the gate use it.
    baseline_report: str | Path | None = None
    max_latency_regression: float | None = None  # fraction, e.g. 0.1 (significant and above this fails)
    max_release_accuracy_drop: float | None = None  # points vs the baseline report
    max_memory_increase: float | None = None  # fraction
    max_size_increase: float | None = None  # fraction
    # also measure each .tflite variant with TFLite's own benchmark_model: the user's binary (pushed by
    # content, never downloaded) or "device" (one already on the device); see edgekit/agent/benchmark_model.py
    benchmark_binary: str | Path | None = None
    eval_samples: int | None = None  # score a fixed, seeded, stratified subset of the eval set (recorded)


def _noop(_: str) -> None:
    pass


def resolve_measure(target: TargetSpec, recipe: Recipe, opts: DeployOptions) -> MeasureDefaults:
    m = target.measure.model_dump()
    m.update({k: v for k, v in recipe.measure.model_dump().items() if v is not None})
    for k in ("warmup", "runs", "min_seconds", "threads"):
        if getattr(opts, k) is not None:
            m[k] = getattr(opts, k)
    return MeasureDefaults(**m)


def resolve_gate(target: TargetSpec, recipe: Recipe, opts: DeployOptions) -> GateConfig:
    g = recipe.gate.model_dump()
    # the target's budgets apply unless the recipe sets its own
    for k in ("latency_ms_p50", "latency_ms_p90", "peak_memory_mb", "model_size_mb"):
        if g.get(k) is None:
            g[k] = getattr(target.limits, k)
    if opts.max_accuracy_drop is not None:
        g["max_accuracy_drop"] = opts.max_accuracy_drop
    if opts.relative_accuracy_drop is not None:
        g["relative_accuracy_drop"] = opts.relative_accuracy_drop
    if opts.strict_stats is not None:
        g["strict_stats"] = opts.strict_stats
    if opts.min_speedup is not None:
        g["min_speedup"] = opts.min_speedup
    if opts.latency_budget_ms is not None:
        g["latency_ms_p50"] = opts.latency_budget_ms
    if opts.memory_budget_mb is not None:
        g["peak_memory_mb"] = opts.memory_budget_mb
    for k in ("max_latency_regression", "max_release_accuracy_drop", "max_memory_increase", "max_size_increase"):
        if getattr(opts, k) is not None:
            g[k] = getattr(opts, k)
    from .config import validate

    return validate(GateConfig, g, "gate settings", hint="--max-accuracy-drop is in points, 0 to 100")


def resolve_metric_spec(recipe: Recipe, opts: DeployOptions):
    """The recipe's metric section with --metric / --output / --postprocess on top."""
    from .metrics import MetricSpec, get_metric

    spec = recipe.metric.model_copy() if recipe.metric is not None else MetricSpec()
    if opts.metric is not None:
        spec = spec.model_copy(update={"name": opts.metric})
    if opts.outputs:
        spec = spec.model_copy(update={"outputs": list(opts.outputs)})
    if opts.postprocess is not None:
        spec = spec.model_copy(update={"postprocess": opts.postprocess})
    get_metric(spec.name, spec.options, spec.postprocess)  # an unknown name fails here, before any work
    return spec


def open_transport(target: TargetSpec, device: str | None, opts: DeployOptions | None = None) -> Transport:
    if device is None:
        if target.transport == "local":
            from .transport.local import LocalTransport

            return LocalTransport()
        raise BadInputError(f"target '{target.name}' is reached over {target.transport}: name the device",
                            hint="pass --device NAME (see `edgekit devices list`), or use --target local")
    try:
        from .devices import open_device_transport
    except ImportError as exc:
        raise BadInputError(f"device '{device}': this edgekit has no device inventory yet") from exc
    opts = opts or DeployOptions()
    return open_device_transport(device, target, wait=opts.lock_wait, lock_timeout=opts.lock_timeout)


def build_variants(fp32: Artifact, recipe: Recipe, ctx: PassContext, progress: Progress,
                   source: Source | None = None, cache: Any = None) -> dict[str, Artifact]:
    """Run each variant's passes. PyTorch-level passes (prune, distill) start from the torch source
    and come first; the result is exported to ONNX (parity-checked, lineage kept) before the first
    ONNX-level pass or at the end. With ``cache`` (edgekit.cache.PassCache) unchanged steps are reused."""
    variants: dict[str, Artifact] = {recipe.baseline: fp32}
    for spec in recipe.variants:  # check the order of every variant before any heavy work
        onnx_seen = False
        for step in spec.passes:
            fmts = get_pass(step.name).input_formats
            if fmts == (Format.TORCH,) and onnx_seen:
                raise PassError(f"variant {spec.name}: pass '{step.name}' works on the PyTorch model and must come "
                                "before the ONNX-level passes", hint="reorder the variant's passes")
            onnx_seen = onnx_seen or Format.TORCH not in fmts
    for spec in recipe.variants:
        art = fp32
        passes = [get_pass(step.name) for step in spec.passes]
        if passes and Format.TORCH in passes[0].input_formats:
            if source is None or source.artifact.format != Format.TORCH:
                raise PassError(f"variant {spec.name}: pass '{passes[0].name}' works on the PyTorch model, but the "
                                "model is not a PyTorch program", hint="deploy the .pt2 (or .pth with --arch)")
            art = source.artifact
        for i, (step, p) in enumerate(zip(spec.passes, passes)):
            if art.format == Format.TORCH and Format.TORCH not in p.input_formats:
                progress(f"variant {spec.name}: exporting to ONNX")
                art = _export_variant(art, ctx, f"{spec.name}-{i}-onnx", cache)
            elif art.format != Format.TORCH and p.input_formats == (Format.TORCH,):
                raise PassError(f"variant {spec.name}: pass '{p.name}' works on the PyTorch model and must come "
                                "before the ONNX-level passes", hint="reorder the variant's passes")
            progress(f"variant {spec.name}: pass {step.name}")
            out_name = f"{spec.name}-{i}-{step.name}"
            art = cache.run(p, art, step.config, ctx, out_name) if cache else p(art, step.config, ctx, out_name=out_name)
        if art.format == Format.TORCH:
            progress(f"variant {spec.name}: exporting to ONNX")
            art = _export_variant(art, ctx, f"{spec.name}-onnx", cache)
        variants[spec.name] = art
    return variants


def _export_variant(art: Artifact, ctx: PassContext, stem: str, cache: Any) -> Artifact:
    from .passes._torch import export_torch_artifact

    xs = list(ctx.eval.xs) if ctx.eval is not None else list(ctx.calib.xs)
    dest = ctx.workdir / f"{stem}.onnx"
    if cache is None:
        return export_torch_artifact(art, dest, xs)
    from .cache import data_fingerprint, key_for

    key = key_for({"input": art.sha256, "convert": "torch->onnx", "data": data_fingerprint(ctx)})
    return cache.cached(key, art, ctx.workdir, stem, lambda: export_torch_artifact(art, dest, xs))


def profile(model: Any, *, eval_data: str | Path, target: str | TargetSpec = "local", device: str | None = None,
            out: str | Path = "edgekit-out", **kwargs: Any) -> Report:
    """Measure a model as it is (.pt2/.onnx/.tflite or an nn.Module), no compression: one variant,
    the same agent, report and gate (budgets) as :func:`deploy`."""
    return deploy(model, eval_data=eval_data, target=target, device=device, out=out,
                  recipe=Recipe(baseline="model", variants=[]), **kwargs)


def deploy(
    model: Any,
    *,
    eval_data: str | Path,
    target: str | TargetSpec = "local",
    device: str | None = None,
    calib_data: str | Path | None = None,
    recipe: str | Path | Recipe | None = None,
    out: str | Path = "edgekit-out",
    example_inputs: tuple | None = None,
    arch: str | None = None,
    x_key: str | tuple[str, ...] = "x",
    y_key: str = "y",
    options: DeployOptions | None = None,
    progress: Progress | None = None,
    transport: Transport | None = None,
    **overrides: Any,
) -> Report:
    """Compress ``model``, measure every variant on the device, write and return the report.

    ``model`` is a path (.pt2, .onnx, or .pt/.pth with ``arch='module:Class'``) or an
    ``nn.Module`` with ``example_inputs``. ``x_key`` names the input arrays (``"a,b"`` or a tuple
    for several inputs; arrays named like the model's inputs are matched without it). Keyword overrides (``max_accuracy_drop=0.5``,
    ``latency_budget_ms=2``, ``runs=100``...) are the fields of :class:`DeployOptions`.
    """
    progress = progress or _noop
    opts = options or DeployOptions()
    for k, v in overrides.items():
        if not hasattr(opts, k):
            raise TypeError(f"deploy() got an unexpected keyword argument {k!r}")
        setattr(opts, k, v)
    started = time.perf_counter()

    # --- validate everything cheap first -----------------------------------------------------
    spec = target if isinstance(target, TargetSpec) else load_target(target)
    rec = recipe if isinstance(recipe, Recipe) else (load_recipe(recipe) if recipe else default_recipe(calib_data is not None))
    from .passes.convert import variants_for_target

    # litert targets (rpi4, Android) get TFLite variants, Core ML targets Core ML ones, unless the recipe converts
    rec = variants_for_target(rec, spec, calib_data is not None)
    measure = resolve_measure(spec, rec, opts)
    from .measure.request import check_measure_options

    check_measure_options(opts)
    gate_cfg = resolve_gate(spec, rec, opts)
    metric_spec = resolve_metric_spec(rec, opts)
    out_dir = ensure_writable_dir(out)
    from .data import take_subset

    eval_ds = take_subset(load_npz(eval_data, x_key=x_key, y_key=y_key, require_labels=False, role="eval"),
                          opts.eval_samples)
    baseline_report = Report.load(opts.baseline_report) if opts.baseline_report is not None else None
    calib_ds = load_npz(calib_data, x_key=x_key, y_key=None, require_labels=False, role="calib") if calib_data else None
    train_path = opts.train_data or rec.train_data
    train_ds = load_npz(train_path, x_key=x_key, y_key=y_key, require_labels=True, role="train") if train_path else None
    art_dir = out_dir / "artifacts"
    art_dir.mkdir(exist_ok=True)
    if example_inputs is None:
        example_inputs = tuple(x[0:1] for x in eval_ds.xs)

    # --- model -> fp32 ONNX ------------------------------------------------------------------
    progress("loading the model")
    source = load_source(model, example_inputs=example_inputs, arch=arch, workdir=art_dir)
    eval_ds = check_fits(eval_ds, source.artifact.io, "eval")
    if calib_ds is not None:
        calib_ds = check_fits(calib_ds, source.artifact.io, "calib")
    if train_ds is not None:
        train_ds = check_fits(train_ds, source.artifact.io, "train")
    from .metrics.evaluate import eval_plan

    progress("computing reference outputs (and checking the metric fits them)")
    plan = eval_plan(metric_spec, source, eval_ds)
    from .cache import default_cache

    cache = default_cache() if opts.use_cache else None
    xs = [x for x in eval_ds.xs]
    if source.artifact.format == Format.TORCH:
        progress("exporting to ONNX (parity check on the eval inputs)")
        from .convert.torch_to_onnx import export_onnx

        if cache is None:
            fp32 = export_onnx(source, art_dir / "fp32.onnx", xs)
        else:  # the dynamo export is seconds: reuse it when the model and the eval inputs are unchanged
            from .cache import key_for
            from .fsutil import sha256_file

            key = key_for({"input": source.artifact.sha256, "convert": "torch->onnx", "eval": sha256_file(eval_ds.path)})
            fp32 = cache.cached(key, source.artifact, art_dir, "fp32", lambda: export_onnx(source, art_dir / "fp32.onnx", xs))
    else:
        fp32 = source.artifact

    # --- passes -------------------------------------------------------------------------------
    extras: dict[str, Any] = {"arch": arch} if arch else {}
    extras["source"] = source  # convert steps: Core ML / litert-torch start from the PyTorch program
    extras["metric_plan"] = plan  # accuracy-aware passes score with the deploy's metric
    if source.artifact.format == Format.TORCH:
        extras["teacher"] = source.artifact  # distill's default teacher
    ctx = PassContext(workdir=art_dir, calib=calib_ds, eval=eval_ds, train=train_ds, extras=extras)
    passes_started = time.perf_counter()
    variants = build_variants(fp32, rec, ctx, progress, source=source, cache=cache)
    from .convert.torch_to_coreml import set_aside_coreml

    variants, coreml_notes = set_aside_coreml(variants, spec)  # Core ML prediction needs macOS
    opts.extra_warnings.extend(coreml_notes)
    passes_seconds = round(time.perf_counter() - passes_started, 3)

    # --- on the device ------------------------------------------------------------------------
    own_transport = transport is None
    t = transport or open_transport(spec, device, opts)
    try:
        progress(f"deploying the bundle to {t.describe()}")
        deployer = BundleDeployer(t)
        # transports that know the device beyond the agent (adb: getprop, battery) describe it before and after
        platform_before = t.device_facts() if hasattr(t, "device_facts") else None
        eval_file = _eval_bundle_file(eval_ds, art_dir)
        remotes = deployer.deliver([*eval_files(eval_file), *{a.path for a in variants.values()}])
        results: dict[str, AgentResult] = {}
        bench: dict[str, dict] = {}  # benchmark_model's figures per .tflite variant
        from .measure.cache import open_device_measurements
        from .measure.request import apply_measure_options

        measurements = open_device_measurements(deployer, device_name=device, remeasure=opts.remeasure)
        for name, art in variants.items():
            progress(f"measuring {name} on the device ({measure.runs}+ runs, >= {measure.min_seconds:g} s)")
            req = build_request(
                variant=name, artifact=art, model_remote=remotes[art.path], source_io=source.artifact.io,
                measure=measure, eval_remote=eval_remote(eval_file, remotes), x_keys=eval_ds.x_keys,
                y_key=eval_ds.y_key,
                outputs_remote=t.remote_path(f"results/{name}-{art.sha256[:12]}.npz"),
                energy_sources=spec.energy_sources, max_seconds=opts.max_seconds,
            )
            apply_measure_options(req, opts)
            try:
                results[name] = measurements.measure(req, lambda req=req: run_request(deployer, req))
            except DeviceError as exc:
                # say what was and was not measured; no report is written for a failed run
                done = ", ".join(results) or "none"
                exc.message += f" (measured before the failure: {done}; not measured: " \
                    f"{', '.join(n for n in variants if n not in results)}; no report written)"
                raise
            if opts.benchmark_binary is not None and art.format == Format.TFLITE:
                progress(f"measuring {name} with benchmark_model")
                bench[name] = _benchmark_model(t, remotes[art.path], opts.benchmark_binary, measure)
        delivery = deployer.stats
        platform_after = t.device_facts() if platform_before is not None else None
    finally:
        if own_transport:
            t.close()

    # --- report --------------------------------------------------------------------------------
    progress("writing the report")
    vresults = [_variant_result(name, art, results[name], plan) for name, art in variants.items()]
    for v in vresults:
        v.measurement = measurements.info.get(v.name, {})
        if v.name in bench:  # a second latency/memory source; accuracy and parity stay the Python agent's
            v.benchmark_model = bench[v.name]
    base = next(v for v in vresults if v.name == rec.baseline)
    from .metrics.evaluate import score_drops

    warnings = list(opts.extra_warnings)
    warnings += score_drops(vresults, {n: r.outputs for n, r in results.items() if r.outputs is not None}, plan,
                            rec.baseline, tolerance=_tolerance(gate_cfg, base))
    for v in vresults:
        if v.latency_ms and base.latency_ms and v.latency_ms.p50 > 0:
            v.speedup_vs_baseline = round(base.latency_ms.p50 / v.latency_ms.p50, 3)
    gate = evaluate_gate(vresults, rec.baseline, gate_cfg, latency_representative=_emulation(device) is None)
    from .report.gate import slower_warnings

    warnings += slower_warnings(vresults, rec.baseline)
    first = results[rec.baseline].doc
    for v in vresults:
        if v.latency_ms and not v.latency_ms.stable:
            warnings.append(f"{v.name}: latency is unstable (robust CoV {v.latency_ms.robust_cov or 0:.1%}, "
                            f"CoV {v.latency_ms.cov:.1%}); the device may be busy")
        warnings += [f"{v.name}: {w}" for w in results[v.name].doc.get("warnings") or []]
        warnings += [f"{v.name}: {w}" for w in (v.sustained or {}).get("warnings", [])]
    if measurements.warning():
        warnings.append(measurements.warning())
    emulation = _emulation(device)
    if emulation:
        warnings.append(f"device {device} is emulated ({emulation}): latency and memory figures are NOT "
                        "representative of real hardware; accuracy, parity and the deploy path are real")
    report = Report(
        edgekit_version=__version__,
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        target=spec.name,
        device=_platform_facts(platform_before, platform_after) | _device_info(first, t, device, spec, vresults, emulation),
        model={"source": str(model) if not hasattr(model, "forward") else type(model).__name__,
               "sha256": source.artifact.sha256, "format": source.artifact.format.value,
               "inputs": [i.model_dump(mode="json") for i in source.artifact.io.inputs]},
        settings={"measure": measure.model_dump(), "gate": gate_cfg.model_dump(), "recipe": rec.model_dump(mode="json"),
                  "metric": _metric_settings(plan),
                  "eval_data": str(eval_ds.path), "eval_samples": eval_ds.n, "eval_inputs": list(eval_ds.x_keys),
                  "eval_subset": eval_ds.sample,
                  "calib_data": str(calib_ds.path) if calib_ds else None,
                  "delivery": {"files_sent": delivery.files_sent, "files_reused": delivery.files_reused,
                               "bytes_sent": delivery.bytes_sent},
                  "wall_seconds": round(time.perf_counter() - started, 2),
                  "train_data": str(train_ds.path) if train_ds else None,
                  "passes": {"seconds": passes_seconds, "cache": None if cache is None else
                             {"hits": cache.hits, "misses": cache.misses, "root": str(cache.root)}}},
        baseline=rec.baseline,
        variants=vresults,
        gate=gate,
        warnings=warnings,
    )
    if baseline_report is not None:
        compare_with_baseline(report, baseline_report, opts.baseline_report, gate_cfg)
    report.write(out_dir)
    return report


def _eval_bundle_file(ds: Dataset, art_dir: Path) -> Path | list[dict[str, Path]]:
    """The eval set as the agent reads it: a folder's .npy shards as they are (each delivered by
    content, so an unchanged shard is never re-sent, and the device reads one shard at a time); the
    user's .npz when it holds only what is needed; else a trimmed copy."""
    import zipfile

    if ds.shards is not None and ds.sample is None:
        return [{k: sh[k] for k in ds.x_keys} for sh in ds.shards]
    if ds.shards is None and ds.sample is None:
        with zipfile.ZipFile(ds.path) as z:
            names = {n.removesuffix(".npy") for n in z.namelist()}
        if names <= set(ds.x_keys) | {ds.y_key}:
            return ds.path
    out = art_dir / "eval-bundle.npz"
    arrays = {k: x for k, x in zip(ds.x_keys, ds.xs)}
    if ds.y is not None:
        arrays[ds.y_key] = ds.y
    np.savez(out, **arrays)
    return out


def eval_files(bundle: Path | list[dict[str, Path]]) -> list[Path]:
    return [bundle] if isinstance(bundle, Path) else [f for sh in bundle for f in sh.values()]


def eval_remote(bundle: Path | list[dict[str, Path]], remotes: dict[Path, str]) -> str | list[dict[str, str]]:
    if isinstance(bundle, Path):
        return remotes[bundle]
    return [{k: remotes[f] for k, f in sh.items()} for sh in bundle]


def _tolerance(cfg: GateConfig, base: VariantResult) -> float | None:
    """The accuracy tolerance in the metric's units (relative: percent of the baseline's value)."""
    if base.accuracy is None:
        return None
    return cfg.max_accuracy_drop * (abs(base.accuracy.value) / 100.0 if cfg.relative_accuracy_drop else 1.0)


def _metric_settings(plan) -> dict:
    return {"name": plan.metric.label(), "direction": plan.metric.direction, "units": plan.metric.units,
            "outputs": [plan.output_names[i] for i in plan.output_idx], "against": plan.against,
            "all_outputs": plan.output_names, **({"postprocess": plan.spec.postprocess} if plan.spec.postprocess else {}),
            **({"options": plan.spec.options} if plan.spec.options else {})}


def _variant_result(name: str, art: Artifact, res: AgentResult, plan) -> VariantResult:
    doc = res.doc
    lat = doc["latency_ms"]
    stats = latency_stats(lat["raw"])
    parity = parity_outputs = accuracy = None
    if res.outputs is not None:
        parity_outputs = plan.parity(res.outputs)
        parity = next(iter(parity_outputs.values()), None)
        accuracy = plan.accuracy_dict(plan.score(res.outputs))
    mem = doc.get("memory") or {}
    energy = doc.get("energy") or {}
    from .measure.sustained import analyze

    sustained = analyze(doc.get("sustained"))
    return VariantResult(
        name=name,
        format=art.format.value,
        precision=art.precision,
        runtime={**doc["runtime"]},
        size_bytes=art.size_bytes,
        sha256=art.sha256,
        artifact_path=str(art.path),
        lineage=art.lineage_dicts(),
        load_ms=doc.get("load_ms"),
        latency_ms={"warmup": lat["warmup"], "runs": lat["runs"], "raw": lat["raw"], **stats.to_dict(),
                    **{k: lat[k] for k in lat if k.startswith("warmup_")},
                    **({"runs": lat["runs"], "raw_decimation": lat["raw_decimation"]}
                       if (lat.get("raw_decimation") or 1) > 1 else {})},
        peak_memory_mb=mem.get("peak_rss_mb"),
        memory=mem,
        energy_mj_per_inference=energy.get("energy_mj_per_inference"),
        energy_source=energy.get("source"),
        energy_reason=energy.get("reason"),
        energy=energy,
        sustained=sustained,
        accuracy=accuracy,
        parity=parity,
        parity_outputs=parity_outputs if parity_outputs and len(parity_outputs) > 1 else None,
        device_state=doc.get("device_state") or {},
    )


def _emulation(device: str | None) -> str | None:
    """How the device is emulated (an arm64 twin under qemu, from its inventory entry); None = real."""
    if device is None:
        return None
    from .devices import get_device

    try:
        entry = get_device(device)
    except BadInputError:
        return None
    return (entry.notes or "CPU emulation") if entry.emulated else None


def _benchmark_model(t: Transport, model_remote: str, binary: str | Path, measure: MeasureDefaults) -> dict:
    from .agent.benchmark_model import run_benchmark_model

    exe = None if str(binary) == "device" else Path(binary)
    r = run_benchmark_model(t, model_remote, binary=exe, threads=measure.threads, warmup=measure.warmup,
                            runs=measure.runs, min_seconds=measure.min_seconds)
    return r.to_report()


def _platform_facts(before: dict | None, after: dict | None) -> dict:
    """An Android device's facts (model, SoC, version, clocks, battery) from the adb transport."""
    if before is None:
        return {}
    return {"android": before, "battery_temperature_c": {"before": before.get("battery_temperature_c"),
                                                         "after": (after or {}).get("battery_temperature_c")}}


def _device_info(doc: dict, t: Transport, device: str | None, spec: TargetSpec, vresults,
                 emulation: str | None = None) -> dict:
    facts = dict(doc.get("device") or {})
    states = [v.device_state for v in vresults if v.device_state]
    before = states[0].get("before", {}) if states else {}
    after = states[-1].get("after", {}) if states else {}
    facts.update({
        "name": device or ("localhost" if t.kind == "local" else t.describe()),
        "transport": t.kind,
        "governor": before.get("governor"),
        "frequency_mhz": before.get("frequency_mhz"),
        "temperature_c": {"before": before.get("temperature_c"), "after": after.get("temperature_c")},
        "loadavg_before": before.get("loadavg"),
        "target_arch": spec.arch,
    })
    if emulation:  # the report's readers (and the gate's users) must know the timings are not the board's
        facts.update({"emulated": True, "emulation": emulation, "latency_representative": False})
    return facts


__all__ = ["deploy", "DeployOptions", "DeviceError", "RUNTIME_FOR_FORMAT"]
