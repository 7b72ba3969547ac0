"""Runtime options as a search dimension: the selected variant's file, measured again on the device
under each of the runtime's options that can change its speed (threads 1..the target's cores unless
the user fixed ``--threads``; onnxruntime's graph optimization level). Every setting is a row of the
candidate table (``name@t2,opt=basic``); the fastest that passes the same gate ships, and ties
(overlapping CIs) keep the default options. Measurements go through the measurement cache like any
other (the options are part of the request, so part of the key)."""

from __future__ import annotations

import time
from itertools import product

from ..device_session import MeasureFailure, RunSettings

# runtime -> option -> values tried besides the default (the first value is the runtime's default)
RUNTIME_OPTIONS: dict[str, dict[str, tuple]] = {
    "onnxruntime": {"graph_optimization_level": ("all", "extended", "basic")},
}
MAX_THREADS = 4


def settings_grid(runtime: str, cores: int, threads_fixed: int | None) -> list[dict]:
    """Every (threads, options) setting to try, the default first."""
    threads = [threads_fixed] if threads_fixed else list(range(1, max(1, min(cores, MAX_THREADS)) + 1))
    opts = RUNTIME_OPTIONS.get(runtime, {})
    keys = sorted(opts)
    grid = []
    for t in threads:
        for values in product(*(opts[k] for k in keys)) if keys else [()]:
            grid.append({"threads": t, "options": {k: v for k, v in zip(keys, values) if v != opts[k][0]}})
    return grid


def label(name: str, setting: dict, default_threads: int) -> str:
    parts = [] if setting["threads"] == default_threads else [f"t{setting['threads']}"]
    short = {"graph_optimization_level": "opt"}
    parts += [f"{short.get(k, k)}={v}" for k, v in sorted(setting["options"].items())]
    return f"{name}@{','.join(parts)}" if parts else name


def tune_runtime(session, run, final: dict, cands: list, chosen, settings: RunSettings, opts, deadline: float,
                 progress, objective: str = "p50"):
    """Measure ``chosen`` under each runtime setting; returns (the variant to ship, its settings)."""
    from ..report.gate import evaluate_gate
    from .run import BASE, Candidate, _choose, _reasons

    m = final[chosen.name]
    runtime = chosen.runtime.name
    base_threads = settings.measure.threads
    grid = [g for g in settings_grid(runtime, run.target.cores, opts.threads)
            if not (g["threads"] == base_threads and not g["options"])]
    if not grid:
        return chosen, settings
    from ..recipe import VariantSpec

    contenders, per_setting = [chosen], {chosen.name: settings}
    spec = next((c.spec for c in cands if c.name == chosen.name), VariantSpec(name=chosen.name))
    for g in grid:
        name = label(chosen.name, g, base_threads)
        row = Candidate(spec.model_copy(update={"name": name}), artifact=m.artifact)
        cands.append(row)
        if time.perf_counter() > deadline:
            row.drop("tuning", "time budget exhausted before this runtime setting was measured")
            continue
        s = settings.but(measure=settings.measure.model_copy(update={"threads": g["threads"]}),
                         runtime_options=g["options"] or None)
        progress(f"runtime setting {name}: threads {g['threads']}, options {g['options'] or 'default'}")
        r = session.measure(name, m.artifact, s)
        if isinstance(r, MeasureFailure):
            row.drop("tuning", f"failed on the device ({r.kind}): {r.message}")
            continue
        final[name], per_setting[name] = r, s
        from ..report.assemble import score

        score({BASE: final[BASE], name: r}, run.plan, BASE, run.gate)
        g_ = evaluate_gate([final[BASE].result, r.result], BASE, run.gate, judged=[name],
                           latency_representative=session.emulation is None)
        failed = [c for c in g_.checks if not c.passed]
        if failed:
            row.drop("tuning", _reasons(failed))
            continue
        row.status = "finalist"
        contenders.append(r.result)
    best = _choose(contenders, objective)
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
