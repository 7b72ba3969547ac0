"""Metric names -> implementations, and user metrics (``module:function`` or ``file.py:function``).

A user metric is a function ``fn(outputs, labels) -> float`` (or a per-sample array, averaged),
where ``outputs`` is the list of output arrays it reads and ``labels`` the label array (None when
the eval data has none). Optional attributes on the function: ``direction`` ("higher" or
"lower", default higher), ``units``, ``needs_labels`` (default True). A subclass of
:class:`edgekit.metrics.Metric` is used as it is. User metrics are imported on the host only;
the device never runs them.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np

from ..errors import ModelLoadError
from ..inputs.metric_spec import MetricSpec
from ..inputs.source import import_object
from .base import Metric, MetricError
from .classification import MultilabelF1, TopK
from .ctc import CTCAccuracy, CTCCharAccuracy
from .detection import MeanAP
from .frames import FrameAccuracy
from .mask import MaskF1, MaskIoU
from .regression import MAE, MSE, PSNR, SNR, Cosine
from .segmentation import MeanIoU, PixelAccuracy

_BUILTIN: dict[str, Callable[..., Metric]] = {}


def _builtins() -> dict[str, Callable[..., Metric]]:
    if not _BUILTIN:
        _BUILTIN.update({
            "top1": lambda **o: TopK(1, **o),
            "top5": lambda **o: TopK(5, **o),
            "topk": lambda **o: TopK(**o),
            "pixel_accuracy": PixelAccuracy,
            "miou": MeanIoU,
            "map50": lambda **o: MeanAP((0.5,), "map50", **o),
            "map50_95": lambda **o: MeanAP(tuple(np.round(np.arange(0.5, 0.951, 0.05), 2)), "map50_95", **o),
            "mse": MSE, "mae": MAE, "psnr": PSNR, "snr": SNR, "cosine": Cosine,
            "multilabel_f1": MultilabelF1,
            "mask_iou": MaskIoU, "mask_f1": MaskF1,
            "ctc_accuracy": CTCAccuracy, "ctc_char_accuracy": CTCCharAccuracy,
            "frame_accuracy": FrameAccuracy,
        })
    return _BUILTIN


def known_metrics() -> list[str]:
    return sorted(_builtins())


class _UserMetric(Metric):
    """A user's ``fn(outputs, labels)`` behind the Metric contract."""

    label_kinds = "iufb"

    def __init__(self, fn: Callable, spec: str, **options):
        super().__init__(**options)
        self.fn, self.name = fn, spec
        self.direction = getattr(fn, "direction", "higher")
        self.units = getattr(fn, "units", "")
        self.needs_labels = bool(getattr(fn, "needs_labels", True))
        if self.direction not in ("higher", "lower"):
            raise MetricError(f"metric {spec}: direction {self.direction!r} must be 'higher' or 'lower'")

    def _call(self, outputs, labels):
        try:
            return self.fn(list(outputs), labels, **self.options) if self.options else self.fn(list(outputs), labels)
        except MetricError:
            raise
        except Exception as exc:  # the user's code: name it and its error
            raise MetricError(f"metric {self.name} failed: {type(exc).__name__}: {exc}") from exc

    def stats(self, outputs, labels):
        v = np.asarray(self._call(outputs, labels), dtype=np.float64)
        if v.ndim == 1 and len(v) == len(outputs[0]):  # per-sample scores: paired statistics can use them
            return np.stack([v, np.ones(len(v))], axis=1)
        if v.ndim != 0:
            raise MetricError(f"metric {self.name} returned shape {v.shape}; return a float or one score per sample")
        self._scalar = float(v)
        return None

    def reduce(self, totals):
        return totals[..., 0] / np.maximum(totals[..., 1], 1)

    def score(self, outputs, labels):
        st = self.stats(outputs, labels)
        return float(self.reduce(st.sum(axis=0))) if st is not None else self._scalar


def _import(spec: str) -> Any:
    try:
        return import_object(spec)
    except ModelLoadError as exc:
        raise MetricError(f"metric {spec!r}: {exc.message}",
                          hint="a user metric is module:function or path/to/file.py:function") from exc


def get_metric(name: str, options: dict | None = None, postprocess: str | None = None) -> Metric:
    """A metric instance by built-in name (``top1``, ``top5``, ``miou``...) or ``module:function``."""
    options = dict(options or {})
    if ":" in name:
        obj = _import(name)
        if isinstance(obj, type) and issubclass(obj, Metric):
            return obj(**options)
        if not callable(obj):
            raise MetricError(f"metric {name!r} is not a function or a Metric subclass")
        return _UserMetric(obj, name, **options)
    m = re.fullmatch(r"top(\d+)", name)
    if m and name not in _builtins():
        return _builtins()["topk"](k=int(m.group(1)), **options)
    try:
        factory = _builtins()[name]
    except KeyError:
        raise MetricError(f"unknown metric {name!r}",
                          hint=f"known metrics: {', '.join(known_metrics())}; or a user metric as "
                          "module:function / file.py:function") from None
    if postprocess:
        if not name.startswith("map"):
            raise MetricError(f"--postprocess is for the detection metrics (map50, map50_95), not {name}")
        fn = _import(postprocess)
        if not callable(fn):
            raise MetricError(f"postprocess {postprocess!r} is not a function")
        options["postprocess"] = fn
    try:
        return factory(**options)
    except TypeError as exc:
        raise MetricError(f"metric {name}: bad options {options}: {exc}", hint=_options_hint(factory)) from exc


def _options_hint(factory: Callable) -> str | None:
    """The options a built-in takes, when its signature names them."""
    import inspect

    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    named = [f"{p.name} (default {p.default!r})" for p in params
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is not p.empty]
    return f"its options: {', '.join(named)}" if named else None


def resolve_metric(spec: MetricSpec | None) -> Metric:
    spec = spec or MetricSpec()
    return get_metric(spec.name, spec.options, spec.postprocess)


def select_outputs(metric: Metric, spec: MetricSpec | None, names: list[str]) -> list[int]:
    """Indices of the outputs the metric reads: named ones (or 0-based indices), else the first N."""
    wanted = (spec.outputs if spec else None) or None
    if not wanted:
        n = min(metric.reads_outputs, len(names)) if getattr(metric, "postprocess", None) is None else len(names)
        return list(range(max(n, 1)))
    idx = []
    for w in wanted:
        if w in names:
            idx.append(names.index(w))
        elif str(w).isdigit() and int(w) < len(names):
            idx.append(int(w))
        else:
            raise MetricError(f"--output {w!r}: the model has no such output",
                              hint=f"its outputs are {', '.join(names)} (or 0..{len(names) - 1})")
    return idx
