"""Object detection: COCO-style mAP@0.5 and mAP@0.5:0.95 (%).

Output convention (DETR/YOLOS style; ``--output`` picks the two outputs by name when the model has
more): ``logits`` (N, Q, C+1) whose LAST class is "no object" (softmax; ``activation: sigmoid`` with
``background: none`` for C independent class scores), and ``boxes`` (N, Q, 4) as (cx, cy, w, h)
normalized to [0, 1]. Any other head: a post-processing function (``postprocess: mypkg.post:fn``)
that takes the list of raw outputs and returns, per image, ``(boxes (K, 4) cxcywh, scores (K,),
classes (K,))`` in the labels' coordinates.

Labels: float (N, M, 5), rows ``[class, cx, cy, w, h]`` in the same coordinates; rows with
class < 0 are padding. AP per class is the 101-point interpolated precision/recall area (COCO),
greedy matching by score, at most ``max_detections`` (100) per image; classes without ground
truth do not count; mAP is the mean over classes (and over IoU 0.50:0.05:0.95 for map50_95)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from .base import Metric, MetricError, shape_error

WANT = ("logits (N, Q, C+1) with the last class 'no object' and boxes (N, Q, 4) cxcywh, labels (N, M, 5) "
        "[class, cx, cy, w, h] (class -1 = padding); or a postprocess function")


def _xyxy(b: np.ndarray) -> np.ndarray:
    b = np.asarray(b, dtype=np.float64).reshape(-1, 4)
    return np.stack([b[:, 0] - b[:, 2] / 2, b[:, 1] - b[:, 3] / 2, b[:, 0] + b[:, 2] / 2, b[:, 1] + b[:, 3] / 2], 1)


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix of xyxy boxes a (n, 4) x b (m, 4)."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = np.clip(rb - lt, 0, None)
    inter = wh[..., 0] * wh[..., 1]
    area = lambda x: np.clip(x[:, 2] - x[:, 0], 0, None) * np.clip(x[:, 3] - x[:, 1], 0, None)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0)


class MeanAP(Metric):
    direction = "higher"
    units = "%"
    reads_outputs = 2
    label_kinds = "iuf"
    description = WANT

    def __init__(self, thresholds: tuple[float, ...] = (0.5,), name: str = "map50",
                 postprocess: Callable | None = None, **options):
        super().__init__(**options)
        self.thresholds = thresholds
        self.name = name
        self.postprocess = postprocess
        self._cache: tuple | None = None

    # --- outputs -> per-image detections ---------------------------------------------------
    def _detections(self, outputs) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        if self.postprocess is not None:
            try:
                dets = list(self.postprocess(list(outputs)))
            except Exception as exc:  # the user's function: name it and its error
                raise MetricError(f"the detection postprocess function failed: {type(exc).__name__}: {exc}") from exc
            if len(dets) != len(outputs[0]):
                raise MetricError(f"postprocess returned {len(dets)} images for {len(outputs[0])} samples")
            return [(_xyxy(b), np.asarray(s, dtype=np.float64).reshape(-1), np.asarray(c).reshape(-1).astype(np.int64))
                    for b, s, c in dets]
        if len(outputs) < 2:
            raise shape_error(self.name, outputs, None, WANT)
        logits, boxes = np.asarray(outputs[0], dtype=np.float64), np.asarray(outputs[1], dtype=np.float64)
        if logits.ndim != 3 or boxes.shape != logits.shape[:2] + (4,):
            raise shape_error(self.name, outputs, None, WANT)
        if self.options.get("activation", "softmax") == "sigmoid":
            probs = 1.0 / (1.0 + np.exp(-logits))
        else:
            e = np.exp(logits - logits.max(axis=-1, keepdims=True))
            probs = e / e.sum(axis=-1, keepdims=True)
        if self.options.get("background", "last") == "last":
            probs = probs[..., :-1]
        cls = probs.argmax(axis=-1)
        score = probs.max(axis=-1)
        k = int(self.options.get("max_detections", 100))
        out = []
        for i in range(len(logits)):
            order = np.argsort(-score[i], kind="stable")[:k]
            out.append((_xyxy(boxes[i][order]), score[i][order], cls[i][order]))
        return out

    @staticmethod
    def _truths(labels) -> list[tuple[np.ndarray, np.ndarray]]:
        y = np.asarray(labels, dtype=np.float64)
        res = []
        for row in y:
            keep = row[:, 0] >= 0
            res.append((_xyxy(row[keep, 1:5]), row[keep, 0].astype(np.int64)))
        return res

    def check(self, outputs, labels):
        y = np.asarray(labels)
        if y.ndim != 3 or y.shape[-1] != 5 or len(y) != len(outputs[0]):
            raise shape_error(self.name, outputs, labels, WANT)
        self._detections(outputs[:2] if self.postprocess is None else outputs)

    # --- scoring ---------------------------------------------------------------------------
    def _prepared(self, outputs, labels):
        key = (id(outputs[0]), id(labels))
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, self._detections(outputs), self._truths(labels))
        return self._cache[1], self._cache[2]

    def score(self, outputs, labels) -> float:
        dets, gts = self._prepared(outputs, labels)
        return self.score_subset(dets, gts, np.arange(len(gts)))

    def subset_scorer(self, outputs, labels) -> Callable[[np.ndarray], float]:
        dets, gts = self._prepared(outputs, labels)
        return lambda idx: self.score_subset(dets, gts, idx)

    def score_subset(self, dets, gts, idx: np.ndarray) -> float:
        classes = sorted({int(c) for i in idx for c in gts[i][1]})
        if not classes:
            return 0.0
        aps = []
        for thr in self.thresholds:
            for c in classes:
                aps.append(self._ap(dets, gts, idx, c, thr))
        return 100.0 * float(np.mean(aps))

    @staticmethod
    def _ap(dets, gts, idx, c: int, thr: float) -> float:
        scores, tps = [], []
        n_gt = 0
        for i in idx:
            gb, gc = gts[i]
            g = gb[gc == c]
            n_gt += len(g)
            db, ds, dc = dets[i]
            sel = dc == c
            d, s = db[sel], ds[sel]
            if not len(d):
                continue
            order = np.argsort(-s, kind="stable")
            d, s = d[order], s[order]
            tp = np.zeros(len(d))
            if len(g):
                iou = box_iou(d, g)
                taken = np.zeros(len(g), dtype=bool)
                for j in range(len(d)):
                    cand = np.where(~taken & (iou[j] >= thr))[0]
                    if len(cand):
                        best = cand[np.argmax(iou[j, cand])]
                        taken[best] = True
                        tp[j] = 1
            scores.append(s)
            tps.append(tp)
        if n_gt == 0:
            return 0.0
        if not scores:
            return 0.0
        s = np.concatenate(scores)
        tp = np.concatenate(tps)[np.argsort(-s, kind="stable")]
        ctp = np.cumsum(tp)
        cfp = np.cumsum(1 - tp)
        recall = ctp / n_gt
        precision = ctp / np.maximum(ctp + cfp, 1e-12)
        precision = np.maximum.accumulate(precision[::-1])[::-1]  # the precision envelope
        grid = np.linspace(0, 1, 101)
        pos = np.searchsorted(recall, grid, side="left")
        return float(np.mean(np.where(pos < len(precision), precision[np.minimum(pos, len(precision) - 1)], 0.0)))
