"""The zoo's own fp32 scores (numpy only), so zoo.json's numbers do not depend on edgekit.

- top1: fraction of argmax(logits) == y.
- miou: mean over classes (that occur in labels or predictions) of IoU from one confusion matrix
  over all eval pixels.
- map50: VOC-style mean average precision at IoU >= 0.5 over the classes present in the labels, for
  DETR-style outputs (logits (N, Q, C+1), last class "no object"; boxes (N, Q, 4) cx, cy, w, h in
  [0, 1]). A query's score is its highest softmax probability among the C real classes, its class
  that argmax; every query is a detection (no threshold, no NMS: a grid head puts each object in one
  cell, and duplicates are counted as false positives as usual). AP is the area under the
  monotone precision envelope (all-point interpolation).
"""

from __future__ import annotations

import numpy as np


def top1(outputs: tuple[np.ndarray, ...], y: np.ndarray) -> float:
    return float((outputs[0].argmax(-1) == y).mean())


def miou(outputs: tuple[np.ndarray, ...], y: np.ndarray) -> float:
    logits = outputs[0]
    c = logits.shape[1]
    pred = logits.argmax(1)
    cm = np.bincount(y.reshape(-1) * c + pred.reshape(-1), minlength=c * c).reshape(c, c)
    inter = np.diag(cm).astype(np.float64)
    union = cm.sum(0) + cm.sum(1) - np.diag(cm)
    ok = union > 0
    return float((inter[ok] / union[ok]).mean())


def _xyxy(b: np.ndarray) -> np.ndarray:
    return np.stack([b[..., 0] - b[..., 2] / 2, b[..., 1] - b[..., 3] / 2,
                     b[..., 0] + b[..., 2] / 2, b[..., 1] + b[..., 3] / 2], -1)


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in a (n, 4 xyxy) with every box in b (m, 4 xyxy)."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(-1)
    area = lambda x: np.clip(x[:, 2:] - x[:, :2], 0, None).prod(-1)  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None, :] - inter + 1e-12)


def map50(outputs: tuple[np.ndarray, ...], y: np.ndarray, iou_threshold: float = 0.5) -> float:
    logits, boxes = outputs[0], outputs[1]
    n_cls = logits.shape[-1] - 1
    z = logits - logits.max(-1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    score, cls = p[..., :n_cls].max(-1), p[..., :n_cls].argmax(-1)
    pred_xyxy, gt_xyxy = _xyxy(boxes), _xyxy(y[..., 1:5])
    aps = []
    for c in range(n_cls):
        n_gt = int((y[..., 0] == c).sum())
        if n_gt == 0:
            continue
        records = []  # (score, is_true_positive)
        for i in range(len(y)):
            gts = gt_xyxy[i][y[i, :, 0] == c]
            sel = np.flatnonzero(cls[i] == c)
            sel = sel[np.argsort(-score[i, sel], kind="stable")]
            used = np.zeros(len(gts), dtype=bool)
            ious = _iou(pred_xyxy[i, sel], gts) if len(gts) else np.zeros((len(sel), 0))
            for k, q in enumerate(sel):
                tp = False
                if len(gts):
                    cand = np.where(used, -1.0, ious[k])
                    j = int(cand.argmax())
                    if cand[j] >= iou_threshold:
                        used[j], tp = True, True
                records.append((float(score[i, q]), tp))
        records.sort(key=lambda r: -r[0])
        tps = np.array([r[1] for r in records], dtype=np.float64)
        ctp, cfp = np.cumsum(tps), np.cumsum(1 - tps)
        recall = ctp / n_gt
        precision = ctp / np.maximum(ctp + cfp, 1e-12)
        mrec = np.concatenate([[0.0], recall, [1.0]])
        mpre = np.concatenate([[0.0], precision, [0.0]])
        mpre = np.maximum.accumulate(mpre[::-1])[::-1]
        idx = np.flatnonzero(mrec[1:] != mrec[:-1])
        aps.append(float(((mrec[idx + 1] - mrec[idx]) * mpre[idx + 1]).sum()))
    return float(np.mean(aps)) if aps else 0.0


METRICS = {"top1": top1, "miou": miou, "map50": map50}
