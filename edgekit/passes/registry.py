"""Pass names -> implementations, imported lazily so that listing passes never imports a framework."""

from __future__ import annotations

import importlib

from ..errors import ConfigError
from .base import Pass

_PASSES: dict[str, str] = {
    "quantize": "edgekit.passes.quantize_ort:OrtQuantize",
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
