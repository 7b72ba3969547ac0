"""Runtime options as a search dimension: the selected variant's file, measured again on the device
under each of the runtime's options that can change its speed (threads 1..the cores the device really
has, counted as ``devices/threads.thread_counts`` counts them for every kind of model, unless the user fixed
``--threads``; onnxruntime's graph optimization level and execution mode;
LiteRT's XNNPACK delegate on/off and CompiledModel vs Interpreter; ExecuTorch's XNNPACK thread pool,
which is the threads). Every setting is a row of the candidate table (``name@t2,mode=parallel``,
``name@xnnpack=off``); the fastest that passes the same gate ships, and ties (overlapping CIs) keep
the default options. Measurements go through the measurement cache like any other (the options are
part of the request, so part of the key). The agent's runners (``device_agents/edgekit_agent/runners/``,
``Runner.OPTIONS``) apply the options and refuse unknown ones; ``ship/runtime.json`` records the
setting that shipped (``edgekit/orchestration/ship.py``).

The grid stays small: each option's non-default values are tried one at a time at every thread
count (one factor at a time, never the product of the options), and an option that only matters
with several threads is tried only above one thread. At MAX_THREADS = 4 cores (threads 1, 2 and 4) that
is 11 settings for onnxruntime (3 at one thread, 4 at each of 2 and 4: the default, two optimization levels,
parallel mode), 9 for LiteRT (the default, XNNPACK off, CompiledModel) and 3 for ExecuTorch; the product
would be 15 and 12. The search's time budget still bounds them: a setting not reached is a dropped
row with that reason.

On a busy or small device (issue #22):
* threads are tuned up to the cores the agent may really use (``device.cpu_budget.usable_cores`` of
  the chosen variant's final measurement: CPU affinity and cgroup quota, floored, at least 1), never
  more than the target's; a cap is said in the report's warnings (:func:`thread_limit`);
* each row's agent run is limited to its share of the remaining budget (at least
  ROW_TIMEOUT_FLOOR_S, at most the request's own timeout), and a row that times out or kills the agent
  on a device that still answers is a dropped row with that reason
  (``DeviceSession.measure_or_drop``); a device that no longer answers still fails the search (exit 3);
* a non-default setting wins only when its tail is not significantly worse than the default
  setting's (:func:`tail_worse`: p90 for the p50 objective, p90 and p99 for p99; bootstrap CI of the
  percentile ratio above 1 + TAIL_MARGIN); otherwise it is dropped and the next best is judged."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from ..agent.browser_bridge import PAGE_OPTIONS
from ..devices.session import DeviceSession, Measured, MeasureFailure, RunSettings
from ..devices.threads import MAX_THREADS, thread_counts, thread_limit
from ..formats import FORMATS
from ..inputs.recipe import VariantSpec
from ..measure.compare import _thin
from ..measure.stats import BOOTSTRAP_SEED
from ..orchestration.assemble import score
from ..report.gate import evaluate_gate
from ..report.model import VariantResult
from .choice import BASE, Candidate, Objective, choose, reasons

if TYPE_CHECKING:
    from ..orchestration.options import DeployOptions
    from ..orchestration.prepare import PreparedRun

# The tuning tables, derived from the format registry's rows (``formats.FormatSpec.tuning``): runtime ->
# option -> its values, the runtime's default first (every other value is a setting tried); options tried
# only above one thread; options sent along with another option's value (= the setting's threads); the
# candidate table's short names (``name@t2,opt=basic,mode=parallel``). ExecuTorch has none: XNNPACK
# delegation is fixed when the .pte is lowered, and its thread pool is sized by the threads.
RUNTIME_OPTIONS: dict[str, dict[str, tuple[object, ...]]] = {s.runtime: dict(s.tuning.options) for s in FORMATS
                                               if s.runtime and s.agent_runs}
MULTI_THREAD_ONLY = frozenset(o for s in FORMATS for o in s.tuning.multi_thread_only)
IMPLIED = {(k, v): o for s in FORMATS for k, v, o in s.tuning.implied}
SHORT = {k: v for s in FORMATS for k, v in s.tuning.short}
# a tuning row's agent run gets its share of the remaining budget, never less than this (a legitimate
# row on a slow board must finish) and never more than the request's own timeout
ROW_TIMEOUT_FLOOR_S = 60.0
# a non-default row whose tail percentile ratio's 95% CI lies above 1 + this loses to the default
TAIL_MARGIN = 0.05
TAIL_RESAMPLES = 2000


class Setting(TypedDict):
    """One runtime setting the tuning stage measures: a thread count and the runtime options sent with it."""

    threads: int
    options: dict[str, object]


def tuning_grid(runtime: str, doc: dict[str, object] | None, target_cores: int, threads_fixed: int | None,
                allowed: Mapping[str, Collection[object]] | None = None) -> tuple[list[Setting], str | None]:
    """:func:`settings_grid` up to :func:`thread_limit`'s threads (the user's ``--threads`` wins),
    only the settings whose every option value is in ``allowed`` when given (a page runtime takes
    fewer options than the native one); returns the grid and the cap's reason (None when not capped)."""
    if threads_fixed:
        grid, why = settings_grid(runtime, target_cores, threads_fixed), None
    else:
        limit, why = thread_limit(doc, target_cores)
        grid = settings_grid(runtime, limit, None)
    if allowed is not None:
        grid = [g for g in grid if all(k in allowed and v in allowed[k] for k, v in g["options"].items())]
    return grid, why


def percentile_ratio_ci(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, q: float,
                        level: float = 0.95, resamples: int = TAIL_RESAMPLES,
                        seed: int | None = None) -> tuple[float, float]:
    """Percentile bootstrap CI of percentile_q(b) / percentile_q(a), each run resampled on its own
    (``measure/compare.bootstrap_ratio_ci`` does the same for the median), fixed seed."""
    a, b = _thin(np.asarray(a, dtype=np.float64)), _thin(np.asarray(b, dtype=np.float64))
    rng = np.random.default_rng(BOOTSTRAP_SEED if seed is None else seed)
    ratios = np.empty(resamples)
    chunk = max(1, 2_000_000 // max(a.size, b.size))  # bounded memory per step
    for start in range(0, resamples, chunk):
        k = min(chunk, resamples - start)
        pa = np.percentile(a[rng.integers(0, a.size, size=(k, a.size))], q, axis=1)
        pb = np.percentile(b[rng.integers(0, b.size, size=(k, b.size))], q, axis=1)
        ratios[start:start + k] = pb / np.maximum(pa, 1e-12)
    lo, hi = np.quantile(ratios, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def tail_worse(default_raw: Sequence[float] | None, row_raw: Sequence[float] | None, objective: str = "p50",
               margin: float = TAIL_MARGIN) -> str | None:
    """Why a tuning row's tail is significantly worse than the default setting's, or None when it
    is not (or cannot be told: fewer than 5 timings on a side). Compared: p90 for the p50 objective,
    p90 and p99 for p99; worse = the bootstrap 95% CI of the percentile ratio (row / default) lies
    above 1 + ``margin``. A second thread on a shared device can win the median and lose the tail."""
    a = np.asarray([] if default_raw is None else default_raw, dtype=np.float64)
    b = np.asarray([] if row_raw is None else row_raw, dtype=np.float64)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if a.size < 5 or b.size < 5:
        return None
    for q in (90, 99) if objective == "p99" else (90,):
        pa, pb = float(np.percentile(a, q)), float(np.percentile(b, q))
        if pa <= 0:
            continue
        lo, hi = percentile_ratio_ci(a, b, q)
        if lo > 1.0 + margin:
            return (f"tail worse than the default setting: p{q} {pb:.3g} ms vs {pa:.3g} ms "
                    f"(ratio {pb / pa:.2f}, 95% CI [{lo:.2f}, {hi:.2f}] above {1 + margin:.2f})")
    return None


def row_timeout(remaining_s: float, rows_left: int, request_timeout_s: float) -> float:
    """One tuning row's limit: its share of the remaining budget, at least ROW_TIMEOUT_FLOOR_S, at
    most the request's own timeout."""
    share = max(0.0, remaining_s) / max(1, rows_left)
    return min(request_timeout_s, max(ROW_TIMEOUT_FLOOR_S, share))


def settings_grid(runtime: str, cores: int, threads_fixed: int | None) -> list[Setting]:
    """Every (threads, options) setting to try, the default first: per thread count, the default
    options, then each option's other values one at a time (see the module docstring for the cap)."""
    threads = thread_counts(min(cores, MAX_THREADS), threads_fixed)
    opts = RUNTIME_OPTIONS.get(runtime, {})
    grid: list[Setting] = []
    for t in threads:
        grid.append({"threads": t, "options": {}})
        for key in sorted(opts):
            if key in MULTI_THREAD_ONLY and t < 2:
                continue
            for value in opts[key][1:]:
                extra = {IMPLIED[(key, value)]: t} if (key, value) in IMPLIED else {}
                grid.append({"threads": t, "options": {key: value, **extra}})
    return grid


def label(name: str, setting: Setting, default_threads: int) -> str:
    """``name@t2,mode=parallel``: the threads when not the default, then each option by its short
    name (an implied option left out when it only repeats the setting's threads)."""
    t = setting["threads"]
    parts = [] if t == default_threads else [f"t{t}"]
    for k, v in sorted(setting["options"].items()):
        if v == t and any(o == k and setting["options"].get(trigger) == value
                          for (trigger, value), o in IMPLIED.items()):
            continue
        parts.append(f"{SHORT.get(k, k)}={v}")
    return f"{name}@{','.join(parts)}" if parts else name


def tune_runtime(session: DeviceSession, run: PreparedRun, final: dict[str, Measured], cands: list[Candidate],
                 chosen: VariantResult, settings: RunSettings, opts: DeployOptions, deadline: float,
                 progress: Callable[[str], None], objective: Objective = "p50") -> tuple[VariantResult, RunSettings]:
    """Measure ``chosen`` under each runtime setting; returns (the variant to ship, its settings).
    A row that hangs or kills the agent on a device that still answers is dropped with its reason;
    a would-be winner whose tail is worse than the default setting's is dropped and the next judged."""
    m = final[chosen.name]
    runtime = chosen.runtime.name
    base_threads = settings.measure.threads
    allowed = None
    if getattr(session.transport, "kind", None) == "browser":  # a page's runtime takes fewer options

        allowed = PAGE_OPTIONS.get(runtime, {})
    grid, capped = tuning_grid(runtime, m.doc, run.target.cores, opts.threads, allowed)
    if capped:
        progress(capped)
        opts.extra_warnings = [*opts.extra_warnings, f"runtime tuning of {chosen.name}: {capped}"]
    grid = [g for g in grid if not (g["threads"] == base_threads and not g["options"])]
    if not grid:
        return chosen, settings
    contenders, per_setting, rows = [chosen], {chosen.name: settings}, {}
    spec = next((c.spec for c in cands if c.name == chosen.name), VariantSpec(name=chosen.name))
    for i, g in enumerate(grid):
        name = label(chosen.name, g, base_threads)
        row = Candidate(spec.model_copy(update={"name": name}), artifact=m.artifact)
        cands.append(row)
        rows[name] = row
        if time.perf_counter() > deadline:
            row.drop("tuning", "time budget exhausted before this runtime setting was measured")
            continue
        s = settings.but(measure=settings.measure.model_copy(update={"threads": g["threads"]}),
                         runtime_options=g["options"] or None)
        limit = row_timeout(deadline - time.perf_counter(), len(grid) - i,
                            session.request(name, m.artifact, s).timeout_s)
        progress(f"runtime setting {name}: threads {g['threads']}, options {g['options'] or 'default'} "
                 f"(at most {limit:.0f} s)")
        r = session.measure_or_drop(name, m.artifact, s.but(timeout_s=limit))
        if isinstance(r, MeasureFailure):
            row.drop("tuning", f"failed on the device ({r.kind}): {r.message}")
            continue
        final[name], per_setting[name] = r, s  # shipped settings carry no tuning time limit
        score({BASE: final[BASE], name: r}, run.plan, BASE, run.gate)
        g_ = evaluate_gate([final[BASE].result, r.result], BASE, run.gate, judged=[name],
                           latency_representative=session.emulation is None)
        failed = [c for c in g_.checks if not c.passed]
        if failed:
            row.drop("tuning", reasons(failed))
            continue
        row.status = "finalist"
        contenders.append(r.result)
    best = choose(contenders, objective)
    while best is not None and best is not chosen:  # a non-default setting wins only with an honest tail
        why = tail_worse(chosen.latency_ms.raw if chosen.latency_ms else None,
                         best.latency_ms.raw if best.latency_ms else None, objective)
        if why is None:
            break
        rows[best.name].drop("tuning", why)
        contenders.remove(best)
        best = choose(contenders, objective)
    if best is None:  # no setting has the objective's figure (not even the default): the default stays
        return chosen, settings
    if best is not chosen:
        chosen.selected = False
        best.selected = True
        for c in cands:
            if c.name == chosen.name and c.status == "selected":
                c.status = "finalist"
                c.reason = f"the same file runs faster as {best.name}"
            if c.name == best.name:
                c.status = "selected"
    return best, per_setting[best.name]
