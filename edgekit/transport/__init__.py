"""How the host reaches a device: run a command, push and pull files."""

from .base import CommandResult, Transport
from .local import LocalTransport

__all__ = ["CommandResult", "Transport", "LocalTransport"]
