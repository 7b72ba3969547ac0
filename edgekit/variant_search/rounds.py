"""The search's last word on speed: the leader and each close finalist timed in alternating rounds.

The finals measure every finalist once, one after another, minutes apart; on a shared host the load moves
between those minutes, so their p50s compare the host's moments as much as the files (four deploys of the
digits demo in a row shipped tflite-fp32, tflite-dynamic, tflite-dynamic and tflite-int8, issue #43). Here the
leader by the finals' p50 and every finalist close to it (p50 within ``CLOSE``, or tied by the CIs) take turns in
ONE agent process (``DeviceSession.measure_ab``: A B, B A, A B ...; the release gate's A/B), and the paired
per-round ratio with its bootstrap 95% CI (``report/release.py: judge_ab``) decides, by the project's one tie
rule (``report/decision.py``: ``speed_tied``, ``settle_tie``): a finalist proved faster than the leader leads
instead (the rounds run again against it), one tied with it competes on file size, the smaller file ships.
A pair the agent cannot time together (a page agent has no A/B; an interface it cannot feed), or one reached after
the search's time budget is spent, is judged by the finals' separate runs, and its reason says so."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..agent.protocol import AgentRunFailed
from ..artifact import Artifact
from ..devices.session import DeviceSession, RunSettings
from ..errors import DeviceError
from ..report.decision import TIE_TOLERANCE, SpeedRatio, p50_ratio, settle_tie
from ..report.model import VariantResult
from ..report.release import judge_ab

# block pairs per comparison: the median of 12 per-round ratios, with a bootstrap CI over rounds (the LM release
# A/B uses 8 pairs of whole agent runs; these rounds are blocks of one process, so more of them cost little:
# a tenth of the target's min_seconds each, 0.1 s on `local`, or 500 runs of a tiny model)
ROUNDS = 12
# a finalist whose finals p50 is within this of the leader's (1.5x) is timed against it in rounds, and screening's
# racing drops nothing closer (state.py race_margin): separate short runs minutes apart on a shared host read the
# digits demo's tflite-int8 31% slower than tflite-dynamic, where alternating rounds read them 0.6-3.7% apart
CLOSE = 0.5
MAX_LEADS = 3  # the leader may change this many times at most (each time a finalist is proved faster)


@dataclass
class RoundsVerdict:
    """What the rounds decided: the variant to ship, the leader it was compared with, each compared
    finalist's ratio against that leader, why each other finalist lost, and a sentence for the answer."""

    ship: VariantResult
    leader: VariantResult
    ratios: dict[str, SpeedRatio] = field(default_factory=dict)
    lost: dict[str, str] = field(default_factory=dict)
    note: str = ""


def _kb(v: VariantResult) -> str:
    return f"{v.size_bytes / 1024:.0f} KB"


def paired_ratio(session: DeviceSession, leader: VariantResult, other: VariantResult,
                 arts: dict[str, Artifact], settings: RunSettings, rounds: int = ROUNDS) -> SpeedRatio | None:
    """``other`` against ``leader`` in ``rounds`` alternating rounds in one agent process; when the agent
    cannot time the pair together, the finals' separate runs (``how`` says which); None when neither timed."""
    try:
        blocks = session.measure_ab(arts[leader.name], arts[other.name], settings, rounds)
    except DeviceError as exc:  # the pair's own failure (the agent's, or a run that died on a device that answers)
        if not isinstance(exc, AgentRunFailed) and not session.responsive():
            raise
        r = p50_ratio(leader, other)
        if r is None:
            return None
        return SpeedRatio(r.leader, r.other, r.ratio, r.ci95, f"separate runs (rounds failed: {exc.message[:120]})")
    j = judge_ab(blocks)
    return SpeedRatio(leader.name, other.name, j.ratio, j.ci95, f"{len(blocks.a)} alternating rounds")


def _close(leader: VariantResult, v: VariantResult) -> bool:
    r = p50_ratio(leader, v)
    return r is not None and (r.tied or r.ratio <= 1.0 + CLOSE)


def decide_in_rounds(session: DeviceSession, qualified: list[VariantResult], arts: dict[str, Artifact],
                     settings: RunSettings, progress: Callable[[str], None] | None = None,
                     rounds: int = ROUNDS) -> RoundsVerdict | None:
    """The finalist to ship among ``qualified`` (those that pass the gate) by p50, decided in alternating rounds
    (module doc). None when no finalist has a latency."""
    say = progress or (lambda _m: None)
    timed = [v for v in qualified if v.latency_ms is not None]
    if not timed:
        return None
    paired = getattr(session.transport, "kind", None) != "browser"  # the page agent has no A/B
    leader = min(timed, key=lambda v: (v.latency_ms.p50 if v.latency_ms else 0.0, v.name))
    ratios: dict[str, SpeedRatio] = {}
    for attempt in range(MAX_LEADS):
        close = [v for v in timed if v is not leader and _close(leader, v)]
        for v in close:
            spent = session.clock is not None and session.clock.remaining() <= 0  # the search's time budget
            if paired and not spent:
                say(f"finals: {v.name} against the leader {leader.name} in {rounds} alternating rounds")
                r = paired_ratio(session, leader, v, arts, settings, rounds)
            else:
                r = p50_ratio(leader, v)
                why = "the time budget was spent" if paired else "this agent has no A/B"
                r = r and SpeedRatio(r.leader, r.other, r.ratio, r.ci95, f"separate runs ({why})")
            if r is not None:
                ratios[v.name] = r
        faster = [v for v in close if v.name in ratios and ratios[v.name].faster]
        if not faster or attempt == MAX_LEADS - 1:
            break
        new = min(faster, key=lambda v: (ratios[v.name].ratio, v.name))
        say(f"finals: {new.name} is faster than {leader.name} in alternating rounds "
            f"({ratios[new.name].describe()}): it leads, and the close finalists are timed against it")
        leader, ratios = new, {}
    ties = [leader, *(v for v in timed if v.name in ratios and ratios[v.name].tied)]
    ship = settle_tie(ties)
    verdict = RoundsVerdict(ship=ship, leader=leader, ratios=ratios)
    band = f"inside the {TIE_TOLERANCE:.0%} tie band"
    for v in timed:
        if v is ship:
            continue
        r = ratios.get(v.name)
        if v is leader:  # the fastest by a hair, tied with the smaller file that ships
            rs = ratios[ship.name]
            verdict.lost[v.name] = (f"tied on speed with {ship.name} ({ship.name} against it: {rs.describe()}, "
                                    f"{band}) and larger ({_kb(v)} vs {_kb(ship)}): the smaller file wins")
        elif r is not None and r.tied:
            verdict.lost[v.name] = (f"tied on speed with {leader.name} ({r.describe()}, {band}) and larger than "
                                    f"{ship.name} ({_kb(v)} vs {_kb(ship)}): the smaller file wins")
        elif r is not None:
            verdict.lost[v.name] = f"slower than {leader.name}: {r.describe()}, beyond the {TIE_TOLERANCE:.0%} tie band"
        else:
            s = p50_ratio(leader, v)
            verdict.lost[v.name] = (f"slower than {leader.name}: p50 {s.ratio:.2f}x its in the finals' separate runs, "
                                    f"more than {CLOSE:.0%} apart, so not timed in rounds" if s is not None
                                    else f"not timed against {leader.name}")
    if ship is not leader:
        rs = ratios[ship.name]
        verdict.note = (f"tied on speed with the fastest finalist, {leader.name} ({rs.describe()}, {band}), "
                        f"and the smaller file ({_kb(ship)} vs {_kb(leader)})")
    elif ratios:
        verdict.note = "the fastest finalist against " + ", ".join(
            f"{n} ({r.describe()})" for n, r in sorted(ratios.items()))
    return verdict
