"""Classification: top-1 / top-k accuracy on (N, classes) logits, multi-label F1 on (N, classes)."""

from __future__ import annotations

import numpy as np

from .base import Metric, shape_error


def _logits_labels(metric: str, outputs, labels) -> tuple[np.ndarray, np.ndarray]:
    out = np.asarray(outputs[0])
    y = np.asarray(labels)
    n = len(out)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    logits = out.reshape(n, -1) if out.ndim > 2 and int(np.prod(out.shape[2:])) == 1 else out
    if logits.ndim != 2 or y.shape != (n,):
        raise shape_error(metric, outputs, labels, "logits (N, classes) and integer labels (N,)")
    return logits, y.astype(np.int64)


class TopK(Metric):
    direction = "higher"
    units = "%"
    description = "labels are class indices (N,); the output is (N, classes) logits or scores"

    def __init__(self, k: int = 1, **options):
        super().__init__(**options)
        self.k = int(k)
        self.name = "top1" if self.k == 1 else f"top{self.k}"

    def check(self, outputs, labels):
        logits, y = _logits_labels(self.name, outputs, labels)
        if y.size and (y.min() < 0 or y.max() >= logits.shape[1]):
            raise shape_error(self.name, outputs, labels,
                              f"class indices in 0..{logits.shape[1] - 1} (labels hold {y.min()}..{y.max()})")

    def stats(self, outputs, labels):
        logits, y = _logits_labels(self.name, outputs, labels)
        if self.k == 1:
            hit = logits.argmax(axis=1) == y
        else:
            top = np.argpartition(-logits, min(self.k, logits.shape[1]) - 1, axis=1)[:, : self.k]
            hit = (top == y[:, None]).any(axis=1)
        return np.stack([hit.astype(np.float64), np.ones(len(y))], axis=1)

    def reduce(self, totals):
        return 100.0 * totals[..., 0] / np.maximum(totals[..., 1], 1)


class MultilabelF1(Metric):
    """Micro-averaged F1 (%) of multi-label predictions: sigmoid(logit) > threshold (default 0.5);
    ``activation: none`` when the model already outputs probabilities."""

    name = "multilabel_f1"
    direction = "higher"
    units = "%"
    label_kinds = "iuf"
    description = "labels are 0/1 per class (N, classes); the output is (N, classes) logits"

    def check(self, outputs, labels):
        out = np.asarray(outputs[0])
        if labels is None or out.shape != np.asarray(labels).shape or out.ndim != 2:
            raise shape_error(self.name, outputs, labels, "logits (N, classes) and 0/1 labels of the same shape")

    def stats(self, outputs, labels):
        out = np.asarray(outputs[0], dtype=np.float64)
        probs = out if self.options.get("activation") == "none" else 1.0 / (1.0 + np.exp(-out))
        pred = probs > float(self.options.get("threshold", 0.5))
        y = np.asarray(labels) > 0.5
        tp = (pred & y).sum(axis=1)
        fp = (pred & ~y).sum(axis=1)
        fn = (~pred & y).sum(axis=1)
        return np.stack([tp, fp, fn], axis=1).astype(np.float64)

    def reduce(self, totals):
        tp, fp, fn = totals[..., 0], totals[..., 1], totals[..., 2]
        denom = 2 * tp + fp + fn
        return np.where(denom > 0, 100.0 * 2 * tp / np.maximum(denom, 1e-12), 100.0)
