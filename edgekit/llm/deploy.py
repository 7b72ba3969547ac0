"""The loop for a language model: source -> KV-cache exports, each proven against PyTorch -> the generation
workload and the eval text's scoring on the device -> quality from the device's own log-probabilities ->
the gate -> the fastest file inside it shipped to ``OUT/ship/`` with its tokenizer.

``deploy_lm`` is what ``edgekit deploy MODEL_DIR --eval-text FILE`` calls (``edgekit.deploy`` hands a model
folder or a .gguf over to it). Every bad input is exit 2 before any build (the source, the eval text, a
context that cannot fit); a variant that cannot be built, is out of parity or fails on the device is
dropped with its reason; a failed run never replaces an earlier report."""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..artifact import Artifact
from ..devices.session import DeviceSession, MeasureFailure, RunSettings
from ..errors import BadInputError, ConversionError, EdgekitError
from ..formats import format_spec
from ..fsutil import ensure_writable_dir
from ..host import host_compute, host_threads
from ..inputs.targets import MeasureDefaults, TargetSpec
from ..orchestration.options import RunOptions
from ..orchestration.prepare import target_spec
from ..orchestration.ship import write_nothing_shipped
from ..report.model import (
    Decision,
    DeviceInfo,
    Gate,
    Report,
    SearchCandidate,
    SearchSection,
    ShippedFile,
    VariantResult,
)
from ..report.release import LatencyJudgement
from ..report.write import write_report
from ..timeline import BudgetExceeded, Clock
from ..transport.base import Transport
from ..version import __version__
from .build_cache import cached, source_key
from .candidates import BASELINE, CANDIDATES, SHORT, LMCandidate, candidates_for
from .int4_ladder import Calibration
from .judge import OBJECTIVES, LMGate, judge
from .layer_plan import HEADS
from .memory import check_fits, kv_bytes_per_token, memory_plan
from .parity import cache_parity
from .predict import Weights
from .quality import COVERAGE, Reference, greedy_reference, reference
from .race import DEFAULT_BUDGET_S, SEARCH_BUDGET_S, TUNING, Probe, Race
from .release import PREFIX as RELEASE_PREFIX
from .release import LastRelease, ReleaseGate, compared_with, load_last_release, release_checks
from .release_ab import Side, decode_ab
from .request import GenerateSettings
from .ship import write_lm_ship
from .source import LMSource, load_lm
from .text import EvalText, load_eval_text
from .threads import file_of, not_competing, settings_to_try, tuned_name
from .workload import GenerationWorkload

Progress = Callable[[str], None]
DEFAULT_CONTEXT = 512  # a model's own context is often 8k+: a phone app's prompt + answer rarely need more
DEFAULT_WINDOW = 128  # tokens a scored window holds


@dataclass
class LMOptions(RunOptions):
    """What ``edgekit deploy`` takes for a language model (defaults documented where they are defined); the
    measurement and device options every kind of model takes alike are :class:`RunOptions`'."""

    context: int | None = None  # default: min(model's, DEFAULT_CONTEXT)
    window: int | None = None  # default: min(context, DEFAULT_WINDOW)
    max_windows: int = 32
    # the float model's tokens a position the device scores for the KLD; None (default): at each position the
    # fewest that hold quality.COVERAGE of its mass (quality.reference); K: that many everywhere (--top-k)
    top_k: int | None = None
    gate: LMGate = field(default_factory=LMGate)
    objective: str = "decode"
    candidates: tuple[str, ...] | None = None  # names from candidates.CANDIDATES; default: the short search's
    search: bool = False  # race every row of candidates.CANDIDATES that runs (default: candidates.SHORT)
    head: str = "int8"  # the output layer in int4 files: float, int8 or int4 (layer_plan.HEADS)
    # {runtime: {option: value}}: the session settings the application runs the files with (onnxruntime:
    # graph_optimization_level, execution_mode...), applied to every file of that runtime
    runtime_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    baseline: str | Path | None = None  # the last release's report.json (release.py): the release gate
    release: ReleaseGate = field(default_factory=ReleaseGate)
    # seconds for the whole run: preparation, builds, the device and the scoring (race.py); None: the default,
    # race.DEFAULT_BUDGET_S (SEARCH_BUDGET_S with --search)
    time_budget_s: float | None = None


def _measure(spec: TargetSpec, o: LMOptions) -> MeasureDefaults:
    return spec.measure.model_copy(update=o.measure_overrides())


@dataclass
class Prepared:
    src: LMSource
    text: EvalText
    spec: TargetSpec
    settings: GenerateSettings
    out_dir: Path
    plan: Any
    ref: Reference


def prepare(
    model: str | Path, eval_text: str | Path, spec: TargetSpec, out: str | Path, o: LMOptions, progress: Progress
) -> Prepared:
    if o.top_k is not None and o.top_k < 1:
        raise BadInputError(f"--top-k {o.top_k}: at least 1 (the float model's tokens a position the device scores)")
    if o.head not in HEADS:
        raise BadInputError(f"--output-layer {o.head!r}: the output layer of an int4 file is one of {', '.join(HEADS)}")
    if o.objective not in OBJECTIVES:
        raise BadInputError(f"--objective {o.objective!r} for a language model: one of {', '.join(OBJECTIVES)}")
    out_dir = ensure_writable_dir(out)
    progress(f"reading {model}")
    src = load_lm(model)
    context = o.context or min(src.context, DEFAULT_CONTEXT)
    if context > src.context:
        raise BadInputError(
            f"--context {context} is beyond the model's {src.context} positions (max_position_embeddings)",
            hint=f"use --context {src.context} or less",
        )
    if context < 16:
        raise BadInputError(f"--context {context}: at least 16 positions")
    plan = memory_plan(src, context, spec.memory_mb)
    check_fits(plan, spec.name)
    window = min(o.window or DEFAULT_WINDOW, context - 1)  # a static-cache file takes at most context-1 at once
    text = load_eval_text(eval_text, src.tokenizer, window=window, max_windows=o.max_windows)
    if int(text.windows.max()) >= src.vocab_size:
        raise BadInputError(
            f"the tokenizer gives token id {int(text.windows.max())} on {eval_text}, past the "
            f"model's vocabulary of {src.vocab_size}"
        )
    progress(f"scoring {text.windows.shape[0]} windows of {text.windows.shape[1]} tokens with the float model")
    ref = reference(src.model, text.windows, o.top_k)
    cover = ref.describe()
    progress(
        f"the KLD scores {cover['scored_ids']} token log-probs ({cover['scoring_bytes'] / 1e6:.1f} MB to move a "
        f"variant): "
        + (
            f"top-{o.top_k} a position"
            if o.top_k is not None
            else f"{cover['top_k_mean']:.0f} a position on average to hold {COVERAGE:.1%} of the float mass"
            + (f", the flattest cut to {ref.capped_at}" if ref.capped_at else "")
        )
    )
    settings = GenerateSettings(context=context)
    ref = Reference(**{**ref.__dict__, "greedy": greedy_reference(src.model, text.prompts, settings.greedy_tokens)})
    return Prepared(src=src, text=text, spec=spec, settings=settings, out_dir=out_dir, plan=plan, ref=ref)


def build(
    p: Prepared,
    chosen: list[LMCandidate],
    progress: Progress,
    cal: Calibration,
    *,
    clock: Clock | None = None,
    probe: Probe | None = None,
) -> tuple[dict[str, Artifact], dict[str, str]]:
    """Each candidate exported and proven (``parity.cache_parity`` on an eval window); a failure drops it.
    An int4 candidate also checks itself with ``cal`` and climbs its recovery ladder (``int4_ladder``).
    ``race.py`` orders the rows (what can win first), measures the likeliest leader with ``probe`` before a slow
    lowering, and names each row it does not start (it cannot win, or it does not fit ``clock``'s budget).
    Every file goes through the build cache (``build_cache``) and carries its predicted decode rate."""
    art_dir = p.out_dir / "artifacts"
    art_dir.mkdir(parents=True, exist_ok=True)
    built: dict[str, Artifact] = {}
    dropped: dict[str, str] = {}
    window = [int(v) for v in p.text.windows[0]]
    clock = clock or Clock()
    race = Race(Weights.of(p.src), p.src.parameters, clock, p.spec.name, cal.max_kld, progress, probe)
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
        predicted[c.name] = pred
        built[c.name] = _with_metrics(art, cache_parity=figures)
    for name in built:  # the files measured after the race: their prediction from the leader, if one was found
        pred = predicted[name] if name in race.probed else race.predicted(name)
        built[name] = _with_metrics(built[name], predicted_decode=pred)
    return built, dropped


def _probe(
    p: Prepared,
    o: LMOptions,
    device: str | None,
    transport: Transport | None,
    progress: Progress,
    name: str,
    art: Artifact,
) -> tuple[VariantResult, dict[str, Any]] | None:
    """One file measured as the race measures it (the same settings: a quiet device's result is reused from
    the measurement cache), for ``race.py``'s leader: (its result, its agent document), None when it failed."""
    with open_session(p, o, device, transport, progress) as session:
        use_generation(session, p, o)
        session.deliver([art])
        res = session.measure(name, art, RunSettings(measure=_measure(p.spec, o)))
    return None if isinstance(res, MeasureFailure) else (res.result, res.doc)


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
    m = _measure(p.spec, o)
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
    """The release gate's decode A/B (``release_ab.py``) in the run's session: (its judgement, or why it could
    not run)."""
    m = _measure(p.spec, o)
    art = built[file_of(shipped.name)]
    new = Side(
        shipped.name,
        art,
        p.settings.context,
        shipped.runtime.threads or m.threads,
        o.runtime_options.get(str(format_spec(art.format).runtime)),
    )
    recorded = last.variant.runtime
    old = Side(
        last.name,
        last.artifact,
        int((last.report.settings.get("generate") or {}).get("context") or p.settings.context),
        recorded.threads or m.threads,
        None,
    )  # its options: pinned on its artifact by load_last_release
    try:
        return decode_ab(session, old, new, m, p.text.windows, o.release.rounds, progress), None
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
    """Build, prove, measure and judge a language model's variants; write the report and ``ship/``."""
    o = options or LMOptions()
    progress = progress or (lambda _m: None)
    t0 = time.perf_counter()
    spec = target_spec(target)
    last = load_last_release(o.baseline) if o.baseline is not None else None  # exit 2 before any build
    p = prepare(model, eval_text, spec, out, o, progress)
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
    built, dropped = build(
        p,
        chosen,
        progress,
        Calibration(windows=p.text.windows, max_kld=o.gate.max_kld, head=o.head),
        clock=Clock(budget_s=o.time_budget_s or (SEARCH_BUDGET_S if o.search else DEFAULT_BUDGET_S), started=t0),
        probe=lambda name, art: _probe(p, o, device, transport, progress, name, art),
    )
    if not built:
        raise BadInputError("no variant could be built: " + "; ".join(f"{k}: {v}" for k, v in dropped.items()))
    to_measure = {**built, **({last.name: last.artifact} if last else {})}
    with open_session(p, o, device, transport, progress) as session:
        use_generation(session, p, o)
        measured, failed, first_doc, capped = measure(session, p, to_measure, o, progress)
        gate, decision, results, again, baseline = _judge(measured, failed, dropped, o, last)
        ab, ab_failure = None, None
        shipped = next((v for v in results if v.name == decision.ship), None)
        if last is not None and shipped is not None and again is not None:
            ab, ab_failure = _release_ab(session, p, o, built, shipped, last, progress)
    if last is not None:
        gate.checks += release_checks(
            shipped,
            again,
            last,
            p.src.sha256,
            p.text.describe().get("windows_sha256"),
            o.release,
            failed.get(last.name),
            ab,
            ab_failure,
        )
        gate.passed = gate.passed and all(c.passed for c in gate.checks)
    progress("writing the report")
    report = Report(
        edgekit_version=__version__,
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        target=spec.name,
        device=DeviceInfo(**session.device_info(first_doc, results)) if first_doc else DeviceInfo(),
        model={**p.src.describe(), "memory": p.plan.describe()},
        settings={
            "task": "text-generation",
            "eval_text": p.text.describe(),
            "generate": {
                "context": p.settings.context,
                "prompt_lengths": p.settings.prompt_lengths(),
                "decode_tokens_filled": p.settings.decode_tokens,
                "filled_at": p.settings.filled_at,
                "prefill_repeats": p.settings.prefill_repeats,
                "greedy_tokens": p.settings.greedy_tokens,
            },
            "measure": _measure(spec, o).model_dump(),
            "objective": o.objective,
            "threads_tuned": None
            if o.threads is not None
            else {"rows": [v.name for v in results if "@t" in v.name], "capped": capped},
            "gate": {"max_kld": o.gate.max_kld, "max_perplexity_increase": o.gate.max_perplexity_increase},
            "skipped": skipped,
        },
        baseline=baseline,
        variants=results + ([again] if again is not None else []),
        gate=gate,
        compared_with=compared_with(last, ab) if last is not None else None,
        decision=decision,
        warnings=session.warnings() + ([capped] if capped else []),
        search=SearchSection(
            mode="full" if o.search else "quick",
            objective=o.objective,
            selected=decision.ship,
            seconds=round(time.perf_counter() - t0, 2),
            candidates=[
                SearchCandidate(
                    name=n,
                    status="selected" if n == decision.ship else ("dropped" if n in dropped else "measured"),
                    reason=decision.lost.get(n),
                )
                for n in dict.fromkeys([*built, *(v.name for v in results), *dropped])
            ],
        ),
    )
    if decision.ship is not None:
        v = report.variant(decision.ship)
        report.search.shipped = ShippedFile(
            **write_lm_ship(p.out_dir, v, built[file_of(decision.ship)], p.src, p.settings)
        )
    else:
        write_nothing_shipped(p.out_dir, "text-generation", decision.reason)
    write_report(report, p.out_dir)
    return report
