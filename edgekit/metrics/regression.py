"""Errors against targets: MSE, MAE, PSNR, SNR and cosine similarity.

The target is the label array when the eval data has one of the output's shape (regression,
denoising, embeddings with reference vectors), else the float model's own outputs on the same
inputs (any model without labels: how far does the compressed model stray from the original?)."""

from __future__ import annotations

import numpy as np

from .base import Metric, shape_error

_CAP_DB = 200.0  # beyond float32's resolution (~150 dB); identical outputs would be +inf


def _pair(m: Metric, outputs, labels) -> tuple[np.ndarray, np.ndarray]:
    out = np.asarray(outputs[0], dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if y.shape != out.shape:
        if y.size == out.size and len(y) == len(out):
            y = y.reshape(out.shape)
        else:
            raise shape_error(m.name, outputs, labels, "targets of the output's shape")
    return out.reshape(len(out), -1), y.reshape(len(y), -1)


class _Against(Metric):
    needs_labels = False  # without labels: the float model's outputs are the target
    label_kinds = "iuf"

    def check(self, outputs, labels):
        _pair(self, outputs, labels)


class MSE(_Against):
    name, direction, units = "mse", "lower", ""

    def stats(self, outputs, labels):
        o, y = _pair(self, outputs, labels)
        return np.stack([((o - y) ** 2).sum(axis=1), np.full(len(o), o.shape[1])], axis=1)

    def reduce(self, totals):
        return totals[..., 0] / np.maximum(totals[..., 1], 1)


class MAE(MSE):
    name = "mae"

    def stats(self, outputs, labels):
        o, y = _pair(self, outputs, labels)
        return np.stack([np.abs(o - y).sum(axis=1), np.full(len(o), o.shape[1])], axis=1)


class PSNR(_Against):
    """10·log10(peak² / MSE) in dB; ``peak`` is the target's range (max - min) unless given."""

    name, direction, units = "psnr", "higher", "dB"

    def stats(self, outputs, labels):
        o, y = _pair(self, outputs, labels)
        if "peak" not in self.options:  # fixed once from the whole set, so resamples share it
            self.options["peak"] = float(y.max() - y.min()) or 1.0
        return np.stack([((o - y) ** 2).sum(axis=1), np.full(len(o), o.shape[1])], axis=1)

    def reduce(self, totals):
        mse = totals[..., 0] / np.maximum(totals[..., 1], 1)
        peak = float(self.options["peak"])
        with np.errstate(divide="ignore"):
            db = 10.0 * np.log10(peak ** 2 / np.maximum(mse, 1e-300))
        return np.minimum(db, _CAP_DB)


class SNR(_Against):
    """10·log10(Σ target² / Σ (output - target)²) in dB."""

    name, direction, units = "snr", "higher", "dB"

    def stats(self, outputs, labels):
        o, y = _pair(self, outputs, labels)
        return np.stack([(y ** 2).sum(axis=1), ((o - y) ** 2).sum(axis=1)], axis=1)

    def reduce(self, totals):
        with np.errstate(divide="ignore"):
            db = 10.0 * np.log10(np.maximum(totals[..., 0], 1e-300) / np.maximum(totals[..., 1], 1e-300))
        return np.minimum(db, _CAP_DB)


class Cosine(_Against):
    """Mean per-sample cosine similarity between output and target (1 = same direction)."""

    name, direction, units = "cosine", "higher", ""

    def stats(self, outputs, labels):
        o, y = _pair(self, outputs, labels)
        num = (o * y).sum(axis=1)
        den = np.linalg.norm(o, axis=1) * np.linalg.norm(y, axis=1)
        cos = np.where(den > 0, num / np.maximum(den, 1e-300), (np.abs(o - y).sum(axis=1) == 0).astype(float))
        return np.stack([cos, np.ones(len(o))], axis=1)

    def reduce(self, totals):
        return totals[..., 0] / np.maximum(totals[..., 1], 1)
