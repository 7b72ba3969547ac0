"""What a search hands back: the report's search section, the report itself, the decision in deploy's words and
the warning when the time budget cut candidates, all read from the search's state (``state.SearchState``)."""

from __future__ import annotations

from ..agent.host import HostThreads
from ..devices.session import DeviceSession
from ..orchestration.assemble import assemble_report
from ..orchestration.ship import write_nothing_shipped, write_ship
from ..orchestration.steps import recorded_settings
from ..report.decision import ship_decision
from ..report.model import (
    Decision,
    Report,
    Screening,
    SearchCandidate,
    SearchSection,
    ShippedFile,
    Timeline,
    VariantResult,
)
from ..report.profile_diff import profile_diffs
from ..report.write import write_report
from ..timeline import Clock
from .budget import settle_frontier
from .choice import BASE, Candidate
from .rounds import RoundsVerdict
from .state import SearchState


def search_section(st: SearchState) -> SearchSection:
    """The report's search section: the mode, the objective, what ships, where the time went, and every
    candidate's row (the baseline's first, then each built or dropped one, then the skipped)."""
    run, chosen, base_screen = st.run, st.chosen, st.base_screen
    ship = (write_ship(run.out_dir, chosen, st.final[chosen.name].artifact, run.source.artifact.io)
            if chosen is not None else None)
    timeline = st.clock.to_dict()
    base = SearchCandidate(name=BASE, status="selected" if chosen and chosen.name == BASE else "baseline",
                           format=run.fp32.format.value, precision="fp32", size_bytes=run.fp32.size_bytes,
                           screening=Screening(p50=base_screen.latency_ms.p50, ci95=base_screen.latency_ms.ci95)
                           if base_screen is not None and base_screen.latency_ms is not None else None)
    return SearchSection(
        mode="quick" if st.sopts.quick else "full", objective=st.sopts.objective,
        selected=chosen.name if chosen else None, shipped=ShippedFile(**ship) if ship else None,
        seconds=timeline["wall_s"], time_budget_s=st.sopts.time_budget_s, kept_release_choice=st.kept,
        timeline=Timeline(**timeline), host=st.ht.to_dict(),
        candidates=[base, *(SearchCandidate(**c.summary()) for c in st.cands),
                    *(SearchCandidate(name=n, status="skipped", reason=r) for n, r in st.skipped)])


def search_report(st: SearchState, session: DeviceSession) -> Report:
    run, final, chosen, cands = st.run, st.final, st.chosen, st.cands
    assert st.screen_settings is not None and st.final_settings is not None
    section = search_section(st)
    if st.budget is not None:  # the budget as a goal: its table, plan, students and frontier (budget.py)
        settle_frontier(st.budget, cands, chosen.name if chosen is not None else None)
        section.budget = st.budget.record
    ordered = {BASE: final[BASE], **{n: final[n] for n in sorted(final) if n != BASE}}
    builds = round(sum(c.build_seconds or 0.0 for c in cands), 3)
    warnings = list(st.opts.extra_warnings) + budget_warnings(cands, st.clock, st.ht)
    report = assemble_report(run, ordered, session, baseline=BASE, warnings=warnings,
                             judged=[chosen.name] if chosen else None, gate=st.nogate, search=section,
                             release=st.release,
                             settings={"screening": st.screen_settings.measure.model_dump(),
                                       **recorded_settings(run, st.final_settings, builds)})
    report.profile_diffs = profile_diffs(report.variants, BASE)
    report.decision = search_decision(report, cands, chosen, st.rounds)
    if chosen is None:
        write_nothing_shipped(run.out_dir, "fixed-graph", report.decision.reason)
    write_report(report, run.out_dir)
    return report


def budget_warnings(cands: list[Candidate], clock: Clock, ht: HostThreads) -> list[str]:
    """When the budget cut candidates, say which and why, in one sentence (the console shows it)."""
    cut = [c for c in cands if c.status == "dropped" and c.stage == "build" and c.reason
           and c.reason.startswith(("time budget exhausted before", "cut by the time budget"))]
    if not cut:
        return []
    prep = clock.seconds("preparation")
    busy = f" on a busy host ({ht.describe()})" if ht.busy() else f" ({ht.describe()})"
    return [f"{len(cut)} candidate{'s' if len(cut) != 1 else ''} not built or cut by the time budget "
            f"({', '.join(c.name for c in cut)}): preparation took {prep:.0f} s and builds "
            f"{clock.seconds('build'):.0f} s of the {clock.budget_s:g} s budget{busy}; --time-budget raises it"]


def search_decision(report: Report, cands: list[Candidate], chosen: VariantResult | None,
                    rounds: RoundsVerdict | None = None) -> Decision:
    """The search's answer in deploy's words: what ships and why, and why every other candidate lost."""
    objective = report.search.objective if report.search is not None else None
    lost = {c.name: (f"dropped at {c.stage}: {c.reason}" if c.status == "dropped"
                     else c.reason or f"a finalist, not the best by {objective}")
            for c in cands if chosen is None or c.name not in (chosen.name, chosen.name.split("@")[0])
            and not ("@" in c.name and c.status != "dropped")}  # tuning rows that ran: the one line below
    others = [v for v in report.variants if "@" in v.name or (chosen is not None and "@" in chosen.name
                                                               and v.name == chosen.name.split("@")[0])]
    others = [v for v in others if chosen is None or v.name != chosen.name]
    if others:  # one line for the runtime settings the shipped file was measured under
        lost["other runtime settings"] = (f"not the best by {objective}: " + ", ".join(
            f"{v.name} p50 {v.latency_ms.p50:.4g} ms" if v.latency_ms else f"{v.name} not measured" for v in others))
    if chosen is None:
        return Decision(ship=None, reason="no variant passes the gate (the fp32 baseline included)", lost=lost)
    decision = ship_decision(report.variant(chosen.name), report.variant(BASE), lost)
    if rounds is not None and rounds.note and chosen.name.split("@")[0] == rounds.ship.name:
        decision.reason += f"; {rounds.note}"  # what the finals' alternating rounds decided
    kept = report.search.kept_release_choice if report.search is not None else None
    if kept:  # what the baseline's sentence says (nothing faster passes) is not so: say why it ships instead
        why = (f"the release's choice, kept: {kept['ratio_to_fastest']:.3g}x the {kept['objective']} of the fastest "
               f"finalist ({kept['fastest']}), within the release's {kept['tolerance']:.0%} latency tolerance")
        decision.reason = (f"{chosen.name} (the baseline): {why}" if chosen.name.split("@")[0] == BASE
                           else f"{decision.reason}; {why}")
    return decision
