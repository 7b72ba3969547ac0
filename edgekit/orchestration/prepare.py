"""Everything a run checks and loads before any pass or device time: the target, the options, the
output folder, the data, the previous report, the model, the metric plan and the fp32 ONNX model.
``deploy`` and ``search`` both start here, so a bad input fails the same way (exit 2) in both."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from ..artifact import Artifact
from ..convert.torch_to_onnx import export_onnx
from ..errors import BadInputError
from ..formats import Format
from ..fsutil import ensure_writable_dir, sha256_file
from ..inputs.data import Dataset, check_fits, fixed_shape_misfit, load_npz, take_subset
from ..inputs.recipe import GateConfig, Recipe, default_recipe, load_recipe
from ..inputs.source import Source, load_source
from ..inputs.stateful import Stream, for_source
from ..inputs.targets import MeasureDefaults, TargetSpec, load_target
from ..measure.request import check_measure_options
from ..metrics.evaluate import EvalPlan, eval_plan
from ..passes.convert import variants_for_target
from ..report.model import Report
from .cache import PassCache, default_cache, key_for
from .options import DeployOptions, check_release_options, resolve_gate, resolve_measure, resolve_metric_spec

Progress = Callable[[str], None]


@dataclass
class PreparedRun:
    model: Any
    target: TargetSpec
    recipe: Recipe
    measure: MeasureDefaults
    gate: GateConfig
    out_dir: Path
    art_dir: Path
    eval_ds: Dataset
    calib_ds: Dataset | None
    train_ds: Dataset | None
    previous: Report | None
    previous_path: Path | None
    source: Source
    plan: EvalPlan
    fp32: Artifact
    cache: PassCache | None
    started: float = field(default_factory=time.perf_counter)
    arch: str | None = None  # module:Class of a state-dict model (structured pruning rebuilds it)

    def model_facts(self) -> dict[str, object]:
        m = self.model
        return {"source": str(m) if not hasattr(m, "forward") else type(m).__name__,
                "sha256": self.source.artifact.sha256, "format": self.source.artifact.format.value,
                "inputs": [i.model_dump(mode="json") for i in self.source.artifact.io.inputs]}


def resolve_recipe(recipe: Recipe | str | Path | None, spec: TargetSpec, has_calib: bool) -> Recipe:
    """The recipe (a Recipe, a YAML path, or None for the default), with the target's formats: litert
    targets (rpi4, Android) get TFLite variants, Core ML targets Core ML ones, unless the recipe converts."""

    rec = recipe if isinstance(recipe, Recipe) else (load_recipe(recipe) if recipe else default_recipe(has_calib))
    return variants_for_target(rec, spec, has_calib)


def target_spec(target: str | TargetSpec) -> TargetSpec:
    return target if isinstance(target, TargetSpec) else load_target(target)


def prepare_run(model: Any, *, eval_data: str | Path, target: TargetSpec, recipe: Recipe, opts: DeployOptions,
                calib_data: str | Path | None = None, out: str | Path = "edgekit-out",
                example_inputs: tuple[Any, ...] | None = None, arch: str | None = None,
                x_key: str | tuple[str, ...] = "x", y_key: str = "y", progress: Progress) -> PreparedRun:
    started = time.perf_counter()

    measure = resolve_measure(target, recipe, opts)
    check_measure_options(opts)
    check_release_options(opts)
    gate_cfg = resolve_gate(target, recipe, opts)
    metric_spec = resolve_metric_spec(recipe, opts)
    out_dir = ensure_writable_dir(out)
    eval_ds = take_subset(load_npz(eval_data, x_key=x_key, y_key=y_key, require_labels=False, role="eval"),
                          opts.eval_samples, contiguous=bool(opts.state))  # a stream stays unbroken
    previous = Report.load(opts.baseline_report) if opts.baseline_report is not None else None
    calib_ds = load_npz(calib_data, x_key=x_key, y_key=None, require_labels=False, role="calib") if calib_data else None
    train_path = opts.train_data or recipe.train_data
    train_ds = load_npz(train_path, x_key=x_key, y_key=y_key, require_labels=True, role="train") if train_path else None
    art_dir = out_dir / "artifacts"
    art_dir.mkdir(exist_ok=True)
    if example_inputs is None:
        example_inputs = tuple(x[0:1] for x in eval_ds.xs)

    progress("loading the model")
    source = load_source(model, example_inputs=example_inputs, arch=arch, workdir=art_dir)
    stream = _stream(source, opts, eval_ds, progress)
    io = stream.data_io(source.artifact.io) if stream is not None else source.artifact.io
    eval_ds = _fed(check_fits(eval_ds, io, "eval"), stream)
    calib_ds = _fed(check_fits(calib_ds, io, "calib"), stream) if calib_ds is not None else None
    train_ds = _fed(check_fits(train_ds, io, "train"), stream) if train_ds is not None else None

    progress("computing reference outputs (and checking the metric fits them)")
    plan = eval_plan(metric_spec, source, eval_ds)

    cache = default_cache() if opts.use_cache else None
    fp32 = _fp32_onnx(source, eval_ds, art_dir, cache, progress)
    if misfit := fixed_shape_misfit(fp32, eval_ds, source.artifact.io):  # the float model itself takes one shape
        raise BadInputError(f"the model's {misfit}", hint="export the model with dynamic axes for the sizes that vary "
                            "(torch.export's dynamic_shapes, or an ONNX file with symbolic dimensions)")
    return PreparedRun(model=model, target=target, recipe=recipe, measure=measure, gate=gate_cfg, out_dir=out_dir,
                       art_dir=art_dir, eval_ds=eval_ds, calib_ds=calib_ds, train_ds=train_ds, previous=previous,
                       previous_path=Path(opts.baseline_report) if opts.baseline_report is not None else None,
                       source=source, plan=plan, fp32=fp32, cache=cache, started=started, arch=arch)


def _stream(source: Source, opts: DeployOptions, eval_ds: Dataset, progress: Progress) -> Stream | None:
    """The model's constant and state inputs (``--const``/``--state``, 0-d arrays of the eval data named
    like an input), checked against the model; recorded in the source's lineage (every variant inherits
    it: ship.json's interface reads it). None when the data feeds every input."""
    stream = for_source(source, opts.constants, opts.state, eval_ds.constants)
    if stream is None:
        return None
    if stream.stateful and opts.shard_eval:
        raise BadInputError("--shard-eval splits the eval stream between units, and --state carries it sample to "
                            "sample: they do not go together", hint="drop --shard-eval (every unit scores all of it)")
    if stream.stateful:
        links = ", ".join(f"{s.output} -> {s.input}" for s in stream.state)
        progress(f"a stateful model: eval samples run one at a time in order (batch 1), state carried {links}")
    return stream


def _fed(ds: Dataset, stream: Stream | None) -> Dataset:
    return replace(ds, stream=stream) if stream is not None else ds


def _fp32_onnx(source: Source, eval_ds: Dataset, art_dir: Path, cache: PassCache | None,
               progress: Progress) -> Artifact:
    if source.artifact.format != Format.TORCH:
        return source.artifact
    progress("exporting to ONNX (parity check on the eval inputs)")

    xs = list(eval_ds.xs)
    if cache is None:
        return export_onnx(source, art_dir / "fp32.onnx", xs)
    # the dynamo export is seconds: reuse it when the model and the eval inputs are unchanged

    key = key_for({"input": source.artifact.sha256, "convert": "torch->onnx", "eval": sha256_file(eval_ds.path),
                   "subset": eval_ds.sample})
    return cache.cached(key, source.artifact, art_dir, "fp32", lambda: export_onnx(source, art_dir / "fp32.onnx", xs))
