"""Recipes (YAML, validated): which variants to build from the fp32 model, by which passes, how to
measure, and what the gate demands.

    baseline: fp32
    variants:
      - name: int8-static
        passes:
          - quantize: {mode: static, per_channel: true}
      - name: int8-dynamic
        passes:
          - quantize: {mode: dynamic}
    measure: {warmup: 10, runs: 50, min_seconds: 1.0, threads: 1}
    gate: {max_accuracy_drop: 1.0}
    metric: {name: miou, outputs: [logits]}   # optional; default top1 on the first output
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..config import load_model_file
from ..errors import ConfigError
from ..pass_names import known_passes
from .metric_spec import MetricSpec


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PassStep(_Strict):
    name: str  # the pass: a name in the pass registry (quantize, convert, prune_magnitude, distill...), checked on load
    # the pass's settings (e.g. {mode: static, per_channel: true}), validated by the pass's own Config when it runs;
    # empty: its defaults
    config: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _from_mapping(cls, v):
        # YAML form: `- quantize: {mode: static}` or `- quantize` (defaults)
        if isinstance(v, str):
            return {"name": v, "config": {}}
        if isinstance(v, dict) and len(v) == 1 and "name" not in v:
            (name, cfg), = v.items()
            return {"name": name, "config": cfg or {}}
        return v


class VariantSpec(_Strict):
    # the variant's name in the report and its file names: letters, digits, _ . -; unique, not the baseline's
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    # the passes that build it, in order, from the fp32 model (PyTorch-level passes such as prune and distill from
    # the PyTorch program, before any ONNX-level pass); empty: the fp32 file itself under this name
    passes: list[PassStep] = Field(default_factory=list)


class MeasureOverrides(_Strict):
    warmup: int | None = Field(None, ge=0)  # untimed runs before measuring; None: the target's (--warmup wins)
    runs: int | None = Field(None, ge=1)  # minimum timed runs; None: the target's (--runs wins)
    # minimum total timed seconds; None: the target's (--min-seconds wins)
    min_seconds: float | None = Field(None, ge=0)
    max_runs: int | None = Field(None, ge=1)  # hard cap on timed runs; None: the target's (no command-line option)
    threads: int | None = Field(None, ge=1)  # intra-op threads of the runtime; None: the target's (--threads wins)


class GateConfig(_Strict):
    """What a shippable variant must meet. The accuracy tolerance is in the metric's own units and
    direction (points for top1/miou/map50, dB for psnr, the error itself for mse)."""

    max_accuracy_drop: float = Field(1.0, ge=0, le=100, description="how much worse than the baseline the metric may "
                                     "get, in its units (1 = one point of top-1)")
    relative_accuracy_drop: bool = Field(False, description="read max_accuracy_drop as percent of the baseline")
    strict_stats: bool = Field(False, description="fail the accuracy check only when the drop is above the tolerance "
                               "AND statistically significant (paired 95% CI excludes 0)")
    # budget for each judged variant's device-measured p50, ms (check latency_p50_budget, skipped on an emulated
    # device); None: the target's limits.latency_ms_p50; --latency-budget-ms wins over both
    latency_ms_p50: float | None = Field(None, gt=0)
    # budget for the device-measured p90, ms (check latency_p90_budget, skipped on an emulated device); None: the
    # target's limits.latency_ms_p90
    latency_ms_p90: float | None = Field(None, gt=0)
    # budget for the agent process's peak RSS on the device while measuring, MB (check peak_memory_budget); None:
    # the target's limits.peak_memory_mb; --memory-budget-mb wins over both
    peak_memory_mb: float | None = Field(None, gt=0)
    # budget for the variant's file size, MB of 10^6 bytes (check model_size_budget); None: the target's
    # limits.model_size_mb
    model_size_mb: float | None = Field(None, gt=0)
    min_speedup: float | None = Field(None, gt=0, description="fail a variant whose device-measured speed-up over the "
                                      "baseline (baseline p50 / its p50) is below this; None: a slower variant is a warning")
    check_parity: bool = Field(True, description="fail when a conversion hop is outside its parity tolerance")
    # Against a previous release's report (`--baseline previous/report.json`); None disables a check.
    max_latency_regression: float | None = Field(
        0.10, ge=0, description="fail when p50 is significantly slower than the baseline report by more than this fraction")
    max_release_accuracy_drop: float | None = Field(
        None, ge=0, le=100, description="points vs the same variant in the baseline report; None: max_accuracy_drop")
    max_memory_increase: float | None = Field(0.10, ge=0, description="fraction of the baseline report's peak memory")
    max_size_increase: float | None = Field(0.10, ge=0, description="fraction of the baseline report's model size")
    significance_alpha: float = Field(0.05, gt=0, lt=1, description="level of the latency significance tests")
    # A generator's (language model's) quality on the eval text, judged instead of max_accuracy_drop (report/gate.py
    # says why these defaults)
    max_kld: float = Field(0.05, gt=0, description="a language model: the most mean KL divergence from the float "
                           "model, nats a token (llama.cpp's own measurements: Q4_K_M 0.031, Q4_0 0.072)")
    max_perplexity_increase: float = Field(0.05, ge=0, description="a language model: the most perplexity increase "
                                           "over the float model on the same text, as a fraction (0.05: 5%)")


class Recipe(_Strict):
    # the name the fp32 ONNX model (the source exported, no pass) goes by: what the other variants are compared
    # with (the report's baseline)
    baseline: str = "fp32"
    # the variants to build from the fp32 model; a target whose first runtime is LiteRT or Core ML adds that
    # runtime's default variants when no variant has a convert step
    variants: list[VariantSpec] = Field(default_factory=list)
    measure: MeasureOverrides = MeasureOverrides()  # overrides of the target's measure settings (unset: the target's)
    # what a shippable variant must meet; the target's limits fill the budgets left unset, the command line wins
    gate: GateConfig = GateConfig()
    metric: MetricSpec | None = None  # what scores the eval pass (default: top1 on the first output)
    # .npz (x, y) that pruning fine-tunes and distillation train on; relative to the recipe file
    train_data: str | None = None

    @field_validator("variants")
    @classmethod
    def _unique(cls, v):
        names = [x.name for x in v]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"variant names must be unique: {sorted(dup)}")
        return v


def default_recipe(has_calib: bool) -> Recipe:
    """fp32 baseline plus INT8: static QDQ per-channel when calibration data is given, else dynamic."""
    if has_calib:
        v = VariantSpec(name="int8-static", passes=[PassStep(name="quantize", config={"mode": "static"})])
    else:
        v = VariantSpec(name="int8-dynamic", passes=[PassStep(name="quantize", config={"mode": "dynamic"})])
    return Recipe(variants=[v])


def load_recipe(path: str | Path) -> Recipe:
    r = load_model_file(Recipe, path, hint="see examples/digits/recipe.yaml for a valid recipe")
    if r.train_data and not Path(r.train_data).is_absolute():
        r.train_data = str(Path(path).parent / r.train_data)

    for v in r.variants:
        if v.name == r.baseline:
            raise ConfigError(f"{path}: variant name '{v.name}' is the baseline's name", hint="rename the variant")
        for step in v.passes:
            if step.name not in known_passes():
                raise ConfigError(f"{path}: variants.{v.name}.passes: unknown pass '{step.name}'",
                                  hint=f"known passes: {', '.join(known_passes())}")
    return r
