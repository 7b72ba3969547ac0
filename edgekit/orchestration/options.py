"""What a run is asked to do: the user's options (:class:`DeployOptions`) on top of the recipe and
the target file, resolved once into the measurement settings, the gate and the metric.

``deploy`` and ``search`` read the same options through the same resolvers, so an option works the
same in both (or the search refuses it with a reason: :func:`refused_by_search`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, TypedDict

from ..config import validate
from ..errors import BadInputError
from ..inputs.recipe import GateConfig, Recipe
from ..inputs.run_options import RunOptions
from ..inputs.targets import MeasureDefaults, TargetSpec
from ..metrics import MetricSpec, get_metric

ReleaseMethod = Literal["auto", "ab", "normalized", "direct"]


@dataclass
class DeployOptions(RunOptions):
    """Command-line / API overrides on top of the recipe and the target file (None = keep)."""

    max_accuracy_drop: float | None = None  # in the metric's units (points for top1); alias max_metric_drop
    relative_accuracy_drop: bool | None = None
    metric: str | None = None  # top1 | top5 | miou | map50 | mse ... or module:function (see edgekit.metrics)
    outputs: list[str] | None = None  # the outputs the metric reads (names or indices)
    # the metric's options (mask_iou threshold, ctc blank...), over the recipe's
    metric_options: dict[str, object] | None = None
    postprocess: str | None = None  # detection: module:function turning raw outputs into boxes
    strict_stats: bool | None = None  # the accuracy check fails only on a statistically significant drop
    min_speedup: float | None = None  # fail a variant below this device-measured speed-up over the baseline
    latency_budget_ms: float | None = None
    memory_budget_mb: float | None = None
    size_budget_mb: float | None = None  # the variant's file size, MB of 10^6 bytes (the gate's model_size_mb)
    # distillation's teacher instead of the source model: the .pt2 `edgekit train` wrote, or its checkpoint
    # (last.pt, read with torch.load(weights_only=True)); checked against the model's outputs before any training
    teacher: str | Path | None = None
    max_seconds: float = 120.0
    extra_warnings: list[str] = field(default_factory=list)
    warmup_mode: str | None = None  # "fixed" (warmup runs) or "auto" (until latency stabilizes)
    energy_command: list[str] | str | None = None  # device-side command printing cumulative joules
    train_data: str | Path | None = None  # .npz (x, y) for pruning fine-tunes and distillation (else the recipe's)
    use_cache: bool = True  # reuse pass outputs from edgekit.orchestration.cache when nothing they depend on changed
    # threads for host-side work (reference outputs, export, calibration, fine-tunes, conversions);
    # None = $EDGEKIT_HOST_THREADS, else the CPU free now (edgekit/host.py)
    host_threads: int | None = None
    # A previous report (the last release) to compare with; the release checks of the gate use it.
    baseline_report: str | Path | None = None
    # Where the baseline report's models are, when not at the paths it records (e.g. a CI artifact download).
    baseline_artifacts: str | Path | None = None
    # How the release gate judges latency against the baseline report: "ab" re-measures the baseline's
    # variant interleaved with the new one (needs its model files), "normalized" divides by the reference
    # variant measured in the same run, "direct" compares raw timings; "auto" takes the first that applies.
    release_method: ReleaseMethod = "auto"
    ab_blocks: int = 20  # A/B: alternating blocks per side (each ~0.1 s, in one agent process)
    max_latency_regression: float | None = None  # fraction, e.g. 0.1 (significant and above this fails)
    max_release_accuracy_drop: float | None = None  # points vs the baseline report
    max_memory_increase: float | None = None  # fraction
    max_size_increase: float | None = None  # fraction
    # also measure each .tflite variant with TFLite's own benchmark_model: the user's binary (pushed by
    # content, never downloaded) or "device" (one already on the device); see edgekit/agent/benchmark_model.py
    benchmark_binary: str | Path | None = None
    eval_samples: int | None = None  # score a fixed, seeded, stratified subset of the eval set (recorded)
    # streaming/stateful models (edgekit/inputs/stateful.py): model inputs fed besides the eval data, on the host and
    # the device. constants: input name -> value (--const NAME=VALUE), fed unchanged with every sample;
    # state: (output, input) pairs (--state OUT:IN): the input starts as zeros and takes the output after
    # each sample, the samples run one at a time in the data's order (batch 1)
    constants: dict[str, Any] | None = None  # arrays or numbers, as inputs.stateful.for_source takes them
    state: list[tuple[str, str]] | None = None
    # per-op profile of EVERY variant on the device (edgekit/devices/profile.py); without it deploy profiles
    # the baseline and the variants slower than it, a search the baseline and its selection
    profile: bool = False
    # A fleet run (edgekit/orchestration/fleet.py): the variants measured on every unit of a pool, in parallel.
    devices: list[str] | None = None  # the units by name (deploy --devices pi-1,pi-2,pi-3)
    pool: str | None = None  # TARGET:LABEL, every inventory device of the class with the label
    shard_eval: bool = False  # each unit scores its part of the eval set (combined into one metric)
    fleet_gate: Literal["worst", "median"] = "worst"  # which unit's figures the gate judges
    min_devices: int | None = None  # units that must be measured (default: all of them)

    def update(self, overrides: Mapping[str, Any]) -> "DeployOptions":
        known = {f.name for f in fields(self)}
        for k, v in overrides.items():
            if k not in known:
                raise TypeError(f"unexpected keyword argument {k!r} (not a DeployOptions field)")
            setattr(self, k, v)
        return self


class DeployOverrides(TypedDict, total=False):
    """:func:`edgekit.deploy`'s keyword overrides, typed: every field of :class:`DeployOptions` (the same names and
    types; ``tests/unit/test_public_api.py`` keeps the two equal), so a typo or a wrong type is a type-checker error
    rather than a ``TypeError`` at run time."""

    max_accuracy_drop: float | None
    relative_accuracy_drop: bool | None
    metric: str | None
    outputs: list[str] | None
    metric_options: dict[str, object] | None
    postprocess: str | None
    strict_stats: bool | None
    min_speedup: float | None
    latency_budget_ms: float | None
    memory_budget_mb: float | None
    size_budget_mb: float | None
    teacher: str | Path | None
    warmup: int | None
    runs: int | None
    min_seconds: float | None
    threads: int | None
    max_seconds: float
    extra_warnings: list[str]
    remeasure: bool
    warmup_mode: str | None
    sustained_seconds: float | None
    energy_command: list[str] | str | None
    train_data: str | Path | None
    use_cache: bool
    lock_wait: bool
    lock_timeout: float | None
    host_threads: int | None
    baseline_report: str | Path | None
    baseline_artifacts: str | Path | None
    release_method: ReleaseMethod
    ab_blocks: int
    max_latency_regression: float | None
    max_release_accuracy_drop: float | None
    max_memory_increase: float | None
    max_size_increase: float | None
    benchmark_binary: str | Path | None
    eval_samples: int | None
    constants: dict[str, Any] | None
    state: list[tuple[str, str]] | None
    profile: bool
    devices: list[str] | None
    pool: str | None
    shard_eval: bool
    fleet_gate: Literal["worst", "median"]
    min_devices: int | None


def resolve_measure(target: TargetSpec, recipe: Recipe, opts: DeployOptions) -> MeasureDefaults:
    m = target.measure.model_dump()
    m.update({k: v for k, v in recipe.measure.model_dump().items() if v is not None})
    m.update(opts.measure_overrides())
    return MeasureDefaults(**m)


# DeployOptions field -> GateConfig field
_GATE_OVERRIDES = (("max_accuracy_drop", "max_accuracy_drop"), ("relative_accuracy_drop", "relative_accuracy_drop"),
                   ("strict_stats", "strict_stats"), ("min_speedup", "min_speedup"),
                   ("latency_budget_ms", "latency_ms_p50"), ("memory_budget_mb", "peak_memory_mb"),
                   ("size_budget_mb", "model_size_mb"),
                   ("max_latency_regression", "max_latency_regression"),
                   ("max_release_accuracy_drop", "max_release_accuracy_drop"),
                   ("max_memory_increase", "max_memory_increase"), ("max_size_increase", "max_size_increase"))


def resolve_gate(target: TargetSpec, recipe: Recipe, opts: DeployOptions) -> GateConfig:
    g = recipe.gate.model_dump()
    # the target's budgets apply unless the recipe sets its own
    for k in ("latency_ms_p50", "latency_ms_p90", "peak_memory_mb", "model_size_mb"):
        if g.get(k) is None:
            g[k] = getattr(target.limits, k)
    for opt, key in _GATE_OVERRIDES:  # the command line wins over the recipe and the target
        if getattr(opts, opt) is not None:
            g[key] = getattr(opts, opt)

    return validate(GateConfig, g, "gate settings", hint="--max-accuracy-drop is in points, 0 to 100")


def resolve_metric_spec(recipe: Recipe, opts: DeployOptions) -> MetricSpec:
    """The recipe's metric section with --metric / --metric-option / --output / --postprocess on top."""

    spec = recipe.metric.model_copy() if recipe.metric is not None else MetricSpec()
    if opts.metric is not None:
        spec = spec.model_copy(update={"name": opts.metric})
    if opts.outputs:
        spec = spec.model_copy(update={"outputs": list(opts.outputs)})
    if opts.metric_options:
        spec = spec.model_copy(update={"options": {**(spec.options or {}), **opts.metric_options}})
    if opts.postprocess is not None:
        spec = spec.model_copy(update={"postprocess": opts.postprocess})
    get_metric(spec.name, spec.options, spec.postprocess)  # an unknown name fails here, before any work
    return spec


def check_release_options(opts: DeployOptions) -> None:
    if opts.release_method not in ("auto", "ab", "normalized", "direct"):
        raise BadInputError(f"release method {opts.release_method!r} is not one of auto, ab, normalized, direct")
    if opts.ab_blocks < 6:
        raise BadInputError(f"ab_blocks {opts.ab_blocks} is too few: the A/B test needs >= 6 block pairs to be "
                            "able to call a change significant (exact signed-rank p >= 0.0625 below that)")
    if opts.baseline_report is None and (opts.baseline_artifacts is not None or opts.release_method != "auto"):
        raise BadInputError("--baseline-artifacts / --release-method only apply with --baseline",
                            hint="pass --baseline previous/report.json")


# Deploy options the search cannot honour, and why (every other option reaches it).
_SEARCH_REFUSES = {
    **{k: "--search measures its candidates on one device; a fleet run (--devices/--pool, --shard-eval, "
          "--fleet-gate, --min-devices) measures a recipe's variants on every unit (drop --search)"
       for k in ("devices", "pool", "shard_eval", "fleet_gate", "min_devices")},
}


def search_refusal(opts: DeployOptions) -> str | None:
    """The first option set here that the search cannot take (its field name), or None."""
    defaults = DeployOptions()
    return next((name for name in _SEARCH_REFUSES if getattr(opts, name) != getattr(defaults, name)), None)


def refused_by_search(opts: DeployOptions) -> None:
    name = search_refusal(opts)
    if name is not None:
        raise BadInputError(f"--search does not take {name.replace('_', '-')}: {_SEARCH_REFUSES[name]}")
