"""Pass names -> implementations, imported lazily so that listing passes never imports a framework."""

from __future__ import annotations

import importlib

from ..errors import ConfigError
from .base import Pass

_PASSES: dict[str, str] = {
    "quantize": "edgekit.passes.quantize_ort:OrtQuantize",
    "convert": "edgekit.passes.convert:Convert",
    "quantize_accuracy_aware": "edgekit.passes.accuracy_aware.quantize:AccuracyAwareQuantize",
    "quantize_fp16": "edgekit.passes.quantize_fp16:Fp16Convert",
    "quantize_qat": "edgekit.passes.quantize_qat:QatQuantize",
    "quantize_inc": "edgekit.passes.quantize_inc:IncQuantize",
    "quantize_nncf": "edgekit.passes.quantize_nncf:QuantizeNncf",
    "prune_magnitude": "edgekit.passes.prune_magnitude:MagnitudePrune",
    "prune_structured": "edgekit.passes.prune_structured:StructuredPrune",
    "distill": "edgekit.passes.distill:Distill",
}


def register(name: str, target: str) -> None:
    """Register a pass by ``module:Class`` (plug-ins call this)."""
    _PASSES[name] = target


def known_passes() -> list[str]:
    return sorted(_PASSES)


def get_pass(name: str) -> Pass:
    try:
        target = _PASSES[name]
    except KeyError:
        raise ConfigError(f"unknown pass '{name}'", hint=f"known passes: {', '.join(known_passes())}") from None
    mod, cls = target.split(":")
    return getattr(importlib.import_module(mod), cls)()
