"""Text recognition with CTC: sequence and character accuracy (%) of greedy-decoded outputs.

The output is (N, T, C) per-step class scores, probabilities or logits (PaddleOCR rec, CRNN with
the batch first): greedy decoding takes the argmax class at each of the T steps, collapses runs of
the same class, then drops the blank (option ``blank``, default 0, PaddleOCR's and PyTorch CTC's
convention). So "a a - a" decodes to "aa" and "a a a" to "a".

Labels are integer class indices (N, L), each row a label sequence padded at the end with -1
(any negative value is padding); edgekit never sees the alphabet: map the characters to the
recognizer's class indices when writing the eval .npz (PaddleOCR: line i of the dict file is class
i + 1, blank 0).

``ctc_accuracy``: percent of samples whose decoded sequence equals the label exactly.
``ctc_char_accuracy``: per sample 1 - edit_distance(decoded, label) / len(label), clipped at 0
(an empty label scores 1 when the decoding is empty too, else 0), averaged, in percent.
"""

from __future__ import annotations

import numpy as np

from .base import Metric, MetricError, shape_error

WANT = ("per-step class scores (N, T, C), batch first, and integer label sequences (N, L) padded with -1 "
        "(a time-major (T, N, C) output must be transposed by the model or a user metric)")


def greedy_decode(scores: np.ndarray, blank: int = 0) -> list[np.ndarray]:
    """Best path per sample: argmax per step, repeats collapsed, blanks dropped (in that order, so a
    blank between two equal classes keeps both)."""
    pred = np.asarray(scores).argmax(axis=-1)
    keep = pred != blank
    keep[:, 1:] &= pred[:, 1:] != pred[:, :-1]
    return [p[k] for p, k in zip(pred, keep)]


def edit_distance(a, b) -> int:
    """Levenshtein distance (insertions, deletions, substitutions cost 1), one row at a time."""
    a, b = np.asarray(a), np.asarray(b)
    if len(a) == 0 or len(b) == 0:
        return int(max(len(a), len(b)))
    steps = np.arange(len(b) + 1)
    prev = steps.copy()
    for i, x in enumerate(a, 1):
        base = np.empty_like(prev)
        base[0] = i
        base[1:] = np.minimum(prev[1:] + 1, prev[:-1] + (b != x))  # deletion, substitution / match
        prev = np.minimum.accumulate(base - steps) + steps  # insertions: cur[j] = min_k base[k] + (j - k)
    return int(prev[-1])


def _sequences(labels: np.ndarray) -> list[np.ndarray]:
    return [row[row >= 0] for row in np.asarray(labels, dtype=np.int64)]


class _CTCMetric(Metric):
    units = "%"
    description = WANT

    def __init__(self, blank: int = 0):
        super().__init__(blank=blank)
        if isinstance(blank, bool) or not isinstance(blank, (int, np.integer)) or blank < 0:
            raise MetricError(f"metric {self.name}: option blank={blank!r} must be a class index >= 0",
                              hint="blank is the CTC blank class (PaddleOCR and PyTorch CTC: 0)")
        self.blank = int(blank)

    def check(self, outputs, labels):
        out = np.asarray(outputs[0])
        y = None if labels is None else np.asarray(labels)
        if out.ndim != 3 or y is None or y.ndim != 2 or len(y) != len(out):
            raise shape_error(self.name, outputs, labels, WANT)
        classes = out.shape[-1]
        if self.blank >= classes:
            raise MetricError(f"metric {self.name}: blank={self.blank} but the output has {classes} classes",
                              hint=f"set the blank option to the CTC blank's class index (0..{classes - 1})")
        seq = y[y >= 0]
        if seq.size and seq.max() >= classes:
            raise shape_error(self.name, outputs, labels, f"label classes below {classes} (labels hold up to "
                              f"{int(seq.max())}: is the alphabet the recognizer's?)")
        if (seq == self.blank).any():
            raise MetricError(f"metric {self.name}: the labels hold the blank class {self.blank}",
                              hint="labels are character classes (the blank never is one) padded with -1; "
                              "shift them by one (PaddleOCR: dict line i is class i + 1), or set blank to the "
                              "model's blank index")

    def pairs(self, outputs, labels) -> list[tuple[np.ndarray, np.ndarray]]:
        return list(zip(greedy_decode(outputs[0], self.blank), _sequences(labels)))

    def reduce(self, totals):
        return 100.0 * totals[..., 0] / np.maximum(totals[..., 1], 1)


class CTCAccuracy(_CTCMetric):
    name = "ctc_accuracy"

    def stats(self, outputs, labels):
        hit = [float(len(p) == len(t) and bool((p == t).all())) for p, t in self.pairs(outputs, labels)]
        return np.stack([np.asarray(hit, dtype=np.float64), np.ones(len(hit))], axis=1)


class CTCCharAccuracy(_CTCMetric):
    name = "ctc_char_accuracy"

    def stats(self, outputs, labels):
        acc = []
        for p, t in self.pairs(outputs, labels):
            if len(t) == 0:
                acc.append(1.0 if len(p) == 0 else 0.0)
            else:
                acc.append(max(0.0, 1.0 - edit_distance(p, t) / len(t)))
        return np.stack([np.asarray(acc, dtype=np.float64), np.ones(len(acc))], axis=1)
