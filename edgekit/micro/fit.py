"""Whether a model fits a microcontroller part: the measured arena against its SRAM, the model's bytes plus the
interpreter's (with the figure's source) against its flash, each with the target's fit margin. A model that does
not fit names by how much and which tensors hold the activations' peak."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import GateFailed
from ..inputs.targets import Microcontroller
from .interpreter import Arena
from .tflite_graph import LiveTensor, Peak

KIB = 1024


@dataclass(frozen=True)
class Fit:
    sram_budget: int  # bytes the arena may take: SRAM * (1 - fit_margin)
    flash_budget: int  # bytes model + interpreter may take: flash * (1 - fit_margin)
    arena: int  # measured (interpreter.smallest_arena)
    flash: int  # the .tflite's bytes + the interpreter's
    model_bytes: int
    interpreter_bytes: int
    interpreter_source: str
    peak: Peak | None
    largest_weights: tuple[LiveTensor, ...] = ()

    @property
    def sram_ok(self) -> bool:
        return self.arena <= self.sram_budget

    @property
    def flash_ok(self) -> bool:
        return self.flash <= self.flash_budget

    @property
    def fits(self) -> bool:
        return self.sram_ok and self.flash_ok

    def sram_message(self) -> str:
        over = self.arena - self.sram_budget
        verdict = (f"fits, {-over} B to spare" if over <= 0 else
                   f"does NOT fit: {over} B ({over / self.sram_budget:.1%}) over")
        peak = f"; the activations peak at {self.peak.describe()}" if self.peak is not None and over > 0 else ""
        return f"arena {self.arena} B vs SRAM budget {self.sram_budget} B (after the fit margin): {verdict}{peak}"

    def flash_message(self) -> str:
        over = self.flash - self.flash_budget
        verdict = (f"fits, {-over} B to spare" if over <= 0 else
                   f"does NOT fit: {over} B ({over / self.flash_budget:.1%}) over")
        return (f"flash {self.flash} B (model {self.model_bytes} B + interpreter {self.interpreter_bytes} B, a "
                f"lower bound) vs budget {self.flash_budget} B: {verdict}")

    def what_must_shrink(self) -> list[str]:
        """Without training data to prune against the arena: what would have to shrink, and by how much."""
        out = []
        if not self.sram_ok and self.peak is not None:
            need = self.arena - self.sram_budget
            share = need / self.peak.bytes if self.peak.bytes else 1.0
            out.append(f"SRAM: the activations live at op {self.peak.op_index} ({self.peak.op}) must shrink by at "
                       f"least {need} B ({share:.0%} of their {self.peak.bytes} B): fewer channels in the layers "
                       f"that write {', '.join(t.name for t in self.peak.tensors[:2])}, or a smaller input (these "
                       "tensors scale with its height x width)")
        if not self.flash_ok:
            need = self.flash - self.flash_budget
            names = ", ".join(t.describe() for t in self.largest_weights[:3])
            out.append(f"flash: the weights must shrink by at least {need} B; the largest are {names}")
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"fits": self.fits, "what_must_shrink": self.what_must_shrink(),
                "sram": {"arena_bytes": self.arena, "budget_bytes": self.sram_budget, "passed": self.sram_ok,
                         "message": self.sram_message()},
                "flash": {"bytes": self.flash, "model_bytes": self.model_bytes,
                          "interpreter_bytes": self.interpreter_bytes, "interpreter_source": self.interpreter_source,
                          "budget_bytes": self.flash_budget, "passed": self.flash_ok,
                          "message": self.flash_message()},
                "peak": None if self.peak is None else {
                    "op_index": self.peak.op_index, "op": self.peak.op, "bytes": self.peak.bytes,
                    "tensors": [{"name": t.name, "shape": list(t.shape), "bytes": t.bytes}
                                for t in self.peak.tensors]}}


def judge_fit(part: Microcontroller, arena: Arena, model_bytes: int, peak: Peak | None,
              largest_weights: tuple[LiveTensor, ...] = ()) -> Fit:
    keep = 1 - part.fit_margin
    interp = int(round(part.interpreter_flash_kb * KIB))
    return Fit(sram_budget=int(part.sram_kb * KIB * keep), flash_budget=int(part.flash_kb * KIB * keep),
               arena=arena.bytes, flash=model_bytes + interp, model_bytes=model_bytes, interpreter_bytes=interp,
               interpreter_source=part.interpreter_flash_source, peak=peak, largest_weights=largest_weights)


def fit_checks(fit: Fit, variant: str) -> list[dict[str, Any]]:
    """The gate's checks of a fit (report.model.Check fields): the arena against SRAM, the flash against flash."""
    return [{"name": "micro_sram_fit", "variant": variant, "value": fit.arena, "limit": fit.sram_budget,
             "passed": fit.sram_ok, "message": fit.sram_message()},
            {"name": "micro_flash_fit", "variant": variant, "value": fit.flash, "limit": fit.flash_budget,
             "passed": fit.flash_ok, "message": fit.flash_message()}]


def require_fit(fit: Fit, part_name: str) -> None:
    """GateFailed (exit 1) naming by how much the model misses the part and which tensors hold the peak."""
    failed = [(c["name"], c["message"]) for c in fit_checks(fit, part_name) if not c["passed"]]
    if failed:
        raise GateFailed(f"the model does not fit {part_name}: " + "; ".join(m for _, m in failed), failed=failed,
                         hint="; ".join(fit.what_must_shrink()) + "; or pick a part with more SRAM/flash")
