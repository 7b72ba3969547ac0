"""Pass names -> implementations (the table: ``pass_names.py``), imported lazily so that listing passes never
imports a framework."""

from __future__ import annotations

import importlib

from ..errors import ConfigError
from ..pass_names import PASSES, known_passes
from .base import Pass


def register(name: str, target: str) -> None:
    """Register a pass by ``module:Class`` (plug-ins call this)."""
    PASSES[name] = target


def get_pass(name: str) -> Pass:
    try:
        target = PASSES[name]
    except KeyError:
        raise ConfigError(f"unknown pass '{name}'", hint=f"known passes: {', '.join(known_passes())}") from None
    mod, cls = target.split(":")
    return getattr(importlib.import_module(mod), cls)()
