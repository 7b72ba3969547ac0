"""A latency estimate for a part with no board, that says it is one: ``ms = MACs x cycles_per_mac / clock``, with
one cycles-per-MAC figure per core class fitted on published MLPerf Tiny v1.1 results of the four reference models
on that class of core, and its error stated as the leave-one-out error on those same published figures (each
model predicted from the other three). The published runs used ST's X-CUBE-AI 8.0.0, not TFLite Micro: the
estimate is of an optimized runtime on the part, not of TFLM's reference kernels.

Source: github.com/mlcommons/tiny_results_v1.1, closed/Krai/results/README.md (throughput, inferences per second).
The boards' clocks are the parts' maximum (ST's datasheets: STM32L4R5 120 MHz, STM32H7A3 280 MHz); the results do
not state the clock they ran at, which is an assumption of this estimate."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

SOURCE = ("MLPerf Tiny v1.1 closed results, Krai, X-CUBE-AI 8.0.0 (github.com/mlcommons/tiny_results_v1.1, "
          "closed/Krai/results/README.md)")

# core class -> (the board, its clock MHz, inferences per second by reference model)
PUBLISHED: dict[str, tuple[str, float, dict[str, float]]] = {
    "cortex-m4": ("NUCLEO_L4R5ZI", 120.0, {"ad": 131.950, "ic": 4.505, "kws": 13.759, "vww": 4.522}),
    "cortex-m7": ("NUCLEO_H7A3ZI", 280.0, {"ad": 547.234, "ic": 18.215, "kws": 60.988, "vww": 19.867}),
}
CORE_CLASS = {"cortex-m4": "cortex-m4", "cortex-m4f": "cortex-m4", "cortex-m7": "cortex-m7"}


@dataclass(frozen=True)
class CoreFit:
    core: str  # the core class the figures are for
    board: str
    cycles_per_mac: float  # the median over the reference models of published cycles / their MACs
    loo_errors: dict[str, float]  # per reference model: (predicted from the others - published) / published
    published_ms: dict[str, float]

    @property
    def max_abs_error(self) -> float:
        return max(abs(e) for e in self.loo_errors.values())

    def estimate_ms(self, macs: int, clock_mhz: float) -> float:
        return macs * self.cycles_per_mac / (clock_mhz * 1e3)

    def model(self) -> str:
        return (f"ms = MACs x {self.cycles_per_mac:.2f} cycles/MAC / clock, cycles/MAC fitted on {self.board}'s "
                f"published figures; leave-one-out error on them up to {self.max_abs_error:.0%}")


def fit_core(core: str, reference_macs: dict[str, int]) -> CoreFit | None:
    """The cycles-per-MAC fit for ``core``'s class from the published figures and the reference models' MACs
    (counted from their graphs); None where no published figure is for that class of core."""
    cls = CORE_CLASS.get(core)
    if cls is None or cls not in PUBLISHED:
        return None
    board, mhz, ips = PUBLISHED[cls]
    models = [m for m in ips if reference_macs.get(m)]
    cpm = {m: (1.0 / ips[m]) * mhz * 1e6 / reference_macs[m] for m in models}
    loo = {}
    for m in models:
        others = [cpm[o] for o in models if o != m]
        if others:
            loo[m] = statistics.median(others) / cpm[m] - 1.0
    return CoreFit(core=cls, board=board, cycles_per_mac=statistics.median(cpm.values()), loo_errors=loo,
                   published_ms={m: 1000.0 / ips[m] for m in models})
