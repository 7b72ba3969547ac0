"""Binary masks: per-sample IoU and F1 (%) of a thresholded probability map, as a DB-style text
detector (PaddleOCR det, DBNet) or any one-class segmenter gives it.

The output is a probability map (N, 1, H, W), (N, H, W, 1) or (N, H, W) with values in [0, 1];
labels are 0/1 masks of the same (N, H, W) or (N, 1, H, W) size. Options: ``threshold`` (default
0.3, the binarization threshold DB text detectors use: a pixel is text where p > threshold) and
``activation`` (``none``, default; ``sigmoid`` when the model outputs logits). Each sample scores
its own IoU |P∩L| / |P∪L| and F1 2|P∩L| / (|P| + |L|) (a sample with both masks empty scores 1);
the value is their mean over the samples.
"""

from __future__ import annotations

import numpy as np

from .base import Metric, binary_options, check_binary_labels, shape_error, to_probabilities

DEFAULT_THRESHOLD = 0.3  # DBPostProcess(thresh=0.3) in PaddleOCR; DBNet's binarization default

WANT = ("a probability map (N, 1, H, W), (N, H, W, 1) or (N, H, W) and 0/1 masks (N, H, W) or (N, 1, H, W) at "
        "the map's resolution (a C-class logit map (N, C, H, W) with class-index labels is --metric miou)")


def _one_channel(a: np.ndarray) -> np.ndarray | None:
    if a.ndim == 3:
        return a
    if a.ndim == 4 and a.shape[1] == 1:
        return a[:, 0]
    if a.ndim == 4 and a.shape[-1] == 1:
        return a[..., 0]
    return None


def _maps(m: Metric, outputs, labels) -> tuple[np.ndarray, np.ndarray]:
    out = _one_channel(np.asarray(outputs[0]))
    y = None if labels is None else _one_channel(np.asarray(labels))
    if out is None or y is None or out.shape != y.shape:
        raise shape_error(m.name, outputs, labels, WANT)
    return out.reshape(len(out), -1), y.reshape(len(y), -1)


class _MaskMetric(Metric):
    units = "%"
    label_kinds = "iuf"
    description = WANT

    def __init__(self, threshold: float = DEFAULT_THRESHOLD, activation: str = "none"):
        super().__init__(threshold=threshold, activation=activation)
        self.threshold, self.activation = binary_options(self.name, threshold, activation)

    def check(self, outputs, labels):
        _, y = _maps(self, outputs, labels)
        check_binary_labels(self.name, y, "mask pixels")

    def counts(self, outputs, labels) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per sample: |P∩L|, |P|, |L|."""
        out, y = _maps(self, outputs, labels)
        p = to_probabilities(out, self.activation) > self.threshold
        t = y > 0.5
        return (p & t).sum(axis=1), p.sum(axis=1), t.sum(axis=1)

    def reduce(self, totals):
        return 100.0 * totals[..., 0] / np.maximum(totals[..., 1], 1)


class MaskIoU(_MaskMetric):
    name = "mask_iou"

    def stats(self, outputs, labels):
        inter, p, t = self.counts(outputs, labels)
        union = p + t - inter
        iou = np.where(union > 0, inter / np.maximum(union, 1), 1.0)
        return np.stack([iou, np.ones(len(iou))], axis=1)


class MaskF1(_MaskMetric):
    name = "mask_f1"

    def stats(self, outputs, labels):
        inter, p, t = self.counts(outputs, labels)
        denom = p + t
        f1 = np.where(denom > 0, 2.0 * inter / np.maximum(denom, 1), 1.0)
        return np.stack([f1, np.ones(len(f1))], axis=1)
