"""Semantic segmentation: per-pixel accuracy and mean IoU (%) from per-pixel logits.

Logits are (N, C, H, W) (channels first, as PyTorch models give them) or (N, H, W, C); labels are
integer class maps (N, H, W) at the logits' resolution. Label values < 0 or equal to
``ignore_index`` (default 255) are not scored."""

from __future__ import annotations

import numpy as np

from .base import Metric, shape_error

WANT = "logits (N, C, H, W) or (N, H, W, C) and integer labels (N, H, W) at the logits' resolution"


def _pred_labels(m: Metric, outputs, labels) -> tuple[np.ndarray, np.ndarray, int]:
    out = np.asarray(outputs[0])
    y = np.asarray(labels)
    if out.ndim < 3 or y.ndim != out.ndim - 1 or len(y) != len(out):
        raise shape_error(m.name, outputs, labels, WANT)
    if tuple(out.shape[2:]) == tuple(y.shape[1:]):
        pred, classes = out.argmax(axis=1), out.shape[1]
    elif tuple(out.shape[1:-1]) == tuple(y.shape[1:]):
        pred, classes = out.argmax(axis=-1), out.shape[-1]
    else:
        raise shape_error(m.name, outputs, labels, WANT)
    return pred.reshape(len(out), -1), y.reshape(len(y), -1).astype(np.int64), classes


def _valid(m: Metric, y: np.ndarray) -> np.ndarray:
    ignore = int(m.options.get("ignore_index", 255))
    return (y >= 0) & (y != ignore)


class PixelAccuracy(Metric):
    name = "pixel_accuracy"
    units = "%"
    description = WANT

    def check(self, outputs, labels):
        _pred_labels(self, outputs, labels)

    def stats(self, outputs, labels):
        pred, y, _ = _pred_labels(self, outputs, labels)
        valid = _valid(self, y)
        return np.stack([((pred == y) & valid).sum(axis=1), valid.sum(axis=1)], axis=1).astype(np.float64)

    def reduce(self, totals):
        return 100.0 * totals[..., 0] / np.maximum(totals[..., 1], 1)


class MeanIoU(Metric):
    """Mean over classes of intersection / union, over the classes that occur in the labels or the
    predictions of the whole set (a class seen nowhere does not count)."""

    name = "miou"
    units = "%"
    description = WANT

    def check(self, outputs, labels):
        _, y, classes = _pred_labels(self, outputs, labels)
        valid = _valid(self, y)
        if valid.any() and y[valid].max() >= classes:
            raise shape_error(self.name, outputs, labels, f"class indices below {classes} (labels hold up to "
                              f"{int(y[valid].max())})")

    def stats(self, outputs, labels):
        pred, y, classes = _pred_labels(self, outputs, labels)
        valid = _valid(self, y)
        inter = np.zeros((len(y), classes))
        union = np.zeros((len(y), classes))
        for c in range(classes):
            p, t = (pred == c) & valid, (y == c) & valid
            inter[:, c] = (p & t).sum(axis=1)
            union[:, c] = (p | t).sum(axis=1)
        return np.concatenate([inter, union], axis=1)

    def reduce(self, totals):
        c = totals.shape[-1] // 2
        inter, union = totals[..., :c], totals[..., c:]
        seen = union > 0
        iou = np.where(seen, inter / np.maximum(union, 1e-12), 0.0)
        return 100.0 * iou.sum(axis=-1) / np.maximum(seen.sum(axis=-1), 1)
