"""This process's memory: RSS and its peak, PSS, and the runtime's own arena where a runner tells."""

from __future__ import annotations

import sys
from typing import Any

from .device import read_text


def memory_mb() -> tuple[float | None, float | None, str | None]:
    """(current RSS, peak RSS, source) of this process in MB; VmHWM on Linux/Android, else getrusage."""
    status = read_text("/proc/self/status")
    if status:
        vals = {}
        for line in status.splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                k, v = line.split(":", 1)
                vals[k] = int(v.split()[0]) / 1024.0
        if "VmHWM" in vals:
            return vals.get("VmRSS"), vals["VmHWM"], "VmHWM"
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak_mb = peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0
        return None, peak_mb, "ru_maxrss"
    except (ImportError, OSError, ValueError):  # no resource module (Windows) or no rusage: unknown
        return None, None, None


def pss_mb() -> float | None:
    """Proportional set size (shared pages split between their users) from smaps_rollup: the
    figure Android's memory accounting uses. None where the kernel (< 4.14) or policy hides it."""
    text = read_text("/proc/self/smaps_rollup")
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024.0
    return None


def runtime_arena(runner: Any) -> tuple[float | None, str | None]:
    """The runtime's own allocation figure when the runner exposes one (``arena_bytes()``);
    neither onnxruntime's nor LiteRT's Python API does today, so this is usually a reason."""
    fn = getattr(runner, "arena_bytes", None)
    if fn is None:
        return None, f"{getattr(runner, 'name', 'the runtime')}'s Python API does not expose its arena size"
    try:
        n = fn()
    except Exception as exc:  # a runner bug must not cost the whole measurement
        return None, f"arena_bytes() failed: {exc}"
    return (n / (1024.0 * 1024.0) if n is not None else None), None
