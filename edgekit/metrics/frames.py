"""Per-frame binary accuracy (%) of a streaming detector (voice activity: Silero VAD, WebRTC-style
speech probability per chunk).

The output is a probability per sample, (N,) or (N, 1) (each eval sample is one chunk or frame),
or per frame of a sample, (N, T) or (N, T, 1); labels are 0/1 of the same (N,) / (N, T) size (a
trailing axis of 1 is fine on either side). A frame is positive where p >= ``threshold`` (default
0.5); ``activation: sigmoid`` when the model outputs logits. The value is the percent of all frames
where the decision equals the label.
"""

from __future__ import annotations

import numpy as np

from .base import Metric, binary_options, check_binary_labels, shape_error, to_probabilities

WANT = ("a probability per sample (N,) / (N, 1) or per frame (N, T) and 0/1 labels of the same size "
        "(a 2-class softmax (N, 2) with class-index labels is --metric top1)")


def _frames(m: Metric, outputs, labels) -> tuple[np.ndarray, np.ndarray]:
    out = np.asarray(outputs[0])
    y = None if labels is None else np.asarray(labels)
    if out.ndim == 0 or y is None or y.ndim == 0 or len(y) != len(out):
        raise shape_error(m.name, outputs, labels, WANT)
    o = out.reshape(len(out), *[d for d in out.shape[1:] if d != 1])
    t = y.reshape(len(y), *[d for d in y.shape[1:] if d != 1])
    if o.shape != t.shape or o.ndim > 2:
        raise shape_error(m.name, outputs, labels, WANT)
    return o.reshape(len(o), -1), t.reshape(len(t), -1)


class FrameAccuracy(Metric):
    name = "frame_accuracy"
    units = "%"
    label_kinds = "iuf"
    description = WANT

    def __init__(self, threshold: float = 0.5, activation: str = "none"):
        super().__init__(threshold=threshold, activation=activation)
        self.threshold, self.activation = binary_options(self.name, threshold, activation)

    def check(self, outputs, labels):
        _, y = _frames(self, outputs, labels)
        check_binary_labels(self.name, y, "frame labels")

    def stats(self, outputs, labels):
        out, y = _frames(self, outputs, labels)
        hit = (to_probabilities(out, self.activation) >= self.threshold) == (y > 0.5)
        return np.stack([hit.sum(axis=1), np.full(len(hit), hit.shape[1])], axis=1).astype(np.float64)

    def reduce(self, totals):
        return 100.0 * totals[..., 0] / np.maximum(totals[..., 1], 1)
