"""The metric contract.

A metric has a name, a direction (``higher`` or ``lower`` is better), units, whether it needs
labels, and ``score(outputs, labels) -> float``. ``outputs`` is the list of the model outputs the
metric reads (batch axis first, float32 as the device returned them); ``labels`` the eval set's
label array (or, for metrics that compare with the float model, its outputs).

Most metrics are *decomposable*: ``stats()`` gives per-sample sufficient statistics (an ``(N, K)``
array) and ``reduce()`` turns their column sums into the value (top-1: correct; mIoU: per-class
intersections and unions; MSE: squared error and count). Paired statistics then resample rows
instead of re-scoring, so a bootstrap of thousands of resamples costs milliseconds. A metric that
is not decomposable (mAP) leaves ``stats`` as None and is re-scored on each resample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from ..errors import DataError

Direction = Literal["higher", "lower"]


class MetricError(DataError):
    """The metric does not fit the model's outputs or the labels (exit 2)."""


@dataclass
class Score:
    """A metric's value on an eval set, with what paired statistics need."""

    metric: str
    value: float
    n: int
    direction: Direction
    units: str
    stats: np.ndarray | None = None  # (N, K) per-sample sufficient statistics, when decomposable
    against: str = "labels"  # "labels" or "reference" (the float model's own outputs)

    def to_dict(self) -> dict:
        return {"metric": self.metric, "value": round(float(self.value), 6), "n": int(self.n),
                "direction": self.direction, "units": self.units, "against": self.against}


class Metric:
    name: ClassVar[str] = "metric"
    direction: ClassVar[Direction] = "higher"
    units: ClassVar[str] = ""
    needs_labels: ClassVar[bool] = True
    reads_outputs: ClassVar[int] = 1  # outputs read when the user names none (first N)
    label_kinds: ClassVar[str] = "iu"  # numpy dtype kinds the labels may have
    description: ClassVar[str] = ""

    def __init__(self, **options: Any):
        self.options = options

    # --- override --------------------------------------------------------------------------
    def check(self, outputs: list[np.ndarray], labels: np.ndarray | None) -> None:
        """Raise MetricError naming both shapes when outputs and labels do not fit."""

    def stats(self, outputs: list[np.ndarray], labels: np.ndarray | None) -> np.ndarray | None:
        """Per-sample sufficient statistics (N, K), or None when the metric is not decomposable."""
        return None

    def reduce(self, totals: np.ndarray) -> np.ndarray:
        """Value(s) from column sums of ``stats`` (vectorized over leading axes)."""
        raise NotImplementedError

    def score(self, outputs: list[np.ndarray], labels: np.ndarray | None) -> float:
        s = self.stats(outputs, labels)
        if s is None:
            raise NotImplementedError(f"metric {self.name} defines neither stats() nor score()")
        return float(self.reduce(s.sum(axis=0)))

    # --- helpers -----------------------------------------------------------------------------
    def evaluate(self, outputs: list[np.ndarray], labels: np.ndarray | None, *, against: str = "labels") -> Score:
        if self.needs_labels and labels is None:
            raise MetricError(f"metric {self.name} needs labels and the eval data has none",
                              hint="add labels to the eval .npz (--y-key names them), or use a metric that "
                              "compares with the float model's own outputs (mse, mae, psnr, snr, cosine)")
        if labels is not None and against == "labels" and labels.dtype.kind not in self.label_kinds + "b":
            raise MetricError(f"metric {self.name} takes labels of kind {_kinds(self.label_kinds)}; the eval "
                              f"labels are {labels.dtype}", hint=self.description or None)
        self.check(outputs, labels)
        st = self.stats(outputs, labels)
        value = float(self.reduce(st.sum(axis=0))) if st is not None else float(self.score(outputs, labels))
        n = len(outputs[0]) if outputs else 0
        return Score(metric=self.label(), value=value, n=n, direction=self.direction, units=self.units,
                     stats=st, against=against)

    def label(self) -> str:
        return self.name

    def worse_by(self, base: float, value: float) -> float:
        """How much worse ``value`` is than ``base`` in the metric's units (> 0 = worse)."""
        return (base - value) if self.direction == "higher" else (value - base)


def _kinds(kinds: str) -> str:
    names = {"i": "integer", "u": "unsigned integer", "f": "float", "b": "bool"}
    return " or ".join(dict.fromkeys(names[k] for k in kinds))


def shape_error(metric: str, outputs: list[np.ndarray], labels: np.ndarray | None, want: str) -> MetricError:
    shapes = ", ".join(str(tuple(o.shape)) for o in outputs)
    lab = "none" if labels is None else str(tuple(labels.shape))
    return MetricError(f"metric {metric} does not fit: output shape(s) {shapes}, label shape {lab}; it expects {want}",
                       hint="pick the output with --output NAME, a metric that fits the task (--metric), or "
                       "reshape the labels")


ACTIVATIONS = ("none", "sigmoid")


def binary_options(metric: str, threshold: Any, activation: Any) -> tuple[float, str]:
    """The ``threshold`` and ``activation`` options of a metric that thresholds probabilities,
    checked: a bad value names the option, what it got and what it takes."""
    try:
        t = float(threshold)
    except (TypeError, ValueError):
        raise MetricError(f"metric {metric}: option threshold={threshold!r} is not a number",
                          hint="threshold is a probability in [0, 1], e.g. {threshold: 0.5}") from None
    if not 0.0 <= t <= 1.0:
        raise MetricError(f"metric {metric}: option threshold={t:g} is outside [0, 1]",
                          hint="threshold is compared with probabilities (after the sigmoid with "
                          "activation: sigmoid)")
    if activation not in ACTIVATIONS:
        raise MetricError(f"metric {metric}: option activation={activation!r} is not one of "
                          f"{', '.join(ACTIVATIONS)}",
                          hint="none: the outputs are probabilities in [0, 1]; sigmoid: they are logits")
    return t, activation


def to_probabilities(out: np.ndarray, activation: str) -> np.ndarray:
    out = np.asarray(out, dtype=np.float64)
    return 1.0 / (1.0 + np.exp(-out)) if activation == "sigmoid" else out


def check_binary_labels(metric: str, labels: np.ndarray, what: str) -> None:
    """0/1 labels (bool, integer or float); a 0/255 mask or soft labels name the fix."""
    y = np.asarray(labels)
    if y.dtype.kind == "b" or y.size == 0:
        return
    bad = (y != 0) & (y != 1)
    if bad.any():
        vals = np.unique(y[bad])
        shown = ", ".join(f"{v:g}" for v in vals[:5]) + (", ..." if len(vals) > 5 else "")
        hint = ("the labels look like a 0/255 image mask: divide them by 255" if set(vals.tolist()) <= {255}
                else f"{what} are 0 or 1: threshold or binarize the labels before saving the eval .npz")
        raise MetricError(f"metric {metric} takes 0/1 labels; the labels also hold {shown}", hint=hint)
