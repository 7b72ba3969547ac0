"""Measurement options that ride on the agent request beyond the target's measure block:
warmup mode, sustained mode and the external energy meter command."""

from __future__ import annotations

import shlex
from typing import Any

from ..errors import BadInputError
from .sustained import request_fields

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


def apply_measure_options(req: dict, opts: Any) -> dict:
    """Add the deploy options' measurement extras to an agent request (in place; returned)."""
    check_measure_options(opts)
    mode = getattr(opts, "warmup_mode", None)
    if mode is not None:
        req["warmup_mode"] = mode
    seconds = getattr(opts, "sustained_seconds", None)
    if seconds is not None:
        req["sustained"] = request_fields(seconds)
        # the host waits max_seconds (+ a margin) for the agent: cover the whole sustained run
        req["max_seconds"] = max(float(req.get("max_seconds") or 0), float(seconds))
    cmd = getattr(opts, "energy_command", None)
    if cmd:
        argv = shlex.split(cmd) if isinstance(cmd, str) else [str(a) for a in cmd]
        energy = req.setdefault("energy", {})
        energy["external_command"] = argv
        if "external_command" not in (energy.get("sources") or []):
            energy["sources"] = [*(energy.get("sources") or []), "external_command"]
    return req
