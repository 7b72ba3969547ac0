"""The answer a deploy owes its user: which of the measured variants to ship, and why each of the
others lost. Every variant is judged alone by the same checks as the gate (the baseline too: it
must meet the budgets); among those that pass, the fastest on the device by p50 wins, and a
variant tied with the fastest on speed (:func:`speed_tied`) is settled by the smaller file
(:func:`settle_tie`). A variant that is not proved faster than the baseline says so: "ship int8
(tied with fp32 on speed, 3.0x smaller)" is an honest answer, "int8 is faster" would not be.

The tie rule here is the project's only one: deploy's decision, the search's choice and its paired
finals (``variant_search/choice.py``, ``variant_search/rounds.py``), runtime tuning and the
language-model race (``llm/judge.py``) all call it. Two files are tied when the 95% CI of their time
ratio reaches into ``1 +- TIE_TOLERANCE``: the paired per-round ratio of an alternating-rounds run
where there is one, else the ratio of two separate measurements' CI ends (which contains 1 exactly
when the two CIs overlap, the rule these modules each had before). So is the objective they rank by
(:func:`objective_cost`: a fixed graph's p50/p99/size/energy and a generator's decode/TTFT/prefill, lower is
better) and the one speed comparison (:func:`speed_ratio`, :func:`objective_tied`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ..inputs.recipe import GateConfig
from ..measure.stats import BUSY_OTHER_CPU
from .gate import evaluate_gate
from .model import Decision, LatencyMs, VariantResult


def _lat(v: VariantResult) -> LatencyMs:
    """The latency of a variant the decision compares (decide() keeps only measured ones)."""
    if v.latency_ms is None:
        raise ValueError(f"variant {v.name}: latency was not measured, so it cannot be compared")
    return v.latency_ms


# A speed difference inside this band is never "proved", so it cannot outweigh a smaller file: a file must
# take at least 5% less time (at its CI's bound) to beat a smaller one. Measured on this project's 2-core host
# (issue #43): the paired round ratio of the digits demo's tflite-int8 and tflite-dynamic read 1.037 quiet and
# 1.006 beside a busy loop, and every other pair of its finalists moved by at most 3.6% between the two: a pair
# that close stays a tie busy or quiet (a narrower band would have split this one by the host's load).
TIE_TOLERANCE = 0.05


@dataclass(frozen=True)
class SpeedRatio:
    """How long ``other`` takes against ``leader`` (> 1: slower), the 95% CI of that ratio, and how it was
    measured (``"alternating rounds"``: paired rounds in one session; ``"separate runs"``)."""

    leader: str
    other: str
    ratio: float
    ci95: tuple[float, float]
    how: str

    @property
    def tied(self) -> bool:
        return speed_tied(self.ci95)

    @property
    def slower(self) -> bool:
        """``other`` proved slower than ``leader`` (beyond the tie band)."""
        return not self.tied and self.ratio > 1.0

    @property
    def faster(self) -> bool:
        """``other`` proved faster than ``leader`` (beyond the tie band)."""
        return not self.tied and self.ratio < 1.0

    def describe(self) -> str:
        lo, hi = self.ci95
        return f"time ratio {self.ratio:.3f}, 95% CI {lo:.3f}-{hi:.3f}, {self.how}"


def speed_tied(ci95: Sequence[float], tolerance: float = TIE_TOLERANCE) -> bool:
    """THE tie rule: the 95% CI of a time ratio reaches into ``[1/(1+tolerance), 1+tolerance]``, so the
    device did not prove one file faster than the other by more than the tolerance."""
    lo, hi = float(ci95[0]), float(ci95[1])
    return lo <= 1.0 + tolerance and hi >= 1.0 / (1.0 + tolerance)


def separate_runs_ratio(
    leader: str,
    leader_value: float,
    leader_ci: Sequence[float],
    other: str,
    other_value: float,
    other_ci: Sequence[float],
    *,
    higher_is_better: bool = False,
) -> SpeedRatio:
    """The time ratio of two separate measurements, each a point value with its 95% CI (times, or rates
    such as tokens/s with ``higher_is_better``): the CI is the ratio of the intervals' far ends, which
    contains 1 exactly when the two CIs overlap (conservative; nothing pairs the two runs)."""
    (l_lo, l_hi), (o_lo, o_hi) = (float(x) for x in leader_ci), (float(x) for x in other_ci)
    if higher_is_better:  # time = 1 / rate: the ratio of times is leader's rate over other's
        ratio = leader_value / other_value if other_value > 0 else float("inf")
        ci = (l_lo / o_hi if o_hi > 0 else 0.0, l_hi / o_lo if o_lo > 0 else float("inf"))
    else:
        ratio = other_value / leader_value if leader_value > 0 else float("inf")
        ci = (o_lo / l_hi if l_hi > 0 else 0.0, o_hi / l_lo if l_lo > 0 else float("inf"))
    return SpeedRatio(leader, other, ratio, ci, "separate runs")


def p50_ratio(leader: VariantResult, other: VariantResult) -> SpeedRatio | None:
    """:func:`separate_runs_ratio` of two variants' p50s (None when either was not timed)."""
    if leader.latency_ms is None or other.latency_ms is None:
        return None
    la, lo = leader.latency_ms, other.latency_ms
    return separate_runs_ratio(leader.name, la.p50, la.ci95, other.name, lo.p50, lo.ci95)


def objective_cost(v: VariantResult, objective: str) -> float | None:
    """THE objective: what ``v`` costs by ``objective``, lower is better, for every kind of model (None: not
    measured). A fixed graph: its p50 or p99 latency (ms), its energy (mJ an inference), its file size (bytes).
    A generator: its time a decoded token (``decode``, ms: 1000 / tokens/s), its time to the first token
    (``ttft``, ms), its time a prefilled token at the longest prompt measured (``prefill``, ms)."""
    if objective == "size":
        return float(v.size_bytes)
    if objective == "energy":
        return v.energy_mj_per_inference
    if objective in ("p50", "p99"):
        if v.latency_ms is None:
            return None
        return v.latency_ms.p50 if objective == "p50" else v.latency_ms.p99
    if objective not in ("decode", "ttft", "prefill"):
        raise ValueError(f"unknown objective {objective!r}")
    g = v.generation
    if g is None:
        return None
    if objective == "ttft":
        return g.ttft_ms
    rate = (
        g.decode_tokens_per_s
        if objective == "decode"
        else (float(g.prefill[-1]["tokens_per_s"]) if g.prefill else None)
    )
    return 1000.0 / rate if rate else None


def speed_ratio(leader: VariantResult, other: VariantResult, objective: str) -> SpeedRatio | None:
    """The one comparison of two separately measured variants' speed by ``objective``, with its CI: the p50s'
    (``p50``, and ``p99``, whose tail has no CI here) or the decode tokens/s' (``decode``); None for an objective
    without a CI (size, energy, TTFT, prefill) or a variant not timed."""
    if objective in ("p50", "p99"):
        return p50_ratio(leader, other)
    if objective != "decode" or leader.generation is None or other.generation is None:
        return None
    lg, og = leader.generation, other.generation
    if not (lg.decode_tokens_per_s_ci95 and og.decode_tokens_per_s_ci95):
        return None
    return separate_runs_ratio(
        leader.name,
        lg.decode_tokens_per_s or 0.0,
        lg.decode_tokens_per_s_ci95,
        other.name,
        og.decode_tokens_per_s or 0.0,
        og.decode_tokens_per_s_ci95,
        higher_is_better=True,
    )


def objective_tied(leader: VariantResult, other: VariantResult, objective: str) -> bool:
    """Tied on speed by ``objective`` (:func:`speed_ratio` inside the tie band); an objective without a CI
    never ties."""
    r = speed_ratio(leader, other, objective)
    return r is not None and r.tied


class _Sized(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def size_bytes(self) -> int: ...


S = TypeVar("S", bound=_Sized)


def settle_tie(tied: Sequence[S]) -> S:
    """THE tie settlement: the smaller file, then a variant at its runtime's default options (a tuned row,
    ``name@t2``, names its options), then the name: the same answer every time the same files tie."""
    return min(tied, key=lambda v: (v.size_bytes, "@" in v.name, v.name))


def _overlap(a: VariantResult, b: VariantResult) -> bool:
    """Tied on p50 by :func:`speed_tied` (separate runs); an unmeasured latency ties with nothing."""
    r = p50_ratio(a, b)
    return r is not None and r.tied


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
    ratios = {v.name: p50_ratio(fastest, v) for v in ok}
    ties = [v for v in ok if v is fastest or _overlap(fastest, v)]
    ship = settle_tie(ties)
    for v in ok:
        if v is ship:
            continue
        r = ratios[v.name]
        if v in ties:
            lost[v.name] = (
                f"tied with {ship.name} on speed (p50 {_lat(v).p50:.4g} vs {_lat(ship).p50:.4g} ms, 95% CIs "
                f"overlap within the {TIE_TOLERANCE:.0%} tie band"
                + (f": {r.describe()} against {fastest.name}" if r is not None and v is not fastest else "")
                + f") and larger ({v.size_bytes / 1024:.0f} vs {ship.size_bytes / 1024:.0f} KB)"
            )
        else:
            lost[v.name] = (
                f"slower than {fastest.name} on the device: p50 {_lat(v).p50:.4g} vs "
                f"{_lat(fastest).p50:.4g} ms (95% CIs separated" + (f": {r.describe()}" if r is not None else "") + ")"
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
