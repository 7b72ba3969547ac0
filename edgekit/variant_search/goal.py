"""A budget as a goal (issue #46): one abstraction over the quantity a budget holds down.

A :class:`Budget` is one quantity and its limit, read from the run's gate (the command line over the recipe over
the target): the p50 latency (``--latency-budget-ms``, judged on the p50's 95% CI upper bound, so a lucky run does
not pass), the peak memory of the inference process measured on the device (``--memory-budget-mb``), or the file
size (``--size-budget-mb``, MB of 10^6 bytes). A :class:`BudgetGoal` holds every budget the run has; a file meets
the goal when it meets all of them. The search prunes until it does (``budget.py``); the quantities' planners are
the device's latency table (``latency_table.py``), the device's peak-memory table and the exact size model
(``footprint.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from ..report.model import VariantResult

Quantity = Literal["latency", "memory", "size"]
QUANTITIES: tuple[Quantity, ...] = ("latency", "memory", "size")
GATE_KEYS: dict[Quantity, str] = {"latency": "latency_ms_p50", "memory": "peak_memory_mb", "size": "model_size_mb"}
FLAGS: dict[Quantity, str] = {"latency": "--latency-budget-ms", "memory": "--memory-budget-mb",
                              "size": "--size-budget-mb"}
UNITS: dict[str, str] = {"latency": "ms", "memory": "MB", "size": "MB"}
RECOVERY_EPOCHS = 3  # fine-tune and distillation epochs of each student (tiny models; the time budget cuts more)


def upper(v: VariantResult) -> float:
    """The p50's 95% CI upper bound (the p50 when there is no CI; inf when not timed)."""
    lat = v.latency_ms
    if lat is None:
        return float("inf")
    return float(lat.ci95[1]) if lat.ci95 else float(lat.p50)


def measured(v: VariantResult, q: Quantity) -> float | None:
    """The quantity a budget judges, as measured: the p50's CI upper bound, the peak memory, the file size."""
    if q == "latency":
        return None if v.latency_ms is None else upper(v)
    if q == "memory":
        return None if v.peak_memory_mb is None else float(v.peak_memory_mb)
    return float(v.size_bytes) / 1e6


@dataclass(frozen=True)
class Budget:
    quantity: Quantity
    limit: float

    def meets(self, v: VariantResult) -> bool:
        x = measured(v, self.quantity)
        return x is not None and x <= self.limit

    def ratio(self, v: VariantResult) -> float:
        """How far over (>1) or under the limit the file is; inf when the quantity was not measured."""
        x = measured(v, self.quantity)
        return float("inf") if x is None else x / self.limit if self.limit > 0 else float("inf")

    def label(self) -> str:
        return f"the {self.limit:g} {UNITS[self.quantity]} {self.quantity} budget"

    def describe(self, v: VariantResult) -> str:
        """The file's figure for this budget, in words."""
        if self.quantity == "latency":
            if v.latency_ms is None:
                return "latency not measured"
            return f"p50 {v.latency_ms.p50:.4g} ms, its 95% CI upper bound {upper(v):.4g} ms"
        if self.quantity == "memory":
            return ("peak memory not measured" if v.peak_memory_mb is None
                    else f"peak memory {v.peak_memory_mb:.4g} MB")
        return f"file size {v.size_bytes / 1e6:.4g} MB"


@dataclass
class BudgetGoal:
    budgets: list[Budget]
    arch: str
    groups: dict[str, int]  # prunable group -> full width
    epochs: int = RECOVERY_EPOCHS
    teacher: Any = None  # the distilled student's teacher (an Artifact; None: the source model)
    record: dict[str, Any] = field(default_factory=dict)  # what the report's search section carries as `budget`

    def limit(self, q: Quantity) -> float | None:
        return next((b.limit for b in self.budgets if b.quantity == q), None)

    def limits(self) -> dict[str, float]:
        return {b.quantity: b.limit for b in self.budgets}

    @property
    def latency_ms(self) -> float | None:
        return self.limit("latency")

    def quantities(self) -> list[Quantity]:
        return [b.quantity for b in self.budgets]

    def meets(self, v: VariantResult) -> bool:
        """Every budget holds (latency on the p50's 95% CI upper bound: a lucky run does not pass)."""
        return all(b.meets(v) for b in self.budgets)

    def distance(self, v: VariantResult) -> float:
        """The worst budget's measured/limit ratio: below 1 the file meets the goal."""
        return max(b.ratio(v) for b in self.budgets)

    def choose(self, qualified: list[VariantResult]) -> VariantResult | None:
        """The most accurate of the qualified files inside every budget; equal accuracy: the faster p50, then the
        one furthest inside its budgets."""
        inside = [v for v in qualified if self.meets(v)]
        if not inside:
            return None

        def acc(v: VariantResult) -> float:
            a = v.accuracy
            return 0.0 if a is None else (-a.value if a.direction == "lower" else a.value)

        return max(inside, key=lambda v: (acc(v), -(v.latency_ms.p50 if v.latency_ms else 0.0), -self.distance(v),
                                          v.name))

    def over(self, v: VariantResult) -> str:
        """Why a file inside the gate misses the goal, in words (every budget it misses)."""
        return "; ".join(f"{b.describe(v)} is over {b.label()}" for b in self.budgets if not b.meets(v))

    def closest(self, points: list[VariantResult]) -> str:
        """The measured point closest to the goal (the least worst budget ratio), in words."""
        known = [v for v in points if self.distance(v) != float("inf")]
        if not known:
            return "no point was measured"
        v = min(known, key=self.distance)
        acc = f"{v.accuracy.metric} {v.accuracy.value:.4g}" if v.accuracy is not None else "accuracy not measured"
        figures = ", ".join(
            (f"p50 {v.latency_ms.p50:.4g} ms (95% CI upper {upper(v):.4g} ms) against the {b.limit:g} ms budget"
             if b.quantity == "latency" and v.latency_ms is not None else f"{b.describe(v)} against {b.label()}")
            for b in self.budgets)
        return f"the closest measured point is {v.name}: {figures}, {acc}"

    def doc(self) -> dict[str, Any]:
        return {"budgets": {b.quantity: {"limit": b.limit, "unit": UNITS[b.quantity], "option": FLAGS[b.quantity]}
                            for b in self.budgets},
                "judged_on": "; ".join({"latency": "latency: the p50's 95% CI upper bound",
                                        "memory": "memory: the peak memory measured on the device",
                                        "size": "size: the file's bytes"}[q] for q in self.quantities())}


def budgets_of(gate: Any) -> list[Budget]:
    """The run's budgets, from its resolved gate (the command line over the recipe over the target)."""
    out: list[Budget] = []
    for q in QUANTITIES:
        limit = getattr(gate, GATE_KEYS[q], None)
        if limit is not None:
            out.append(Budget(q, float(limit)))
    return out
