"""Compression passes: one technique a file, registered by name (see registry.py)."""

from ..pass_names import known_passes
from .base import Pass, PassContext
from .registry import get_pass

__all__ = ["Pass", "PassContext", "get_pass", "known_passes"]
