"""What removing channels buys in memory and size (issue #46), the planners of the memory and size budgets beside
the latency table (``latency_table.py``):

- :class:`SizeModel`: the file size at any per-group widths, computed, not measured: the exact parameter count of
  the widths (``passes/prune_latency.ParamModel``) times the encoding's bytes per parameter, plus its fixed
  overhead, both read from two files built through the encoding (the base and every group at its narrowest
  width). Every narrower width is smaller, so every width pays.
- :class:`MemoryTable`: the peak memory of the inference process measured on the device, in the encoding and
  runtime that will ship: the base and each group at each width of its grid, each in its own agent run (the peak
  is a process's). Savings add up (weights and the runtime's buffers); a width pays when it saves more than
  ``MEMORY_NOISE_MB`` and ``MEMORY_NOISE_SHARE`` of the base (a process's peak moves by allocator pages run to
  run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..devices.session import MeasureFailure
from ..errors import DeviceError
from .latency_table import build_point

if TYPE_CHECKING:
    from ..devices.session import DeviceSession, RunSettings
    from ..inputs.recipe import PassStep
    from ..orchestration.prepare import PreparedRun
    from ..passes.base import PassContext
    from ..passes.prune_latency import ParamModel

Progress = Callable[[str], None]
MEMORY_NOISE_MB = 1.0
MEMORY_NOISE_SHARE = 0.01


@dataclass
class SizeModel:
    """File bytes = overhead + bytes_per_param x parameters(widths)."""

    params: ParamModel
    encoding: str
    overhead_bytes: float
    bytes_per_param: float
    fit: dict[str, Any]  # the two files it was read from
    grid: dict[str, list[int]]
    quantity: str = "size"

    def predict(self, widths: dict[str, int]) -> float:
        """The predicted file size in MB (10^6 bytes)."""
        return (self.overhead_bytes + self.bytes_per_param * self.params.params(widths)) / 1e6

    def paying(self, group: str) -> list[int]:
        return sorted(self.grid.get(group, []), reverse=True)  # every narrower width is smaller

    def unpaid(self, group: str) -> str | None:
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"encoding": self.encoding, "bytes_per_param": round(self.bytes_per_param, 4),
                "overhead_bytes": round(self.overhead_bytes), "params_full": self.params.params({}),
                "fit": self.fit}


def size_model(run: PreparedRun, ctx: PassContext, params: ParamModel, *, encoding_name: str,
               encoding: list[PassStep], grid: dict[str, list[int]], progress: Progress) -> SizeModel:
    """Two files through the encoding (no device): the base and every group at its narrowest width."""
    narrow = {g: min(ws) for g, ws in grid.items()}
    progress(f"size model for {encoding_name}: the base and the narrowest widths, built through the encoding")
    base = build_point(run, ctx, encoding, f"size-{encoding_name}-base", {})
    small = build_point(run, ctx, encoding, f"size-{encoding_name}-narrowest", narrow)
    p0, p1 = params.params({}), params.params(narrow)
    s0, s1 = float(base.size_bytes), float(small.size_bytes)
    bpp = (s0 - s1) / (p0 - p1) if p0 != p1 else s0 / max(p0, 1)
    return SizeModel(params=params, encoding=encoding_name, overhead_bytes=s0 - bpp * p0, bytes_per_param=bpp,
                     grid=grid,
                     fit={"base": {"params": p0, "bytes": int(s0)},
                          "narrowest": {"widths": narrow, "params": p1, "bytes": int(s1)}})


@dataclass
class MemoryTable:
    encoding: str
    base_mb: float
    points: dict[str, dict[int, float]] = field(default_factory=dict)  # group -> width -> peak MB
    quantity: str = "memory"

    def min_saving(self) -> float:
        return max(MEMORY_NOISE_MB, MEMORY_NOISE_SHARE * self.base_mb)

    def pays(self, group: str, width: int) -> bool:
        p = self.points.get(group, {}).get(width)
        return p is not None and self.base_mb - p > self.min_saving()

    def paying(self, group: str) -> list[int]:
        return [w for w in sorted(self.points.get(group, {}), reverse=True) if self.pays(group, w)]

    def unpaid(self, group: str) -> str | None:
        if not self.points.get(group) or self.paying(group):
            return None
        return (f"no width of {group} saves more than {self.min_saving():.3g} MB of peak memory on the device (base "
                f"{self.base_mb:.4g} MB; "
                + ", ".join(f"{w}: {p:.4g} MB" for w, p in sorted(self.points[group].items()))
                + ")")

    def predict(self, widths: dict[str, int]) -> float:
        """The predicted peak MB: the base less each group's measured saving (savings add up, noise left out)."""
        out = self.base_mb
        for g, w in widths.items():
            if self.pays(g, w):
                out -= self.base_mb - self.points[g][w]
        return max(out, 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {"encoding": self.encoding, "base_peak_mb": round(self.base_mb, 3),
                "min_saving_mb": round(self.min_saving(), 3),
                "points": {g: {str(w): round(p, 3) for w, p in sorted(ws.items())} for g, ws in self.points.items()}}


def measure_memory_table(session: DeviceSession, run: PreparedRun, ctx: PassContext, *, encoding_name: str,
                         encoding: list[PassStep], grid: dict[str, list[int]], settings: RunSettings,
                         progress: Progress) -> MemoryTable:
    """The base and every grid point, each measured in its own agent run (no eval pass) for its peak memory."""
    short = settings.but(with_eval=False, measure=settings.measure.model_copy(
        update={"runs": min(settings.measure.runs, 20), "min_seconds": 0.0}))

    def peak(name: str, widths: dict[str, int]) -> float:
        m = session.measure(name, build_point(run, ctx, encoding, name, widths), short)
        if isinstance(m, MeasureFailure) or m.result.peak_memory_mb is None:
            raise DeviceError(f"the memory table's point {name} has no peak memory from the device: "
                              f"{getattr(m, 'message', 'the agent reported none')}")
        return float(m.result.peak_memory_mb)

    progress(f"memory table for {encoding_name}: the base and {sum(map(len, grid.values()))} pruned points, each "
             "in its own run on the device")
    t = MemoryTable(encoding=encoding_name, base_mb=peak(f"mem-{encoding_name}-base", {}))
    for g, ws in grid.items():
        for w in ws:
            progress(f"memory table for {encoding_name}: {g} at {w} channels")
            t.points.setdefault(g, {})[w] = peak(f"mem-{encoding_name}-{g}-{w}", {g: w})
    return t
