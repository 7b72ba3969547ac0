"""The steps the orchestrations share, below all of them: ``deploy`` (pipeline/deploy.py) and a fleet run
(fleet.py) build a recipe's variants (:func:`build_recipe`) and measure every one in a session
(:func:`measure_all`); those two and the search (variant_search/run.py) measure with the run's
settings (:func:`run_settings`) and record them in the report (:func:`recorded_settings`). None of
the orchestrations imports another for these, so they sit in no import cycle.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any, Callable

from ..agent.host import current
from ..artifact import Artifact
from ..convert.torch_to_coreml import set_aside_coreml
from ..devices.session import DeviceSession, Measured, MeasureFailure, RunSettings
from ..errors import BadInputError, DeviceError, PassError
from ..formats import Format
from ..inputs.data import fixed_shape_misfit
from ..inputs.recipe import Recipe
from ..inputs.source import Source
from ..inputs.targets import MeasureDefaults
from ..measure.request import measure_options
from ..passes.base import PassContext
from ..passes.registry import get_pass
from .cache import PassCache, data_fingerprint, key_for
from .options import DeployOptions
from .prepare import PreparedRun

Progress = Callable[[str], None]


def build_variants(fp32: Artifact, recipe: Recipe, ctx: PassContext, progress: Progress,
                   source: Source | None = None, cache: PassCache | None = None) -> dict[str, Artifact]:
    """Run each variant's passes. PyTorch-level passes (prune, distill) start from the torch source
    and come first; the result is exported to ONNX (parity-checked, lineage kept) before the first
    ONNX-level pass or at the end. With ``cache`` (edgekit.orchestration.cache.PassCache) unchanged steps are reused."""
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


def _export_variant(art: Artifact, ctx: PassContext, stem: str, cache: PassCache | None) -> Artifact:
    from ..passes._torch import export_torch_artifact  # heavy (torch): keeps importing the steps light

    data = ctx.eval if ctx.eval is not None else ctx.calib
    if data is None:
        raise PassError(f"{stem}: exporting the PyTorch variant to ONNX needs eval or calibration inputs "
                        "for its parity check, and the run has neither", hint="pass --eval-data")
    xs = list(data.xs)
    dest = ctx.workdir / f"{stem}.onnx"
    if cache is None:
        return export_torch_artifact(art, dest, xs)
    key = key_for({"input": art.sha256, "convert": "torch->onnx", "data": data_fingerprint(ctx)})
    return cache.cached(key, art, ctx.workdir, stem, lambda: export_torch_artifact(art, dest, xs))


def build_recipe(run: PreparedRun, progress: Progress,
                 teacher: Artifact | None = None) -> tuple[dict[str, Artifact], float, list[str]]:
    """The prepared run's recipe variants (:func:`build_variants`, through the pass cache); returns them,
    the passes' seconds and the warnings (Core ML variants set aside where they cannot be measured).
    ``teacher``: the distill steps' default teacher (--teacher; else the source model)."""
    # convert steps (Core ML / litert-torch) start from the PyTorch program; accuracy-aware passes score with the plan
    ctx = PassContext(workdir=run.art_dir, calib=run.calib_ds, eval=run.eval_ds, train=run.train_ds, source=run.source,
                      metric_plan=run.plan, arch=run.arch or None,
                      teacher=teacher or (run.source.artifact if run.source.artifact.format == Format.TORCH else None))
    started = time.perf_counter()
    variants = build_variants(run.fp32, run.recipe, ctx, progress, source=run.source, cache=run.cache)
    variants, coreml_notes = set_aside_coreml(variants, run.target)  # Core ML prediction needs macOS
    for name, art in variants.items():
        if misfit := fixed_shape_misfit(art, run.eval_ds, run.source.artifact.io):
            raise BadInputError(f"variant {name}: {misfit}", hint="leave this variant out of the recipe, or deploy "
                                "it with the eval shards of one shape")
    return variants, round(time.perf_counter() - started, 3), list(coreml_notes)


def measure_all(session: DeviceSession, variants: dict[str, Artifact], settings: RunSettings, measure: MeasureDefaults,
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


def run_settings(run: PreparedRun, opts: DeployOptions) -> RunSettings:
    """What every measurement of the run is made with: the resolved measure settings, the deploy
    options' measurement options, the target's energy sources, the benchmark binary."""
    return RunSettings(measure=run.measure, options=measure_options(opts),
                       energy_sources=tuple(run.target.energy_sources), benchmark_binary=opts.benchmark_binary)


def recorded_settings(run: PreparedRun, settings: RunSettings, passes_seconds: float) -> dict[str, Any]:
    """What the report records beyond the resolved measure/gate/metric: the measurement extras and the
    passes' time and cache use."""
    cache = run.cache
    ht = current()
    stream = run.eval_ds.stream  # constant and state inputs (edgekit/inputs/stateful.py)
    return {"host": ht.to_dict() if ht is not None else None,
            **({"stream": stream.settings()} if stream is not None else {}),
            "measure_options": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(settings.options).items()},
            "benchmark_binary": str(settings.benchmark_binary) if settings.benchmark_binary is not None else None,
            "passes": {"seconds": passes_seconds, "cache": None if cache is None else
                       {"hits": cache.hits, "misses": cache.misses, "root": str(cache.root)}}}
