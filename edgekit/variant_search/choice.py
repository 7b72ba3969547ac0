"""The search's candidate table and its choice, shared by the search (run.py) and runtime tuning
(tuning.py), which both import this module and neither imports the other for it.

A :class:`Candidate` is one row of the table (built, dropped at a stage with its reason, finalist,
selected). :func:`choose` picks among the finalists that pass the gate by the objective: among those
tied with the best on speed the smallest file wins (the project's one tie rule,
``report/decision.py``: ``speed_tied`` and ``settle_tie``), so a re-measurement does not flip the choice
on noise. The search's finals then time the close finalists against the leader in alternating rounds
(``rounds.py``) and decide by the same rule on the paired ratio. :func:`keep_release_choice` keeps the variant the
release (``--baseline``) shipped while it is within the release's latency tolerance of the fastest, so a
re-deploy does not churn between near-tied files. :func:`reasons` says why a candidate failed the gate.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..artifact import Artifact
from ..inputs.recipe import VariantSpec
from ..report.decision import objective_cost, objective_tied, settle_tie
from ..report.model import Check, VariantResult

Objective = Literal["p50", "p99", "energy", "size"]
BASE = "fp32"  # the baseline every candidate is judged against


@dataclass
class Candidate:
    spec: VariantSpec
    status: str = "pending"  # built | dropped | finalist | selected
    stage: str | None = None
    reason: str | None = None
    artifact: Artifact | None = None
    host_accuracy: float | None = None
    screening: dict[str, Any] = field(default_factory=dict)
    build_seconds: float | None = None
    joined: str | None = None  # why it joined a short search it was not in from the start

    @property
    def name(self) -> str:
        return self.spec.name

    def drop(self, stage: str, reason: str) -> None:
        self.status, self.stage, self.reason = "dropped", stage, reason

    def summary(self) -> dict[str, Any]:
        a = self.artifact
        return {"name": self.spec.name, "passes": [p.model_dump() for p in self.spec.passes], "status": self.status,
                "dropped_at": self.stage if self.status == "dropped" else None, "reason": self.reason,
                "format": a.format.value if a else None, "precision": a.precision if a else None,
                "size_bytes": a.size_bytes if a else None, "host_accuracy": self.host_accuracy,
                "build_seconds": self.build_seconds, "screening": self.screening or None,
                **({"joined": self.joined} if self.joined else {})}


_WHY = {"accuracy_drop": "outside the metric tolerance", "peak_memory_budget": "peak memory over the budget",
        "latency_p50_budget": "over the p50 latency budget", "latency_p90_budget": "over the p90 latency budget",
        "model_size_budget": "over the model size budget", "min_speedup": "below the minimum speed-up"}


def reasons(failed: Iterable[Check]) -> str:
    """The failed gate checks in words, one clause each."""
    return "; ".join(f"{_WHY.get(f.name, f.name)}: {f.message}" for f in failed)


def choose(finalists: list[VariantResult], objective: Objective) -> VariantResult | None:
    scored = [(v, objective_cost(v, objective)) for v in finalists]
    scored = [(v, s) for v, s in scored if s is not None]
    if not scored:
        return None
    best, best_s = min(scored, key=lambda p: (p[1], p[0].name))
    if objective not in ("p50", "p99"):
        return best
    # tied with the best on speed (the one tie rule on the p50s' 95% CIs, as for p99 before: a tail has no
    # CI here): the smallest file wins, at the runtime's default options when tuned rows tie
    ties = [v for v, _ in scored if v is best or objective_tied(best, v, objective)]
    return settle_tie(ties)


def keep_release_choice(chosen: VariantResult, qualified: list[VariantResult], released: str | None,
                        objective: Objective, tolerance: float) -> tuple[VariantResult, dict[str, Any] | None]:
    """The release's shipped variant (``released``; a tuned ``name@t2`` counts as ``name``) instead of
    ``chosen`` when it qualifies and its objective is within ``tolerance`` (the release's
    --max-latency-regression) of the fastest qualified variant: near-tied files (a ~25 us model's INT8
    and fp32) would otherwise flip between releases on noise, and every flip fails the release's size
    check against a file the user did not change. Latency objectives only. Returns the variant to
    ship and, when the release's choice was kept over a faster one, what was kept and why (for the
    report); ``None`` when nothing changed."""
    if released is None or objective not in ("p50", "p99"):
        return chosen, None
    base = released.split("@")[0]
    scored = {v.name: s for v in qualified if (s := objective_cost(v, objective)) is not None}  # None: unmeasured
    kept = next((v for v in qualified if v.name == base and v.name in scored), None)
    if kept is None or kept.name == chosen.name:
        return chosen, None
    fastest = min((v for v in qualified if v.name in scored), key=lambda v: (scored[v.name], v.name))
    ratio = scored[kept.name] / scored[fastest.name] if scored[fastest.name] > 0 else float("inf")
    if ratio > 1 + tolerance:
        return chosen, None
    return kept, {"variant": kept.name, "released": released, "instead_of": chosen.name, "fastest": fastest.name,
                  "objective": objective, "ratio_to_fastest": round(ratio, 4), "tolerance": tolerance}
