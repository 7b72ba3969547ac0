"""Compression passes: one technique a file, registered by name (see registry.py)."""

from .base import Pass, PassContext
from .registry import get_pass, known_passes

__all__ = ["Pass", "PassContext", "get_pass", "known_passes"]
