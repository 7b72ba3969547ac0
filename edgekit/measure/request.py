"""Measurement options that ride on the agent request beyond the target's measure block:
warmup mode, sustained mode and the external energy meter command."""

from __future__ import annotations

import shlex
from typing import Any

from ..agent.protocol import MeasureOptions, split_command
from ..errors import BadInputError

WARMUP_MODES = ("fixed", "auto")


def check_measure_options(opts: Any) -> None:
    """Fail on a bad option before any heavy work (the pipeline calls this first)."""
    mode = getattr(opts, "warmup_mode", None)
    if mode is not None and mode not in WARMUP_MODES:
        raise BadInputError(f"warmup mode {mode!r} is not one of {', '.join(WARMUP_MODES)}",
                            hint="--warmup-mode auto warms up until latency stabilizes; fixed runs --warmup times")
    seconds = getattr(opts, "sustained_seconds", None)
    if seconds is not None and seconds <= 0:
        raise BadInputError(f"sustained run length {seconds} s must be > 0", hint="e.g. --sustained 300")
    cmd = getattr(opts, "energy_command", None)
    if isinstance(cmd, str):
        try:
            shlex.split(cmd)
        except ValueError as exc:
            raise BadInputError(f"--energy-command {cmd!r} cannot be split into arguments ({exc})",
                                hint="quote it like a shell command line") from exc


def measure_options(opts: Any):
    """The deploy options' measurement extras, checked once, as the request builder takes them."""

    check_measure_options(opts)
    return MeasureOptions(warmup_mode=getattr(opts, "warmup_mode", None),
                          sustained_seconds=getattr(opts, "sustained_seconds", None),
                          energy_command=split_command(getattr(opts, "energy_command", None)),
                          max_seconds=float(getattr(opts, "max_seconds", None) or 120.0))
