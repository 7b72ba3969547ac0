"""The options every kind of model's run takes alike: how each file is measured on the device, and how the device
is held. Fixed graphs' ``DeployOptions`` (``orchestration/options.py``) and language models' ``LMOptions``
(``llm/options.py``) extend :class:`RunOptions`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class RunOptions:
    """What every kind of model's run takes alike (None = the target file's): how each file is measured on the
    device, and how the device is held. :class:`DeployOptions` (fixed graphs) and ``LMOptions`` (language models)
    both extend it, so a shared option has one name, type and default."""

    warmup: int | None = None
    runs: int | None = None
    min_seconds: float | None = None
    threads: int | None = None
    remeasure: bool = False  # measure again even when the measurement cache holds a valid result
    sustained_seconds: float | None = None  # run each variant this long and report latency over time
    lock_wait: bool = True  # False: fail at once (exit 3) when another deploy holds the device
    lock_timeout: float | None = None  # seconds to wait for the device's lock (None = as long as it takes)

    def measure_overrides(self) -> dict[str, Any]:
        """The target's measure settings this run overrides (MeasureDefaults field -> value)."""
        pairs = (("warmup", self.warmup), ("runs", self.runs), ("min_seconds", self.min_seconds),
                 ("threads", self.threads))
        return {k: v for k, v in pairs if v is not None}
