"""The answer a deploy owes its user: which of the measured variants to ship, and why each of the
others lost. Every variant is judged alone by the same checks as the gate (the baseline too: it
must meet the budgets); among those that pass, the fastest on the device by p50 wins, and a
variant whose p50 95% CI overlaps the fastest's is a tie, settled by the smaller file. A variant
that is not proved faster than the baseline says so: "ship int8 (tied with fp32 on speed, 3.0x
smaller)" is an honest answer, "int8 is faster" would not be."""

from __future__ import annotations

from ..inputs.recipe import GateConfig
from ..measure.stats import BUSY_OTHER_CPU
from .gate import evaluate_gate
from .model import Decision, LatencyMs, VariantResult


def _lat(v: VariantResult) -> LatencyMs:
    """The latency of a variant the decision compares (decide() keeps only measured ones)."""
    if v.latency_ms is None:
        raise ValueError(f"variant {v.name}: latency was not measured, so it cannot be compared")
    return v.latency_ms


def _overlap(a: VariantResult, b: VariantResult) -> bool:
    """The p50 95% CIs overlap (a tie); an unmeasured latency overlaps nothing."""
    if a.latency_ms is None or b.latency_ms is None:
        return False
    la, lb = a.latency_ms, b.latency_ms
    return la.ci95[0] <= lb.ci95[1] and lb.ci95[0] <= la.ci95[1]


def decide(variants: list[VariantResult], baseline: str, cfg: GateConfig, *, representative: bool = True) -> Decision:
    base = next(v for v in variants if v.name == baseline)
    lost: dict[str, str] = {}
    ok: list[VariantResult] = []
    for v in variants:
        g = evaluate_gate([base, v], baseline, cfg, judged=[v.name], latency_representative=representative)
        failed = [c for c in g.checks if not c.passed]
        if failed:
            lost[v.name] = "fails " + "; ".join(f"{c.name}: {c.message}" for c in failed)
        elif v.latency_ms is None:
            lost[v.name] = "latency was not measured"
        else:
            ok.append(v)
    if not ok:
        return Decision(
            ship=None, reason="no variant passes the gate's checks on its own (the baseline included)", lost=lost
        )
    fastest = min(ok, key=lambda v: (_lat(v).p50, v.name))
    ties = [v for v in ok if _overlap(v, fastest)]
    ship = min(ties, key=lambda v: (v.size_bytes, v.name))
    for v in ok:
        if v is ship:
            continue
        if v in ties:
            lost[v.name] = (
                f"tied with {ship.name} on speed (p50 {_lat(v).p50:.4g} vs {_lat(ship).p50:.4g} ms, "
                f"95% CIs overlap) and larger ({v.size_bytes / 1024:.0f} vs "
                f"{ship.size_bytes / 1024:.0f} KB)"
            )
        else:
            lost[v.name] = (
                f"slower than {fastest.name} on the device: p50 {_lat(v).p50:.4g} vs "
                f"{_lat(fastest).p50:.4g} ms (95% CIs separated)"
            )
    return ship_decision(ship, base, lost)


def ship_decision(ship: VariantResult, base: VariantResult, lost: dict[str, str]) -> Decision:
    """The decision to ship ``ship`` (chosen by deploy's rule above or by the search), in words
    that claim a speed-up only when the device proved it (95% CIs of p50 separated)."""
    s_lat, b_lat = ship.latency_ms, base.latency_ms
    same = ship is base or ship.name == base.name
    faster = not same and s_lat is not None and b_lat is not None and not _overlap(ship, base) and s_lat.p50 < b_lat.p50
    if same:
        reason = f"{ship.name} (the baseline): no compressed variant passes and is faster"
    elif faster and s_lat is not None and b_lat is not None:
        reason = (
            f"{ship.name}: {b_lat.p50 / s_lat.p50:.2f}x faster than {base.name} on the device "
            f"(95% CIs separated), inside the gate"
        )
    elif s_lat is None or b_lat is None:
        reason = (
            f"{ship.name}: inside the gate, not proved faster than {base.name} (latency not measured on "
            f"{ship.name if s_lat is None else base.name}), "
            f"{base.size_bytes / max(ship.size_bytes, 1):.1f}x smaller"
        )
    else:
        reason = (
            f"{ship.name}: inside the gate, not proved faster than {base.name} (p50 {s_lat.p50:.4g} vs "
            f"{b_lat.p50:.4g} ms, CIs overlap), {base.size_bytes / max(ship.size_bytes, 1):.1f}x smaller"
        )
    return Decision(ship=ship.name, reason=reason + busy_note(ship, base), lost=lost, proved_faster=faster)


def busy_note(*variants: VariantResult) -> str:
    """Said next to the figures when the device was busy while they were measured (the agent reads the
    other processes' CPU share during each run): a speed-up measured under contention is not the quiet
    board's."""
    busy = []
    for v in variants:
        share = (v.device_state or {}).get("other_cpu_fraction")
        if isinstance(share, (int, float)) and share > BUSY_OTHER_CPU:
            busy.append(f"{v.name} {share:.0%}")
    if not busy:
        return ""
    return (
        f" (measured on a busy device: other processes used {', '.join(dict.fromkeys(busy))} of its CPU; "
        "figures include that contention)"
    )
