"""The closed loop: model -> ONNX (parity) -> passes -> device agent -> report -> gate.

``deploy`` is what `edgekit deploy` and release pipelines call. It validates every input before
doing heavy work (``prepare.prepare_run``), builds the recipe's variants, measures them in one
``DeviceSession``, and writes the report (``report.assemble``) atomically; it never writes a report
for a run that failed (exit 2/3): an earlier report in ``out`` stays.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any, Callable

from .artifact import Artifact
from .device_session import DeviceSession, Measured, MeasureFailure, RunSettings, device_info, emulation_of
from .errors import DeviceError, PassError
from .formats import Format, RUNTIME_FOR_FORMAT
from .options import DeployOptions, resolve_gate, resolve_measure, resolve_metric_spec
from .passes.base import PassContext
from .passes.registry import get_pass
from .prepare import PreparedRun, prepare_run, resolve_recipe, target_spec
from .recipe import Recipe
from .report.model import Report
from .source import Source
from .targets import TargetSpec
from .transport.base import Transport

Progress = Callable[[str], None]


def _noop(_: str) -> None:
    pass


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
    search: bool | None = None,
    search_options: Any = None,
    **overrides: Any,
) -> Report:
    """Compress ``model``, measure the variants on the device, write and return the report.

    ``model`` is a path (.pt2, .onnx, or .pt/.pth with ``arch='module:Class'``) or an
    ``nn.Module`` with ``example_inputs``. ``x_key`` names the input arrays (``"a,b"`` or a tuple
    for several inputs; arrays named like the model's inputs are matched without it). Keyword overrides
    (``max_accuracy_drop=0.5``, ``latency_budget_ms=2``, ``runs=100``...) are the fields of :class:`DeployOptions`.

    Which variants: a ``recipe``'s; without one, a short search over the target's likeliest winners
    (``variant_search``; ``search=True`` tries every candidate, ``search=False`` measures the fixed
    default recipe: fp32 + INT8 static, or dynamic without calibration data). ``search_options`` is a
    :class:`edgekit.variant_search.SearchOptions` (objective, time budget...).
    """
    progress = progress or _noop
    try:
        opts = copy.copy(options or DeployOptions()).update(overrides)  # the caller's options stay as given
        opts.extra_warnings = list(opts.extra_warnings)
    except TypeError as exc:
        raise TypeError(f"deploy() got an {exc}") from None
    spec = target_spec(target)
    mode = variant_mode(recipe, search, opts, spec, calib_data is not None)
    if mode != "recipe":
        from .variant_search import SearchOptions
        from .variant_search import search as run_search

        sopts = dataclasses.replace(search_options or SearchOptions(
            time_budget_s=QUICK_SEARCH_BUDGET_S if mode == "quick" else 900.0), quick=mode == "quick")
        return run_search(model, eval_data=eval_data, calib_data=calib_data, target=spec, device=device, out=out,
                          options=sopts, deploy_options=opts, example_inputs=example_inputs, arch=arch, x_key=x_key,
                          y_key=y_key, transport=transport, progress=progress)
    from .host import host_compute, host_threads

    ht = host_threads(opts.host_threads)
    progress(ht.describe())
    with host_compute(ht):
        if opts.devices or opts.pool:  # a fleet run: every unit of a pool, in parallel (edgekit/fleet.py)
            from .fleet import deploy_fleet
            return deploy_fleet(model, eval_data=eval_data, target=spec, device=device, calib_data=calib_data,
                                recipe=recipe, out=out, example_inputs=example_inputs, arch=arch, x_key=x_key,
                                y_key=y_key, options=opts, progress=progress, transport=transport)
        return _deploy_recipe(model, spec, recipe, eval_data, calib_data, device, out, example_inputs, arch, x_key,
                              y_key, opts, progress, transport)


def _deploy_recipe(model, spec: TargetSpec, recipe, eval_data, calib_data, device, out, example_inputs, arch, x_key,
                   y_key, opts: DeployOptions, progress: Progress, transport) -> Report:
    rec = resolve_recipe(recipe, spec, calib_data is not None)
    run = prepare_run(model, eval_data=eval_data, target=spec, recipe=rec, opts=opts, calib_data=calib_data, out=out,
                      example_inputs=example_inputs, arch=arch, x_key=x_key, y_key=y_key, progress=progress)
    variants, passes_seconds, warnings = _build(run, progress)
    settings = run_settings(run, opts)
    with DeviceSession(spec, device, source_io=run.source.artifact.io, plan=run.plan, transport=transport,
                       lock_wait=opts.lock_wait, lock_timeout=opts.lock_timeout, remeasure=opts.remeasure,
                       progress=progress) as session:
        session.use_eval(run.eval_ds, run.art_dir)
        session.deliver(variants.values())
        measured = measure_all(session, variants, settings, run.measure, progress)
        from .measure.profile import profile_diffs, profile_variants, profiled_names

        profile_variants(session, measured, profiled_names(measured, rec.baseline, opts.profile), settings)
        judged = [n for n in variants if n != rec.baseline] or [rec.baseline]
        from .report.release import release_judgement

        release = release_judgement(session, run, measured, judged, settings, opts, progress)
    progress("writing the report")
    from .report.assemble import assemble_report

    report = assemble_report(run, measured, session, baseline=rec.baseline, warnings=opts.extra_warnings + warnings,
                             release=release, settings=recorded_settings(run, settings, passes_seconds))
    report.profile_diffs = profile_diffs(report.variants, rec.baseline)
    if len(variants) > 1:  # the answer: what to ship, and why the others lost
        from .report.decision import decide
        from .ship import write_ship

        report.decision = decide(report.variants, rec.baseline, run.gate, representative=session.emulation is None)
        if report.decision.ship is not None:
            write_ship(run.out_dir, report.variant(report.decision.ship), variants[report.decision.ship])
    report.write(run.out_dir)
    return report


QUICK_SEARCH_BUDGET_S = 300.0  # the default deploy's short search; `--search` defaults to 900 s


def variant_mode(recipe, search: bool | None, opts: DeployOptions, spec: TargetSpec, has_calib: bool) -> str:
    """"recipe" (measure the given or the fixed default recipe), "quick" (no recipe: the short search)
    or "full" (``search=True``). Without a recipe, options only a recipe run honours (the fleet
    options) keep the fixed default recipe and the report says so."""
    from .errors import BadInputError

    if search and recipe is not None:
        raise BadInputError("--search builds its own candidates; it does not take --recipe",
                            hint="drop --recipe, or drop --search to measure the recipe's variants")
    if search:
        return "full"
    if search is False or recipe is not None:
        return "recipe"
    from .options import search_refusal

    refused = search_refusal(opts)
    if refused is None:
        from .variant_search.candidates import candidate_variants

        if candidate_variants(spec, has_calib=has_calib, quick=True)[0]:
            return "quick"
        why = f"target {spec.name} has no runtime the search can measure here ({', '.join(spec.runtimes)})"
    else:
        why = (f"the search takes no --{refused.replace('_', '-')} (it measures on one device; to measure its "
               "choice on every unit, run it on one unit and put the shipped variant in a recipe)")
    opts.extra_warnings.append(f"no recipe: measured the fixed default variants, not the short search: {why}")
    return "recipe"


def run_settings(run: PreparedRun, opts: DeployOptions) -> RunSettings:
    from .measure.request import measure_options

    return RunSettings(measure=run.measure, options=measure_options(opts),
                       energy_sources=tuple(run.target.energy_sources), benchmark_binary=opts.benchmark_binary)


def recorded_settings(run: PreparedRun, settings: RunSettings, passes_seconds: float) -> dict:
    """What the report records beyond the resolved measure/gate/metric: the measurement extras and the
    passes' time and cache use."""
    from dataclasses import asdict

    from .host import current

    cache = run.cache
    ht = current()
    return {"host": ht.to_dict() if ht is not None else None,
            "measure_options": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(settings.options).items()},
            "benchmark_binary": str(settings.benchmark_binary) if settings.benchmark_binary is not None else None,
            "passes": {"seconds": passes_seconds, "cache": None if cache is None else
                       {"hits": cache.hits, "misses": cache.misses, "root": str(cache.root)}}}


def measure_all(session: DeviceSession, variants: dict[str, Artifact], settings: RunSettings, measure,
                progress: Progress) -> dict[str, Measured]:
    """Every variant, in order; any failure stops the run (a deploy measures all or reports nothing)."""
    measured: dict[str, Measured] = {}
    for name, art in variants.items():
        progress(f"measuring {name} on the device ({measure.runs}+ runs, >= {measure.min_seconds:g} s)")
        pending = [n for n in variants if n not in measured]
        try:
            res = session.measure(name, art, settings)
        except DeviceError as exc:
            # say what was and was not measured; no report is written for a failed run
            exc.message += (f" (measured before the failure: {', '.join(measured) or 'none'}; not measured: "
                            f"{', '.join(pending)}; no report written)")
            raise
        if isinstance(res, MeasureFailure):
            raise res.error(list(measured), pending)
        measured[name] = res
    return measured


def _build(run: PreparedRun, progress: Progress) -> tuple[dict[str, Artifact], float, list[str]]:
    import time

    # convert steps (Core ML / litert-torch) start from the PyTorch program; accuracy-aware passes score with the plan
    extras: dict[str, Any] = {"source": run.source, "metric_plan": run.plan, **({"arch": run.arch} if run.arch else {})}
    if run.source.artifact.format == Format.TORCH:
        extras["teacher"] = run.source.artifact  # distill's default teacher
    ctx = PassContext(workdir=run.art_dir, calib=run.calib_ds, eval=run.eval_ds, train=run.train_ds, extras=extras)
    started = time.perf_counter()
    variants = build_variants(run.fp32, run.recipe, ctx, progress, source=run.source, cache=run.cache)
    from .convert.torch_to_coreml import set_aside_coreml

    variants, coreml_notes = set_aside_coreml(variants, run.target)  # Core ML prediction needs macOS
    return variants, round(time.perf_counter() - started, 3), list(coreml_notes)




# kept for callers of the old names
_device_info = device_info
_emulation = emulation_of

__all__ = ["deploy", "profile", "DeployOptions", "DeviceError", "RUNTIME_FOR_FORMAT", "resolve_gate",
           "resolve_measure", "resolve_metric_spec"]
