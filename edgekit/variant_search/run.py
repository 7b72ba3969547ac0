"""`edgekit deploy --search` / `edgekit.search(...)`: for this model on this device, ship THIS file.

Stages, cheapest first:
 1. build every candidate the target can run (a failed build drops that candidate, with its error)
    while BUILD_SHARE of the time budget is left; every candidate built is measured below, so the
    budget is spent on builds that count;
 2. host filter: accuracy on the eval set with the same runtime on the host (the agent's own code,
    run in-process); a candidate whose host drop exceeds the tolerance by more than ``host_slack``
    points is dropped before it costs device time;
 3. screening on the device: a short measurement of every survivor (latency, memory, accuracy);
    candidates outside the tolerance or the memory budget are dropped, and so are those whose latency
    is clearly slower than the best (racing: CIs separated);
 4. finals: the full measurement (the target's settings) of the survivors and the fp32 baseline;
 5. selection by the objective (p50 by default). By p50, the leader and every finalist close to it
    are timed again in alternating rounds in this session (``rounds.py``), and the paired per-round
    ratio's 95% CI decides: a file tied with the leader (the one tie rule, ``report/decision.py``)
    competes on size, the smallest file wins, so a busy host and a quiet one give the same answer.
The chosen file is written to ``out/ship/`` with its lineage; the report lists every candidate.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from ..agent.host import HostThreads, host_compute, host_threads
from ..agent.inprocess import load_agent
from ..agent.protocol import build_request, load_outputs
from ..artifact import Artifact
from ..devices.profile import profile_variants, profiled_names
from ..devices.session import DeviceSession, Measured, MeasureFailure, RunSettings
from ..errors import BadInputError, EdgekitError
from ..formats import RUNTIME_FOR_FORMAT
from ..inputs.data import eval_bundle, fixed_shape_misfit
from ..inputs.recipe import Recipe
from ..inputs.targets import MeasureDefaults, TargetSpec
from ..metrics import MetricSpec
from ..orchestration.assemble import score
from ..orchestration.options import DeployOptions, refused_by_search
from ..orchestration.prepare import PreparedRun, prepare_run, target_spec
from ..orchestration.release import release_judgement
from ..orchestration.steps import run_settings
from ..passes.base import PassContext
from ..passes.registry import get_pass
from ..report.diff import shipped_name
from ..report.gate import evaluate_gate
from ..report.model import (
    Check,
    Gate,
    Report,
    VariantResult,
)
from ..timeline import BudgetExceeded, Clock
from ..transport.base import Transport
from .budget import BudgetGoal, budget_goal, extend_for_budget, no_training_data_note
from .candidates import calibrated, candidate_variants
from .choice import BASE, Candidate, choose, keep_release_choice, reasons
from .outcome import search_report
from .racing import clearly_slower, race_entry
from .rounds import RoundsVerdict, decide_in_rounds
from .state import SearchOptions, SearchState
from .tuning import tune_runtime

BUILD_SHARE = 0.8  # of the time budget: the rest is left to measure what was built


def search(model: Any, *, eval_data: str | Path, calib_data: str | Path | None = None,
           target: str | TargetSpec = "local", device: str | None = None, out: str | Path = "edgekit-out",
           max_accuracy_drop: float | None = None, options: SearchOptions | None = None,
           deploy_options: DeployOptions | None = None, example_inputs: tuple[Any, ...] | None = None,
           arch: str | None = None,
           x_key: str | tuple[str, ...] = "x", y_key: str = "y", transport: Transport | None = None,
           progress: Callable[[str], None] | None = None, baseline_report: str | Path | None = None,
           metric: str | MetricSpec | None = None, eval_samples: int | None = None) -> Report:
    """Build, screen, race and measure every candidate; ship the best inside the gate.

    ``deploy_options`` carries every deploy option (gate, budgets, measurement, lock, cache,
    baseline report); the keyword arguments ``max_accuracy_drop``, ``baseline_report``, ``metric``
    (a name or MetricSpec) and ``eval_samples`` are shorthands for the same fields."""
    sopts = options or SearchOptions()
    opts, recipe = _options(deploy_options, sopts, max_accuracy_drop, baseline_report, metric, eval_samples)
    progress = progress or (lambda _m: None)
    spec = target_spec(target)
    clock = Clock(budget_s=sopts.time_budget_s)  # the wall clock from here: preparation counts
    with contextlib.ExitStack() as stack:
        with clock.span("preparation", "host threads"):  # sizing them, and torch's import
            ht = host_threads(opts.host_threads)
            stack.enter_context(host_compute(ht))
        progress(f"{ht.describe()}; time budget {sopts.time_budget_s:g} s")
        with clock.span("preparation"):
            run = prepare_run(model, eval_data=eval_data, target=spec, recipe=recipe, opts=opts,
                              calib_data=calib_data, out=out, example_inputs=example_inputs, arch=arch, x_key=x_key,
                              y_key=y_key, progress=progress)
        return _search(SearchState(run=run, sopts=sopts, opts=opts, clock=clock, ht=ht, progress=progress),
                       device, transport)


def _search(st: SearchState, device: str | None, transport: Transport | None) -> Report:
    run, sopts, opts, clock, ht, progress = st.run, st.sopts, st.opts, st.clock, st.ht, st.progress
    spec = run.target
    run.started = clock.started
    if sopts.measure is not None:
        run.measure = sopts.measure
    specs, skipped = (sopts.candidates, []) if sopts.candidates is not None else \
        candidate_variants(spec, has_calib=run.calib_ds is not None, quick=sopts.quick)
    cands = st.cands = [Candidate(s) for s in specs]
    st.budget = budget_goal(run, opts)  # a budget as a goal: its bad inputs fail here, before any build
    if opts.teacher is not None and st.budget is None:
        raise BadInputError("--teacher teaches the distilled student of a budget search (a latency, memory or size "
                            "budget with --train-data and --arch), and this search has none",
                            hint="add a budget, --train-data and --arch, or use the teacher in a recipe's distill step")
    _build(run, cands, clock, ht, progress)
    with clock.span("host_filter"):
        _host_filter(run, cands, sopts, progress)
    if sopts.quick and sopts.candidates is None:
        skipped = _float_fallback(run, spec, cands, skipped, sopts, clock, ht, progress)
    st.skipped = skipped
    final_settings = st.final_settings = run_settings(run, opts)
    st.screen_settings = _screening(final_settings, sopts)
    with DeviceSession(spec, device, source_io=run.source.artifact.io, plan=run.plan, transport=transport,
                       lock_wait=opts.lock_wait, lock_timeout=opts.lock_timeout, remeasure=opts.remeasure,
                       progress=progress, clock=clock) as session:
        with clock.span("delivery"):
            for c in [c for c in cands if c.status == "built"]:  # nothing sent that the device cannot run
                if c.artifact is not None and (why := session.lacking_runtime(c.artifact)) is not None:
                    c.drop("delivery", why)
            session.use_eval(run.eval_ds, run.art_dir)
            session.deliver([run.fp32, *(art for _, art in _built(cands))])
        with clock.span("screening"):
            goal = st.budget is not None
            st.base_screen = _screen(session, run, cands, st.screen_settings, sopts, progress,
                                     _SCREENED_WITH_GOAL if goal else _SCREENED, race=not goal)
        with clock.span("finals"):
            final = st.final = _finals(session, run, cands, final_settings, progress)
            if st.budget is not None:  # nothing meets the budget: prune to it (budget.py)
                extend_for_budget(st.budget, st, session, final, final_settings)
            chosen, st.nogate, st.kept, st.rounds = _select(run, final, st.cands, sopts, session, final_settings,
                                                            progress, st.budget)
        chosen_settings = final_settings
        if chosen is not None and sopts.tune_runtime and sopts.objective in ("p50", "p99"):
            with clock.span("tuning"):
                chosen, chosen_settings = tune_runtime(session, run, final, cands, chosen, final_settings, opts,
                                                       clock.deadline, progress, sopts.objective)
        st.chosen = chosen
        if chosen is not None and run.previous is not None:
            with clock.span("release"):
                st.release = release_judgement(session, run, final, [chosen.name], chosen_settings, opts, progress,
                                               shipped=chosen.name)
        with clock.span("profile"):
            profile_variants(session, final, profiled_names(final, BASE, opts.profile,
                                                            [chosen.name] if chosen else [], slower=False),
                             final_settings, {chosen.name: chosen_settings} if chosen else None)
    with clock.span("report"):
        return search_report(st, session)


def _options(deploy_options: DeployOptions | None, sopts: SearchOptions, max_accuracy_drop: float | None,
             baseline_report: str | Path | None, metric: str | MetricSpec | None,
             eval_samples: int | None) -> tuple[DeployOptions, Recipe]:
    opts = replace(deploy_options) if deploy_options is not None else DeployOptions()
    if max_accuracy_drop is not None:
        opts.max_accuracy_drop = max_accuracy_drop
    if baseline_report is not None:
        opts.baseline_report = baseline_report
    if eval_samples is not None:
        opts.eval_samples = eval_samples
    opts.remeasure = opts.remeasure or sopts.remeasure
    refused_by_search(opts)
    recipe = Recipe(baseline=BASE)
    if metric is not None:
        ms = MetricSpec(name=metric) if isinstance(metric, str) else metric
        recipe = Recipe(baseline=BASE, metric=ms)
    return opts, recipe


def parity_failure(art: Artifact) -> str | None:
    """The gate's parity check for the artifact's hops, as the gate words it (``parity[hop]: ...``), or None."""
    bad = [f"parity[{s.name}]: {'; '.join(s.metrics['parity_violations'])}" for s in art.lineage
           if s.kind == "convert" and s.metrics.get("parity_violations")]
    return bad[0] if bad else None


def _build(run: PreparedRun, cands: list[Candidate], clock: Clock, ht: HostThreads,
           progress: Callable[[str], None]) -> None:
    """Every candidate's passes (through the pass cache), inside the first BUILD_SHARE of the time
    budget: a build is not started after it, and a running one is stopped there (the long passes check
    the deadline between trials and epochs) and dropped with its time. A failed build drops only that
    candidate."""
    # train data (--train-data) reaches the accuracy-aware candidate's QAT rung (ort-int8-mixed)
    ctx = PassContext(workdir=run.art_dir, calib=run.calib_ds, eval=run.eval_ds, train=run.train_ds,
                      source=run.source, metric_plan=run.plan)
    deadline = clock.share_deadline(BUILD_SHARE)
    todo = [c for c in cands]
    for i, c in enumerate(todo):
        if time.perf_counter() > deadline:
            c.drop("build", f"time budget exhausted before this candidate was built (builds run in the first "
                            f"{BUILD_SHARE:.0%} of the {clock.budget_s:g} s budget; preparation took "
                            f"{clock.seconds('preparation'):.0f} s, builds {clock.seconds('build'):.0f} s; "
                            f"{ht.describe()}); --time-budget raises it")
            continue
        progress(f"building candidate {c.name} ({i + 1} of {len(todo)}; {max(0.0, clock.remaining()):.0f} s of the "
                 "budget left)")
        started = time.perf_counter()
        with clock.span("build", c.name), clock.deadline_scope(deadline, f"the build of {c.name}"):
            try:
                art = run.fp32
                for k, step in enumerate(c.spec.passes):
                    p, stem = get_pass(step.name), f"{c.name}-{k}-{step.name}"
                    art = run.cache.run(p, art, step.config, ctx, stem) if run.cache else \
                        p(art, step.config, ctx, out_name=stem)
                c.artifact, c.status = art, "built"
                if misfit := fixed_shape_misfit(art, run.eval_ds, run.source.artifact.io):  # eval data at several shapes
                    c.drop("build", misfit)
                elif run.gate.check_parity and (bad := parity_failure(art)):
                    # known on the host now: it must not race (and knock out a file that ships) and then
                    # fail the gate's parity check in the finals (seen on PP-OCRv4's recognizer)
                    c.drop("build", f"{bad}: the gate's parity check would fail it")
            except BudgetExceeded as exc:
                c.drop("build", f"cut by the time budget: {exc.message}; {ht.describe()}")
            except EdgekitError as exc:
                c.drop("build", f"build failed: {exc.message}")
        c.build_seconds = round(time.perf_counter() - started, 3)


def _host_accuracy(agent: ModuleType, run: PreparedRun, art: Artifact,
                   eval_file: Path | list[dict[str, Path]]) -> float | None:
    """The metric with the candidate's runtime on this host, through the agent's own code."""
    if RUNTIME_FOR_FORMAT.get(art.format) not in agent.runners.RUNNERS:
        return None
    out = run.art_dir / f".host-{art.sha256[:12]}.npz"
    req = build_request(variant="host", artifact=art, model_remote=[str(f) for f in art.files],  # with companions
                        source_io=run.source.artifact.io,
                        measure=MeasureDefaults(warmup=0, runs=1, min_seconds=0.0),
                        eval_remote=str(eval_file) if isinstance(eval_file, Path) else
                        [{k: str(f) for k, f in sh.items()} for sh in eval_file],
                        x_keys=run.eval_ds.x_keys, outputs_remote=str(out), stream=run.eval_ds.stream,
                        eval_buckets=run.eval_ds.shards_per_bucket)
    try:
        agent.measure.measure(req.wire())
        return run.plan.score(load_outputs(out)).value
    except agent.AgentFailure as exc:
        if exc.kind == "runtime_missing":
            return None
        raise
    finally:
        out.unlink(missing_ok=True)


def _host_filter(run: PreparedRun, cands: list[Candidate], sopts: SearchOptions,
                 progress: Callable[[str], None]) -> None:
    """Drop candidates whose accuracy with the same runtime on this host is already far outside."""
    if not sopts.host_filter:
        return
    agent = load_agent()
    eval_file = eval_bundle(run.eval_ds, run.art_dir)
    base = _host_accuracy(agent, run, run.fp32, eval_file)
    if base is None:
        return
    metric = run.plan.metric
    tol = run.gate.max_accuracy_drop * (abs(base) / 100.0 if run.gate.relative_accuracy_drop else 1.0)
    for c, art in _built(cands):
        progress(f"host {metric.label()} of {c.name}")
        try:
            c.host_accuracy = _host_accuracy(agent, run, art, eval_file)
        except Exception as exc:  # a candidate that cannot run on the host is measured on the device
            c.reason = f"host check skipped: {str(exc)[:200]}"
            continue
        if c.host_accuracy is not None and metric.worse_by(base, c.host_accuracy) > tol + sopts.host_slack:
            c.drop("host", f"host {metric.label()} {c.host_accuracy:.4g} vs fp32 {base:.4g}: worse by "
                           f"{metric.worse_by(base, c.host_accuracy):.4g} > tolerance {tol:g} (+{sopts.host_slack:g} slack)")


def _built(cands: list[Candidate]) -> list[tuple[Candidate, Artifact]]:
    """The built candidates, each with its artifact."""
    return [(c, c.artifact) for c in cands if c.status == "built" and c.artifact is not None]


def full_int8_kept(cands: list[Candidate]) -> bool:
    """Whether a full-INT8 candidate (calibrated activations) is still in the search after the host check: a
    dynamic-range one keeping the accuracy does not spare the float fallback (it is no faster than fp32 on x86)."""
    return any(c.status == "built" and c.artifact is not None and c.artifact.precision == "int8"
               and calibrated(c.name) for c in cands)


def _float_fallback(run: PreparedRun, spec: TargetSpec, cands: list[Candidate], skipped: list[tuple[str, str]],
                    sopts: SearchOptions, clock: Clock, ht: HostThreads,
                    progress: Callable[[str], None]) -> list[tuple[str, str]]:
    """When no full-INT8 candidate of the short search kept the accuracy on the host, its float fallbacks
    (``candidate_variants(fallback=True)``: OpenVINO at the CPU's default precision) are built, checked and raced too, so a
    model INT8 cannot serve does not ship a slower float file than the one that needs no calibration.
    Returns the skipped list without them."""
    int8_kept = full_int8_kept(cands)
    have = {c.name for c in cands}
    more = [] if int8_kept else [Candidate(v) for v in candidate_variants(
        spec, has_calib=run.calib_ds is not None, fallback=True)[0] if v.name not in have]
    if not more:
        return skipped
    tried = [c.name for c in cands if "int8" in c.name]
    why = (f"no full-INT8 candidate kept the accuracy on the host (tried: {', '.join(tried) or 'none'}): the short "
           "search's float fallback")
    progress(f"{why}: adding {', '.join(c.name for c in more)}")
    for c in more:
        c.joined = why
    _build(run, more, clock, ht, progress)
    with clock.span("host_filter"):
        _host_filter(run, more, sopts, progress)
    cands += more
    joined = {c.name for c in more}
    return [s for s in skipped if s[0] not in joined]


def _screening(final: RunSettings, sopts: SearchOptions) -> RunSettings:
    """A short measurement: few runs, no minimum time, no sustained run (that is for the finals)."""
    m = final.measure
    runs = min(sopts.screening_runs, m.runs)
    return final.but(measure=MeasureDefaults(**{**m.model_dump(), "runs": runs, "min_seconds": 0.0, "max_runs": runs}),
                     options=replace(final.options, sustained_seconds=None), benchmark_binary=None)


# what screening drops on (latency is left to racing and the finals: a short run's timing is noisy)
_SCREENED = {"accuracy_drop", "peak_memory_budget", "model_size_budget"}
# a budget as a goal (budget.py) does not screen, nor race: a file over it (an INT8 file over a size budget) is the
# encoding the search prunes from, and a slower file may be the most accurate inside it, so both reach the finals;
# the selection ships only files that meet it
_SCREENED_WITH_GOAL = {"accuracy_drop"}


def _failed_checks(run: PreparedRun, base: Measured, cand: Measured, names: set[str] | None,
                   representative: bool) -> list[Check]:
    """The gate's failed checks for ``cand`` against ``base`` (the same checks deploy's gate makes)."""
    score({BASE: base, cand.name: cand}, run.plan, BASE, run.gate, stats=run.gate.strict_stats)
    g = evaluate_gate([base.result, cand.result], BASE, run.gate, judged=[cand.name],
                      latency_representative=representative)
    return [c for c in g.checks if not c.passed and (names is None or c.name in names)]


def _screen(session: DeviceSession, run: PreparedRun, cands: list[Candidate], settings: RunSettings,
            sopts: SearchOptions, progress: Callable[[str], None], screened: set[str] = _SCREENED,
            race: bool = True) -> VariantResult:
    """Short measurement of the baseline and every survivor (every built one: past the time budget
    too); drops on the ``screened`` checks (accuracy, memory, size), racing (``race``)."""
    progress("screening the fp32 baseline on the device")
    base = session.measure(BASE, run.fp32, settings)
    if isinstance(base, MeasureFailure):
        raise base.error()
    latency = race and sopts.objective in ("p50", "p99")
    # a racer must be able to ship: fp32 over the size or memory budget never knocks a candidate out
    base_can_ship = not [c for c in evaluate_gate([base.result], BASE, run.gate, judged=[BASE]).checks
                         if not c.passed and c.name in screened]
    entries = [race_entry(BASE, _raw(base.result))] if latency and base_can_ship else []
    for c, art in _built(cands):
        progress(f"screening {c.name} on the device ({settings.measure.runs} runs)")
        r = session.measure_or_drop(c.name, art, settings)  # a candidate that kills the agent is its own fault
        if isinstance(r, MeasureFailure):
            c.drop("screening", f"failed on the device ({r.kind}): {r.message}")
            continue
        v = r.result
        failed = _failed_checks(run, base, r, screened, session.emulation is None)
        c.screening = {"p50": v.latency_ms.p50 if v.latency_ms else None,
                       "ci95": v.latency_ms.ci95 if v.latency_ms else None,
                       "accuracy": v.accuracy.value if v.accuracy else None, "accuracy_drop": v.accuracy_drop,
                       "peak_memory_mb": v.peak_memory_mb, "energy_mj_per_inference": v.energy_mj_per_inference}
        if failed:
            c.drop("screening", reasons(failed))
            continue
        if latency:
            entries.append(race_entry(c.name, _raw(v)))
    for name, why in clearly_slower(entries, sopts.race_margin).items():
        if name != BASE:  # the baseline is measured in the finals anyway: it is the reference
            next(c for c in cands if c.name == name).drop("racing", why)
    return base.result


def _raw(v: VariantResult) -> list[float]:
    """The run's timings (none when it has no latency)."""
    return (v.latency_ms.raw or []) if v.latency_ms is not None else []


def _finals(session: DeviceSession, run: PreparedRun, cands: list[Candidate], settings: RunSettings,
            progress: Callable[[str], None]) -> dict[str, Measured]:
    progress("final measurement of the fp32 baseline")
    base = session.measure(BASE, run.fp32, settings)
    if isinstance(base, MeasureFailure):
        raise base.error()
    final = {BASE: base}
    for c, art in _built(cands):
        progress(f"final measurement of {c.name}")
        r = session.measure_or_drop(c.name, art, settings)
        if isinstance(r, MeasureFailure):
            c.drop("finals", f"failed on the device ({r.kind}): {r.message}")
            continue
        final[c.name] = r
        c.status = "finalist"
    return final


# (the variant to ship, the failed gate when none qualified, the release's choice kept, the rounds' verdict)
Selection = tuple[VariantResult | None, Gate | None, dict[str, Any] | None, RoundsVerdict | None]


def _select(run: PreparedRun, final: dict[str, Measured], cands: list[Candidate], sopts: SearchOptions,
            session: DeviceSession, settings: RunSettings, progress: Callable[[str], None],
            goal: BudgetGoal | None = None) -> Selection:
    """The finalists that pass the gate (every check deploy's gate makes), then the best by the
    objective; by p50, the leader and the close finalists are timed again in alternating rounds in this
    session and the paired ratio decides (``rounds.py``). fp32 may ship too: when nothing compressed beats
    it, it is the honest answer."""
    representative = session.emulation is None
    score(final, run.plan, BASE, run.gate)
    base = final[BASE].result
    qualified, why_not, failed_checks = [], {}, []
    for name, m in final.items():
        # fp32's own row once (judged by name, it and the base it is would be checked twice, and said twice)
        pair = [m.result] if m.result is base else [base, m.result]
        g = evaluate_gate(pair, BASE, run.gate, judged=[name], latency_representative=representative)
        failed = [c for c in g.checks if not c.passed]
        if not failed and goal is not None and not goal.meets(m.result):  # judged on the p50's CI upper bound
            why_not[name] = goal.over(m.result)
            if name != BASE:
                next(c for c in cands if c.name == name).drop("finals", why_not[name])
            continue
        if not failed:
            qualified.append(m.result)
            continue
        why_not[name] = reasons(failed)
        failed_checks += [c for c in failed if c not in failed_checks]
        if name != BASE:
            next(c for c in cands if c.name == name).drop("finals", why_not[name])
    if sopts.objective == "energy" and qualified and all(v.energy_mj_per_inference is None for v in qualified):
        raise BadInputError(f"the energy objective needs an energy reading, and this device has none "
                            f"({qualified[0].energy_reason})", hint="use --objective p50, or add an energy source")
    verdict = (decide_in_rounds(session, qualified, {n: m.artifact for n, m in final.items()}, settings, progress)
               if sopts.objective == "p50" and goal is None else None)
    chosen = goal.choose(qualified) if goal is not None else \
        (verdict.ship if verdict is not None else choose(qualified, sopts.objective))
    kept = None
    for c in cands:  # why each finalist lost the rounds (the answer's ``lost``)
        if verdict is not None and c.name in verdict.lost:
            c.reason = verdict.lost[c.name]
    if chosen is not None and run.previous is not None:  # a release's choice stays while it is near the fastest
        chosen, kept = keep_release_choice(chosen, qualified, shipped_name(run.previous), sopts.objective,
                                           run.gate.max_latency_regression or 0.0)
    if kept:
        other = next((c for c in cands if c.name == kept["instead_of"]), None)
        if other is not None:
            other.reason = (f"the release's choice {kept['variant']} ships instead: its {kept['objective']} is "
                            f"{kept['ratio_to_fastest']:.3g}x the fastest finalist's ({kept['fastest']}), within the "
                            f"release's latency tolerance ({kept['tolerance']:.0%}), so a re-deploy does not churn "
                            "between near-tied files")
    if chosen is not None:
        chosen.selected = True
        for c in cands:
            if c.name == chosen.name:
                c.status = "selected"
        return chosen, None, kept, verdict
    msg = f"no candidate stays inside the {run.plan.metric.label()} tolerance and the budgets (fp32 included)"
    msg += "".join(f"; {n}: {w}" for n, w in why_not.items())
    msg += f"; {goal.closest([m.result for m in final.values()])}" if goal is not None else \
        no_training_data_note(run, why_not)
    # the checks each finalist failed come with it: CI's test view names the budget that was missed
    return None, Gate(passed=False, checks=[Check(name="search", passed=False, limit=run.gate.max_accuracy_drop,
                                                  message=msg), *failed_checks]), None, None


__all__ = ["SearchOptions", "search"]
