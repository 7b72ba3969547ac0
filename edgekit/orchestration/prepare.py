"""Everything a run checks and loads before any pass or device time, for every kind of model: one sequence
(:func:`prepare`), the workload's own steps (:class:`Preparation`):

1. the options, checked (a bad one is exit 2 before anything is read);
2. the output folder, writable;
3. the model and the eval inputs, each checked against the other and against the target;
4. the host's reference outputs, what the device's are compared with.

A fixed graph (:class:`FixedGraphPreparation`, :func:`prepare_run`): the recipe's measure and gate options, the
eval/calib/train ``.npz`` (their arrays against the model's inputs, a stateful model's stream), the previous
report, the metric plan (the reference outputs, and the metric checked against them) and the fp32 ONNX model.
A generator (:class:`GenerationPreparation`, :func:`prepare_generation`): the language-model options, the model
folder or ``.gguf``, a context that fits the target's memory, the eval text tokenized into windows, and the float
model's log-probabilities and greedy continuations (``llm/quality.reference``).
``deploy``, the search, a fleet, a microcontroller and a generator all start here, so a bad input fails the same
way (exit 2) in each."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Generic, TypeVar

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
from ..llm.judge import OBJECTIVES
from ..llm.layer_plan import HEADS
from ..llm.memory import MemoryPlan, memory_plan
from ..llm.memory import check_fits as check_memory_fits
from ..llm.options import DEFAULT_CONTEXT, DEFAULT_WINDOW, LMOptions
from ..llm.quality import COVERAGE, Reference, greedy_reference, reference
from ..llm.request import GenerateSettings
from ..llm.source import LMSource, load_lm
from ..llm.text import EvalText, load_eval_text
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


T = TypeVar("T")


class Preparation(ABC, Generic[T]):
    """One kind of model's preparation steps, which :func:`prepare` runs in the one order."""

    @abstractmethod
    def check_options(self) -> None:
        """Every option checked: a bad one is exit 2 before anything is read."""

    @abstractmethod
    def load(self, out_dir: Path, progress: Progress) -> None:
        """The model and the eval inputs, each checked against the other and against the target."""

    @abstractmethod
    def reference(self, progress: Progress) -> None:
        """The host's reference outputs: what the device's outputs are compared with."""

    @abstractmethod
    def prepared(self, out_dir: Path) -> T:
        """What the run goes on with."""


def prepare(steps: Preparation[T], out: str | Path, progress: Progress) -> T:
    """The one preparation: the options, the output folder, the model and its eval inputs, the reference."""
    steps.check_options()
    out_dir = ensure_writable_dir(out)
    steps.load(out_dir, progress)
    steps.reference(progress)
    return steps.prepared(out_dir)


class FixedGraphPreparation(Preparation[PreparedRun]):
    """A fixed graph's steps: the recipe's options, the ``.npz`` data, the model, the metric plan, fp32 ONNX."""

    def __init__(self, model: Any, *, eval_data: str | Path, target: TargetSpec, recipe: Recipe,
                 opts: DeployOptions, calib_data: str | Path | None, example_inputs: tuple[Any, ...] | None,
                 arch: str | None, x_key: str | tuple[str, ...], y_key: str) -> None:
        self.started = time.perf_counter()
        self.model, self.eval_data, self.target, self.recipe, self.opts = model, eval_data, target, recipe, opts
        self.calib_data, self.example_inputs, self.arch, self.x_key, self.y_key = (calib_data, example_inputs, arch,
                                                                                   x_key, y_key)

    def check_options(self) -> None:
        opts = self.opts
        self.measure = resolve_measure(self.target, self.recipe, opts)
        check_measure_options(opts)
        check_release_options(opts)
        self.gate = resolve_gate(self.target, self.recipe, opts)
        self.metric_spec = resolve_metric_spec(self.recipe, opts)

    def load(self, out_dir: Path, progress: Progress) -> None:
        opts, x_key, y_key = self.opts, self.x_key, self.y_key
        eval_ds = take_subset(load_npz(self.eval_data, x_key=x_key, y_key=y_key, require_labels=False, role="eval"),
                              opts.eval_samples, contiguous=bool(opts.state))  # a stream stays unbroken
        self.previous = Report.load(opts.baseline_report) if opts.baseline_report is not None else None
        calib_ds = (load_npz(self.calib_data, x_key=x_key, y_key=None, require_labels=False, role="calib")
                    if self.calib_data else None)
        train_path = opts.train_data or self.recipe.train_data
        train_ds = (load_npz(train_path, x_key=x_key, y_key=y_key, require_labels=True, role="train")
                    if train_path else None)
        self.art_dir = out_dir / "artifacts"
        self.art_dir.mkdir(exist_ok=True)
        example_inputs = self.example_inputs
        if example_inputs is None:
            example_inputs = tuple(x[0:1] for x in eval_ds.xs)

        progress("loading the model")
        self.source = load_source(self.model, example_inputs=example_inputs, arch=self.arch, workdir=self.art_dir)
        stream = _stream(self.source, opts, eval_ds, progress)
        io = stream.data_io(self.source.artifact.io) if stream is not None else self.source.artifact.io
        self.eval_ds = _fed(check_fits(eval_ds, io, "eval"), stream)
        self.calib_ds = _fed(check_fits(calib_ds, io, "calib"), stream) if calib_ds is not None else None
        self.train_ds = _fed(check_fits(train_ds, io, "train"), stream) if train_ds is not None else None

    def reference(self, progress: Progress) -> None:
        progress("computing reference outputs (and checking the metric fits them)")
        self.plan = eval_plan(self.metric_spec, self.source, self.eval_ds)
        self.cache = default_cache() if self.opts.use_cache else None
        self.fp32 = _fp32_onnx(self.source, self.eval_ds, self.art_dir, self.cache, progress)
        # the float model itself takes one shape
        if misfit := fixed_shape_misfit(self.fp32, self.eval_ds, self.source.artifact.io):
            raise BadInputError(f"the model's {misfit}", hint="export the model with dynamic axes for the sizes that "
                                "vary (torch.export's dynamic_shapes, or an ONNX file with symbolic dimensions)")

    def prepared(self, out_dir: Path) -> PreparedRun:
        opts = self.opts
        return PreparedRun(model=self.model, target=self.target, recipe=self.recipe, measure=self.measure,
                           gate=self.gate, out_dir=out_dir, art_dir=self.art_dir, eval_ds=self.eval_ds,
                           calib_ds=self.calib_ds, train_ds=self.train_ds, previous=self.previous,
                           previous_path=Path(opts.baseline_report) if opts.baseline_report is not None else None,
                           source=self.source, plan=self.plan, fp32=self.fp32, cache=self.cache,
                           started=self.started, arch=self.arch)


def prepare_run(model: Any, *, eval_data: str | Path, target: TargetSpec, recipe: Recipe, opts: DeployOptions,
                calib_data: str | Path | None = None, out: str | Path = "edgekit-out",
                example_inputs: tuple[Any, ...] | None = None, arch: str | None = None,
                x_key: str | tuple[str, ...] = "x", y_key: str = "y", progress: Progress) -> PreparedRun:
    """A fixed graph's run, prepared (:func:`prepare` with :class:`FixedGraphPreparation`)."""
    steps = FixedGraphPreparation(model, eval_data=eval_data, target=target, recipe=recipe, opts=opts,
                                  calib_data=calib_data, example_inputs=example_inputs, arch=arch, x_key=x_key,
                                  y_key=y_key)
    return prepare(steps, out, progress)


@dataclass
class PreparedGeneration:
    """A generator's run, prepared: the model, its eval text's windows, the target, the memory plan and the float
    model's reference."""

    src: LMSource
    text: EvalText
    spec: TargetSpec
    settings: GenerateSettings
    out_dir: Path
    plan: MemoryPlan
    ref: Reference


class GenerationPreparation(Preparation[PreparedGeneration]):
    """A generator's steps: the language-model options, the model, a context that fits the target's memory, the
    eval text's windows, the float model's log-probabilities and greedy continuations."""

    def __init__(self, model: str | Path, eval_text: str | Path, spec: TargetSpec, o: LMOptions) -> None:
        self.model, self.eval_text, self.spec, self.o = model, eval_text, spec, o

    def check_options(self) -> None:
        o = self.o
        if o.top_k is not None and o.top_k < 1:
            raise BadInputError(f"--top-k {o.top_k}: at least 1 (the float model's tokens a position the device "
                                "scores)")
        if o.head not in HEADS:
            raise BadInputError(f"--output-layer {o.head!r}: the output layer of an int4 file is one of "
                                f"{', '.join(HEADS)}")
        if o.objective not in OBJECTIVES:
            raise BadInputError(f"--objective {o.objective!r} for a language model: one of {', '.join(OBJECTIVES)}")

    def load(self, out_dir: Path, progress: Progress) -> None:
        o, model, eval_text = self.o, self.model, self.eval_text
        progress(f"reading {model}")
        src = self.src = load_lm(model)
        context = o.context or min(src.context, DEFAULT_CONTEXT)
        if context > src.context:
            raise BadInputError(
                f"--context {context} is beyond the model's {src.context} positions (max_position_embeddings)",
                hint=f"use --context {src.context} or less",
            )
        if context < 16:
            raise BadInputError(f"--context {context}: at least 16 positions")
        self.plan = memory_plan(src, context, self.spec.memory_mb)
        check_memory_fits(self.plan, self.spec.name)
        window = min(o.window or DEFAULT_WINDOW, context - 1)  # a static-cache file takes at most context-1 at once
        self.text = load_eval_text(eval_text, src.tokenizer, window=window, max_windows=o.max_windows)
        if int(self.text.windows.max()) >= src.vocab_size:
            raise BadInputError(
                f"the tokenizer gives token id {int(self.text.windows.max())} on {eval_text}, past the "
                f"model's vocabulary of {src.vocab_size}"
            )
        self.settings = GenerateSettings(context=context)

    def reference(self, progress: Progress) -> None:
        o, text, src = self.o, self.text, self.src
        progress(f"scoring {text.windows.shape[0]} windows of {text.windows.shape[1]} tokens with the float model")
        ref = reference(src.model, text.windows, o.top_k)
        cover = ref.describe()
        progress(
            f"the KLD scores {cover['scored_ids']} token log-probs ({cover['scoring_bytes'] / 1e6:.1f} MB to move a "
            f"variant): "
            + (
                f"top-{o.top_k} a position"
                if o.top_k is not None
                else f"{cover['top_k_mean']:.0f} a position on average to hold {COVERAGE:.1%} of the float mass"
                + (f", the flattest cut to {ref.capped_at}" if ref.capped_at else "")
            )
        )
        greedy = greedy_reference(src.model, text.prompts, self.settings.greedy_tokens)
        self.ref = Reference(**{**ref.__dict__, "greedy": greedy})

    def prepared(self, out_dir: Path) -> PreparedGeneration:
        return PreparedGeneration(src=self.src, text=self.text, spec=self.spec, settings=self.settings,
                                  out_dir=out_dir, plan=self.plan, ref=self.ref)


def prepare_generation(model: str | Path, eval_text: str | Path, spec: TargetSpec, out: str | Path, o: LMOptions,
                       progress: Progress) -> PreparedGeneration:
    """A generator's run, prepared (:func:`prepare` with :class:`GenerationPreparation`)."""
    return prepare(GenerationPreparation(model, eval_text, spec, o), out, progress)


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
