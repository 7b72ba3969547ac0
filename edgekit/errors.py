"""One exception tree for edgekit.

Every error a user can cause or meet carries an exit code (the CLI contract: 1 gate failed, 2 bad input or
usage, 3 device or transport failure) and a hint that says what to do. Third-party errors are mapped at the
boundary with ``raise X(...) from exc``.

    EdgekitError
    ├── BadInputError (2): ModelLoadError, DataError (MetricError), TargetError, ConfigError, OutputError,
    │                      MissingExtraError, ConversionError, PassError
    ├── GateFailed (1): the run worked and the gate says do not ship (Report.raise_for_gate)
    ├── DeviceError (3): TransportError (AdbStateError), AgentError, AgentRunFailed (a variant the agent could
    │                    not run, with its kind), DeviceLockedError (DeviceLeaseHeld, PlaceHeld),
    │                    CoordinatorUnreachable, CoordinatorRefused, TrainFailedError
    └── BudgetExceeded (2): a search ran out of its time budget before anything could be measured

Every public error is importable from ``edgekit`` itself.
"""

from __future__ import annotations

from types import ModuleType


class EdgekitError(Exception):
    """Base of every edgekit error. ``exit_code`` is what the CLI returns."""

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\n  hint: {self.hint}"
        return self.message


# --- bad input (exit 2) ------------------------------------------------------------------
class BadInputError(EdgekitError):
    """The user gave something edgekit cannot use."""


class ModelLoadError(BadInputError):
    """A model file is missing, corrupt or of a kind edgekit refuses to load."""


class DataError(BadInputError):
    """An eval or calibration data set is missing, malformed or does not fit the model."""


class TargetError(BadInputError):
    """An unknown target name or an invalid target file."""


class ConfigError(BadInputError):
    """A recipe, inventory or other config file is invalid."""


class OutputError(BadInputError):
    """The output location cannot be written."""


class MissingExtraError(BadInputError):
    """An optional dependency is not installed."""

    def __init__(self, package: str, extra: str, purpose: str):
        super().__init__(
            f"{purpose} needs the Python package '{package}', which is not installed",
            hint=f"pip install 'edgekit[{extra}]'",
        )
        self.package = package
        self.extra = extra


class ConversionError(BadInputError):
    """A converter hop failed or its parity is outside tolerance."""

    def __init__(self, message: str, *, hop: str, hint: str | None = None):
        super().__init__(f"[{hop}] {message}", hint=hint)
        self.hop = hop


class PassError(BadInputError):
    """A compression pass could not produce an acceptable artifact."""


# --- the gate (exit 1) -------------------------------------------------------------------
class GateFailed(EdgekitError):
    """The release gate failed: the run worked, and the device says the model must not ship
    (``Report.raise_for_gate()``; the CLI's exit 1). ``failed`` holds the failed checks' names and messages."""

    exit_code = 1

    def __init__(self, message: str, *, failed: list[tuple[str, str]] | None = None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.failed = list(failed or [])


# --- device / transport (exit 3) ---------------------------------------------------------
class DeviceError(EdgekitError):
    """The device or the transport to it failed; no measurement is claimed."""

    exit_code = 3


class TransportError(DeviceError):
    """Connecting, transferring or running a command on the device failed."""


class AgentError(DeviceError):
    """The on-device agent failed or printed something that is not a valid report."""


def require(package: str, extra: str, purpose: str) -> ModuleType:
    """Import an optional dependency or fail with the exact install hint."""
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError as exc:
        raise MissingExtraError(package.split(".")[0], extra, purpose) from exc
