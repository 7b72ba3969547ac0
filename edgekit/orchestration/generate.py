"""A language model's run: the generation workload through the same device stage, report and ship writer as a
fixed graph. Source -> KV-cache exports, each proven against PyTorch, built in the order of what can win inside
the time budget (``llm/race.py``) -> the generation workload and the eval text's scoring in the run's one device
session -> quality from the device's own log-probabilities -> the gate and the decision (``llm/judge.py``), the
release checks -> the report (``assemble.new_report``) -> the fastest file inside the gate shipped to
``OUT/ship/`` with its tokenizer (``ship.write_file_set``).

``edgekit.deploy(model, eval_text=...)`` and ``edgekit deploy MODEL_DIR --eval-text FILE`` come here through
:func:`deploy_generator`; ``deploy_lm`` takes every setting in its ``LMOptions``. Every bad input is exit 2
before any build (``prepare.prepare_generation``: the one preparation's generator steps); a variant that cannot be
built, is out of parity or fails on the device is dropped with its reason; a failed run never replaces an earlier
report."""

from __future__ import annotations

import dataclasses
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..agent.host import host_compute, host_threads
from ..artifact import Artifact
from ..devices.session import DeviceSession, MeasureFailure, RunSettings
from ..errors import BadInputError, ConversionError, EdgekitError
from ..formats import format_spec
from ..inputs.run_options import RunOptions
from ..inputs.targets import MeasureDefaults, TargetSpec
from ..llm import build_times, efficiency
from ..llm.build_cache import cached, hit_note, source_key
from ..llm.candidates import BASELINE, CANDIDATES, SHORT, LMCandidate, candidates_for
from ..llm.int4_ladder import Calibration
from ..llm.judge import judge
from ..llm.memory import kv_bytes_per_token
from ..llm.options import LMOptions, measure_settings
from ..llm.parity import cache_parity
from ..llm.predict import Weights
from ..llm.race import DEFAULT_BUDGET_S, SEARCH_BUDGET_S, TUNING, Probe, Race, record_measured
from ..llm.release import PREFIX as RELEASE_PREFIX
from ..llm.release import LastRelease, compared_with, load_last_release, release_checks
from ..llm.ship import lm_contract
from ..llm.threads import file_of, not_competing, settings_to_try, tuned_name
from ..llm.workload import GenerationWorkload
from ..report.model import Decision, Gate, Report, SearchCandidate, SearchSection, ShippedFile, VariantResult
from ..report.release import LatencyJudgement, judge_ab
from ..report.write import write_report
from ..timeline import BudgetExceeded, Clock
from ..transport.base import Transport
from .assemble import new_report
from .prepare import PreparedGeneration as Prepared
from .prepare import prepare_generation, target_spec
from .ship import write_file_set, write_nothing_shipped

Progress = Callable[[str], None]


def build(
    p: Prepared,
    chosen: list[LMCandidate],
    progress: Progress,
    cal: Calibration,
    *,
    clock: Clock | None = None,
    probe: Probe | None = None,
    device: tuple[dict[str, Any], int] | None = None,
    named: frozenset[str] = frozenset(),
) -> tuple[dict[str, Artifact], dict[str, str]]:
    """Each candidate exported and proven (``parity.cache_parity`` on an eval window); a failure drops it.
    An int4 candidate also checks itself with ``cal`` and climbs its recovery ladder (``int4_ladder``).
    ``race.py`` orders the rows (what can win first), measures the likeliest leader with ``probe`` before a slow
    lowering, and names each row it does not start (it cannot win, or it does not fit ``clock``'s budget); a row
    the user named (``named``: --lm-variants) is built whatever its prediction, inside the budget.
    Every file goes through the build cache (``build_cache``) and carries its predicted decode rate; ``device``
    (the device's probe document and the threads it is measured at) gives the predictions its history from
    the first row."""
    art_dir = p.out_dir / "artifacts"
    art_dir.mkdir(parents=True, exist_ok=True)
    built: dict[str, Artifact] = {}
    dropped: dict[str, str] = {}
    window = [int(v) for v in p.text.windows[0]]
    clock = clock or Clock()
    race = Race(Weights.of(p.src), p.src.parameters, clock, p.spec.name, cal.max_kld, progress, probe, named=named)
    if device is not None:
        race.device, race.threads = efficiency.device_key(p.spec.name, device[0]), device[1]
    predicted: dict[str, dict[str, Any]] = {}
    for c in race.order(chosen):
        why = race.why_not(c, built)
        if why is not None:
            dropped[c.name] = why
            progress(f"{c.name}: {why}")
            continue
        pred = race.predicted(c.name)
        progress(
            f"building {c.name} ({c.runtime}, {c.precision}; predicted decode {pred['decode_tokens_per_s']:g} "
            f"tok/s; {race.describe_budget()})"
        )
        row = source_key(p.src)
        key = None if row is None else {"row": c.name, "source": row, "context": p.settings.context}
        if key is not None and c.calibrated:
            key["calibration"] = cal.key()
        deadline = clock.deadline - TUNING * (len(built) + 1) * race.one_measure_s()
        started = time.perf_counter()
        try:
            with clock.span("build", c.name), clock.deadline_scope(deadline, f"{c.name}'s build"):
                with host_compute(host_threads()):
                    art = cached(key, art_dir, partial(c.build, p.src, art_dir, p.settings.context, built, cal))
                figures = cache_parity(art, p.src.model, window, context=p.settings.context)
        except BudgetExceeded as exc:
            dropped[c.name] = f"not built: out of time budget ({exc.message}), predicted decode " + (
                f"{pred['decode_tokens_per_s']:g} tok/s" + race.against_leader(race.predict(c.name))
            )
            continue
        except (ConversionError, EdgekitError) as exc:
            dropped[c.name] = f"dropped at build: {exc.message}"
            continue
        if hit_note(art) is None:  # built, not restored: this host's build time for the row (build_times.py)
            build_times.record(c.name, time.perf_counter() - started, p.src.parameters)
        predicted[c.name] = pred
        built[c.name] = _with_metrics(art, cache_parity=figures)
    for name in built:  # the files measured after the race: their prediction from the leader, if one was found
        pred = predicted[name] if name in race.probed else race.predicted(name)
        built[name] = _with_metrics(built[name], predicted_decode=pred)
    return built, dropped


def _probe(
    session: DeviceSession, p: Prepared, o: LMOptions, name: str, art: Artifact
) -> tuple[VariantResult, dict[str, Any]] | None:
    """One file measured in the run's session as the race measures it (the same settings: the measurement cache
    gives it back when the race reaches it), for ``race.py``'s leader: (its result, its agent document), None
    when it failed."""
    session.deliver([art])
    res = session.measure(name, art, RunSettings(measure=measure_settings(p.spec, o)))
    return None if isinstance(res, MeasureFailure) else (res.result, res.doc)


def _device(session: DeviceSession, p: Prepared, o: LMOptions) -> tuple[dict[str, Any], int] | None:
    """The device's probe document and the threads the race measures at (None: the device cannot say)."""
    try:
        return session.measurements.probe_doc(), measure_settings(p.spec, o).threads
    except EdgekitError:
        return None


def _with_metrics(art: Artifact, **metrics: Any) -> Artifact:
    last = art.lineage[-1]
    return art.model_copy(
        update={"lineage": (*art.lineage[:-1], last.model_copy(update={"metrics": {**last.metrics, **metrics}}))}
    )


def open_session(
    p: Prepared, o: LMOptions, device: str | None, transport: Transport | None, progress: Progress
) -> DeviceSession:
    """The run's one device session (the race, the thread settings and the release A/B all measure in it)."""
    return DeviceSession(
        p.spec,
        device,
        source_io=None,
        plan=None,
        transport=transport,
        lock_wait=o.lock_wait,
        lock_timeout=o.lock_timeout,
        remeasure=o.remeasure,
        progress=progress,
    )


def use_generation(session: DeviceSession, p: Prepared, o: LMOptions) -> None:
    """Deliver the eval text's scoring files and make the session measure the generation workload."""
    tmp = p.out_dir / "artifacts"
    tmp.mkdir(parents=True, exist_ok=True)
    np.save(tmp / "windows.npy", p.text.windows)
    np.save(tmp / "top_ids.npy", p.ref.top_ids)
    np.save(tmp / "top_offsets.npy", p.ref.offsets)
    scored = [tmp / "windows.npy", tmp / "top_ids.npy", tmp / "top_offsets.npy"]
    remotes = session.deliver_files(scored, kind="eval")
    session.use_workload(
        GenerationWorkload(
            settings=p.settings,
            windows=p.text.windows,
            ref=p.ref,
            kv_bytes_per_token=kv_bytes_per_token(p.src),
            scoring=(remotes[scored[0]], remotes[scored[1]], remotes[scored[2]]),
            greedy=p.text.prompts,
            energy_sources=tuple(p.spec.energy_sources),
            sustained_seconds=o.sustained_seconds,
        )
    )


def measure(
    session: DeviceSession, p: Prepared, built: dict[str, Artifact], o: LMOptions, progress: Progress
) -> tuple[list[VariantResult], dict[str, str], dict[str, Any], str | None]:
    """Each file's generation workload and scoring on the device, in the run's session; the files of a runtime
    named in ``o.runtime_options`` run with those options (a release's file keeps its own). Then, unless
    ``--threads`` fixed them, each runtime's best file at the other thread counts (``threads.py``). Returns the
    results, the failures, the first result document and why the threads were capped (None: not)."""
    m = measure_settings(p.spec, o)
    results: list[VariantResult] = []
    dropped: dict[str, str] = {}
    first_doc: dict[str, Any] = {}
    session.deliver(built.values())

    def one(name: str, art: Artifact, mm: MeasureDefaults) -> None:
        nonlocal first_doc
        progress(
            f"measuring {name} on the device (prefill at {p.settings.prompt_lengths()} tokens, "
            f"{mm.runs}+ decode steps at {mm.threads} thread(s), {p.text.windows.shape[0]} scored windows)"
        )
        own = None if name.startswith(RELEASE_PREFIX) else o.runtime_options.get(str(format_spec(art.format).runtime))
        res = session.measure(name, art, RunSettings(measure=mm, runtime_options=own))
        if isinstance(res, MeasureFailure):
            dropped[name] = f"failed on the device ({res.kind}): {res.message}" + (f"; {res.hint}" if res.hint else "")
            return
        first_doc = first_doc or res.doc
        results.append(res.result)

    for name, art in built.items():
        one(name, art, m)
    capped: str | None = None
    if o.threads is None:
        ours = [v for v in results if not v.name.startswith(RELEASE_PREFIX)]
        rows, capped = settings_to_try(ours, o.gate, o.objective, first_doc, p.spec)
        for name, t in rows:
            one(tuned_name(name, t), built[name], m.model_copy(update={"threads": t}))
    if first_doc:  # each quiet file's effective bandwidth: the next run's predictions (llm/efficiency.py)
        record_measured(results, first_doc, p.spec.name, Weights.of(p.src))
    return results, dropped, first_doc, capped


def _release_ab(
    session: DeviceSession,
    p: Prepared,
    o: LMOptions,
    built: dict[str, Artifact],
    shipped: VariantResult,
    last: LastRelease,
    progress: Progress,
) -> tuple[LatencyJudgement | None, str | None]:
    """The release gate's decode A/B in the run's session (the session's A/B, ``DeviceSession.measure_ab``, which
    the generation workload runs as alternating decode-only turns; judged by ``report/release.py: judge_ab`` as
    for fixed graphs): (its judgement, or why it could not run). Each side runs with its own settings: the last
    release at the threads and runtime options its report recorded, this release at its shipped row's."""
    m = measure_settings(p.spec, o)
    art = built[file_of(shipped.name)]
    new = RunSettings(
        measure=m.model_copy(update={"threads": shipped.runtime.threads or m.threads}),
        runtime_options=o.runtime_options.get(str(format_spec(art.format).runtime)),
    )
    # its options: pinned on its artifact by load_last_release
    old = RunSettings(measure=m.model_copy(update={"threads": last.variant.runtime.threads or m.threads}))
    context = int((last.report.settings.get("generate") or {}).get("context") or p.settings.context)
    if isinstance(session.workload, GenerationWorkload):
        session.workload.contexts[last.artifact.sha256] = context

    def say(msg: str) -> None:
        progress(f"release {msg}, {last.name} against {shipped.name}")

    try:
        blocks = session.measure_ab(last.artifact, art, old, o.release.rounds, settings_b=new, progress=say)
        return judge_ab(blocks), None
    except EdgekitError as exc:
        return None, str(exc)


def _judge(
    measured: list[VariantResult],
    failed: dict[str, str],
    dropped: dict[str, str],
    o: LMOptions,
    last: LastRelease | None,
) -> tuple[Gate, Decision, list[VariantResult], VariantResult | None, str]:
    """The gate and the decision over this run's files (the last release's file, measured beside them, is set
    apart for the release checks): (gate, decision, this run's results, the last release's row, the baseline).
    ``dropped`` takes the device's failures of this run's files."""
    results = [v for v in measured if not v.name.startswith(RELEASE_PREFIX)]
    again = next((v for v in measured if last is not None and v.name == last.name), None)
    dropped.update({k: v for k, v in failed.items() if not k.startswith(RELEASE_PREFIX)})
    baseline = BASELINE if any(v.name == BASELINE for v in results) else (results[0].name if results else BASELINE)
    ties = not_competing(results, o.objective)  # thread settings not clearly faster than the measured threads
    gate, decision = judge(
        [v for v in results if v.name not in ties], baseline, o.gate, o.objective, {**dropped, **ties}
    )
    return gate, decision, results, again, baseline


def deploy_lm(
    model: str | Path,
    *,
    eval_text: str | Path,
    target: str | TargetSpec = "local",
    device: str | None = None,
    out: str | Path = "edgekit-out",
    options: LMOptions | None = None,
    transport: Transport | None = None,
    progress: Progress | None = None,
) -> Report:
    """Build, prove, measure and judge a language model's variants in one device session; write the report and
    ``ship/``."""
    o, progress, t0 = options or LMOptions(), progress or (lambda _m: None), time.perf_counter()
    spec = target_spec(target)
    last = load_last_release(o.baseline) if o.baseline is not None else None  # exit 2 before any build
    p = prepare_generation(model, eval_text, spec, out, o, progress)
    chosen, skipped = rows_to_build(spec, o)
    clock = Clock(budget_s=o.time_budget_s or (SEARCH_BUDGET_S if o.search else DEFAULT_BUDGET_S), started=t0)
    cal = Calibration(windows=p.text.windows, max_kld=o.gate.max_kld, head=o.head)
    with open_session(p, o, device, transport, progress) as session:
        use_generation(session, p, o)
        probe: Probe = partial(_probe, session, p, o)
        built, dropped = build(p, chosen, progress, cal, clock=clock, probe=probe, device=_device(session, p, o),
                               named=frozenset(o.candidates or ()))
        if not built:
            raise BadInputError("no variant could be built: " + "; ".join(f"{k}: {v}" for k, v in dropped.items()))
        to_measure = {**built, **({last.name: last.artifact} if last else {})}
        measured, failed, first_doc, capped = measure(session, p, to_measure, o, progress)
        gate, decision, results, again, baseline = _judge(measured, failed, dropped, o, last)
        shipped = next((v for v in results if v.name == decision.ship), None)
        ab, ab_failure = (None, None)
        if last is not None and shipped is not None and again is not None:
            ab, ab_failure = _release_ab(session, p, o, built, shipped, last, progress)
    if last is not None:
        gate.checks += release_checks(shipped, again, last, p.src.sha256, p.text.describe().get("windows_sha256"),
                                      o.release, failed.get(last.name), ab, ab_failure)
        gate.passed = gate.passed and all(c.passed for c in gate.checks)
    progress("writing the report")
    report = new_report(
        target=spec.name, session=session, first_doc=first_doc, results=results + ([again] if again else []),
        model={**p.src.describe(), "memory": p.plan.describe()}, started=t0,
        settings=run_settings(p, o, results, capped, skipped), baseline=baseline, gate=gate,
        warnings=session.warnings() + ([capped] if capped else []),
        search=search_section(o, decision, built, results, dropped, t0),
    )
    report.decision, report.compared_with = decision, compared_with(last, ab) if last is not None else None
    _ship(report, p, built, decision)
    write_report(report, p.out_dir)
    return report


def rows_to_build(spec: TargetSpec, o: LMOptions) -> tuple[list[LMCandidate], dict[str, str]]:
    """(the rows this run builds, {row: why not} for the others): the target's runtimes that this host can
    build, narrowed to ``o.candidates`` or, without ``--search``, to the short search's rows."""
    chosen, skipped = candidates_for(spec)
    if o.candidates:
        unknown = sorted(set(o.candidates) - {c.name for c in chosen} - set(skipped))
        if unknown:
            raise BadInputError(f"unknown language-model variant(s) {unknown}; known: {[c.name for c in CANDIDATES]}")
        chosen = [c for c in chosen if c.name in o.candidates]
    elif not o.search:
        skipped.update(
            {c.name: "not in the short search (--search races every variant)" for c in chosen if c.name not in SHORT}
        )
        chosen = [c for c in chosen if c.name in SHORT]
    if not chosen:
        raise BadInputError(
            f"no language-model runtime to build for target {spec.name}: "
            + "; ".join(f"{k}: {v}" for k, v in skipped.items())
        )
    return chosen, skipped


def run_settings(
    p: Prepared, o: LMOptions, results: list[VariantResult], capped: str | None, skipped: dict[str, str]
) -> dict[str, Any]:
    """What the report's settings record of a language model's run."""
    return {
        "task": "text-generation",
        "workload": "generation",
        "eval_text": p.text.describe(),
        "generate": {
            "context": p.settings.context,
            "prompt_lengths": p.settings.prompt_lengths(),
            "decode_tokens_filled": p.settings.decode_tokens,
            "filled_at": p.settings.filled_at,
            "prefill_repeats": p.settings.prefill_repeats,
            "greedy_tokens": p.settings.greedy_tokens,
        },
        "measure": measure_settings(p.spec, o).model_dump(),
        "objective": o.objective,
        "threads_tuned": None
        if o.threads is not None
        else {"rows": [v.name for v in results if "@t" in v.name], "capped": capped},
        "gate": {"max_kld": o.gate.max_kld, "max_perplexity_increase": o.gate.max_perplexity_increase},
        "skipped": skipped,
    }


def search_section(
    o: LMOptions,
    decision: Decision,
    built: dict[str, Artifact],
    results: list[VariantResult],
    dropped: dict[str, str],
    t0: float,
) -> SearchSection:
    """The report's race: each row built, measured or dropped, and why each lost."""
    return SearchSection(
        mode="full" if o.search else "quick",
        objective=o.objective,
        selected=decision.ship,
        seconds=round(time.perf_counter() - t0, 2),
        time_budget_s=o.time_budget_s or (SEARCH_BUDGET_S if o.search else DEFAULT_BUDGET_S),
        candidates=[
            SearchCandidate(
                name=n,
                status="selected" if n == decision.ship else ("dropped" if n in dropped else "measured"),
                reason=decision.lost.get(n),
            )
            for n in dict.fromkeys([*built, *(v.name for v in results), *dropped])
        ],
    )


def _ship(report: Report, p: Prepared, built: dict[str, Artifact], decision: Decision) -> None:
    """The shipped file with its tokenizer (the one ship writer), or the word that nothing shipped."""
    if decision.ship is None:
        write_nothing_shipped(p.out_dir, "text-generation", decision.reason)
        return
    v, art = report.variant(decision.ship), built[file_of(decision.ship)]
    written = write_file_set(p.out_dir, v, art, lm_contract(v, art, p.src, p.settings), companions=p.src.files)
    assert report.search is not None  # the language model's report always carries its race
    report.search.shipped = ShippedFile(**written)


# deploy's overrides that a language model takes: DeployOptions field -> LMOptions field (every RunOptions field,
# which both extend, and the last release's report, which LMOptions calls ``baseline``)
SHARED = {**{f.name: f.name for f in dataclasses.fields(RunOptions)}, "baseline_report": "baseline"}


def lm_options(given: Any, overrides: dict[str, Any], fixed_only: dict[str, Any]) -> Any:
    """The language model's options: ``given`` (an LMOptions or None) with deploy's shared overrides applied;
    a fixed-graph-only argument or override is exit 2, named."""
    refused = [k for k, v in fixed_only.items() if v is not None and v is not False]
    refused += [k for k, v in overrides.items() if k not in SHARED and k != "memory_budget_mb" and v is not None]
    if refused:
        raise BadInputError(
            f"a language model does not take {', '.join(sorted(refused))}",
            hint="a language model takes eval_text, deploy's measure and device options (warmup, runs, "
            "min_seconds, threads, remeasure, lock_wait, lock_timeout, sustained_seconds, memory_budget_mb, "
            "baseline_report) and lm_options=edgekit.LMOptions(...) for the rest",
        )
    if given is not None and not isinstance(given, LMOptions):
        raise BadInputError(f"lm_options is a {type(given).__name__}: pass an edgekit.LMOptions")
    o = dataclasses.replace(given) if given is not None else LMOptions()
    upd = {SHARED[k]: v for k, v in overrides.items() if k in SHARED and v is not None}
    if overrides.get("memory_budget_mb") is not None:
        upd["gate"] = o.gate.model_copy(update={"peak_memory_mb": overrides["memory_budget_mb"]})
    return dataclasses.replace(o, **upd)


def deploy_generator(
    model: str | Path,
    *,
    eval_text: str | Path | None,
    target: TargetSpec,
    device: str | None,
    out: str | Path,
    options: Any,
    overrides: dict[str, Any],
    fixed: dict[str, Any],
    search: bool | None,
    transport: Transport | None,
    progress: Callable[[str], None],
) -> Report:
    """A language model's run (:func:`deploy_lm`: the race over its runtimes and precisions) from deploy's entry:
    ``options`` an LMOptions or None, ``overrides`` deploy's keyword overrides, ``fixed`` deploy's fixed-graph-only
    arguments (each refused when given)."""
    options = lm_options(options, overrides, fixed)
    if eval_text is None:
        raise BadInputError(
            f"{model} is a language model: it needs eval_text (a text or .jsonl file)",
            hint="e.g. edgekit.deploy(model, eval_text='eval.txt'): a few thousand tokens like what the app sees",
        )
    if search is not None:
        options = dataclasses.replace(options, search=bool(search))
    return deploy_lm(
        model, eval_text=eval_text, target=target, device=device, out=out, options=options, transport=transport,
        progress=progress,
    )
