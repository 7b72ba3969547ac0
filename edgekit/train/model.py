"""Building the model from ``module:factory`` and checking the data fits it, before any process
group exists (the launcher runs these checks first, so bad input fails in a second, not after
torchrun has started N workers)."""

from __future__ import annotations

import numpy as np

from ..errors import DataError, ModelLoadError
from ..inputs.source import import_object
from .data import TrainData


def build_model(factory: str):
    import torch

    fn = import_object(factory)
    if not callable(fn):
        raise ModelLoadError(f"{factory} is not callable", hint="point at a class or a function that returns an nn.Module")
    try:
        model = fn()
    except TypeError as exc:
        raise ModelLoadError(f"{factory} cannot be called without arguments ({exc})",
                             hint="write a small factory function, e.g. def teacher(): return DigitsCNN(width=32)") from exc
    if not isinstance(model, torch.nn.Module):
        raise ModelLoadError(f"{factory}() returned {type(model).__name__}, not a torch.nn.Module")
    if not any(p.requires_grad for p in model.parameters()):
        raise ModelLoadError(f"{factory}() has no trainable parameters")
    return model


def check_fits(model, data: TrainData, factory: str) -> int:
    """Run two samples through the model; the logits must be (N, classes) with every label < classes.

    Returns the number of classes."""
    import torch

    x, _ = data.take(np.arange(min(2, data.n)))
    was_training = model.training
    model.eval()  # BatchNorm refuses a train-mode batch of 1
    try:
        with torch.no_grad():
            out = model(torch.from_numpy(x))
    except Exception as exc:  # any shape/dtype error inside the user's forward
        raise DataError(
            f"{factory} cannot run on samples of shape {tuple(x.shape[1:])} from {data.path.name} "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})",
            hint="reshape the data to the model's input layout (or pass --input-shape C,H,W for flat features)",
        ) from exc
    finally:
        model.train(was_training)
    if isinstance(out, (tuple, list)):
        out = out[0]
    if not isinstance(out, torch.Tensor) or out.ndim != 2:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise DataError(f"{factory} returns {shape}; edgekit train fits classifiers whose output is logits "
                        "of shape (batch, classes)")
    classes = int(out.shape[1])
    y = data.labels()
    lo, hi = int(y.min()), int(y.max())
    if lo < 0 or hi >= classes:
        raise DataError(
            f"labels in {data.path.name} run from {lo} to {hi}, but {factory} has {classes} outputs "
            f"(classes 0..{classes - 1})",
            hint="the labels do not match the model: give the model one output per class, or remap the labels",
        )
    return classes
