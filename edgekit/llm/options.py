"""What a language model's run takes (``edgekit deploy MODEL_DIR --eval-text``, ``edgekit.deploy(model,
eval_text=..., lm_options=LMOptions(...))``): the options every kind of model takes (:class:`RunOptions`) and
its own, each default documented where it is defined."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..inputs.run_options import RunOptions
from ..inputs.targets import MeasureDefaults, TargetSpec
from .judge import LMGate
from .release import ReleaseGate

DEFAULT_CONTEXT = 512  # a model's own context is often 8k+: a phone app's prompt + answer rarely need more
DEFAULT_WINDOW = 128  # tokens a scored window holds


@dataclass
class LMOptions(RunOptions):
    """What ``edgekit deploy`` takes for a language model (defaults documented where they are defined); the
    measurement and device options every kind of model takes alike are :class:`RunOptions`'."""

    context: int | None = None  # default: min(model's, DEFAULT_CONTEXT)
    window: int | None = None  # default: min(context, DEFAULT_WINDOW)
    max_windows: int = 32
    # the float model's tokens a position the device scores for the KLD; None (default): at each position the
    # fewest that hold quality.COVERAGE of its mass (quality.reference); K: that many everywhere (--top-k)
    top_k: int | None = None
    gate: LMGate = field(default_factory=LMGate)
    objective: str = "decode"
    candidates: tuple[str, ...] | None = None  # names from candidates.CANDIDATES; default: the short search's
    search: bool = False  # race every row of candidates.CANDIDATES that runs (default: candidates.SHORT)
    head: str = "int8"  # the output layer in int4 files: float, int8 or int4 (layer_plan.HEADS)
    # {runtime: {option: value}}: the session settings the application runs the files with (onnxruntime:
    # graph_optimization_level, execution_mode...), applied to every file of that runtime
    runtime_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    baseline: str | Path | None = None  # the last release's report.json (release.py): the release gate
    release: ReleaseGate = field(default_factory=ReleaseGate)
    # seconds for the whole run: preparation, builds, the device and the scoring (race.py); None: the default,
    # race.DEFAULT_BUDGET_S (SEARCH_BUDGET_S with --search)
    time_budget_s: float | None = None


def measure_settings(spec: TargetSpec, o: LMOptions) -> MeasureDefaults:
    """The target's measure settings with the run's overrides."""
    return spec.measure.model_copy(update=o.measure_overrides())
