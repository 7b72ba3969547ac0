"""Runtime options as a search dimension: the selected variant's file, measured again on the device
under each of the runtime's options that can change its speed (threads 1..the target's cores unless
the user fixed ``--threads``; onnxruntime's graph optimization level and execution mode; LiteRT's
XNNPACK delegate on/off and CompiledModel vs Interpreter; ExecuTorch's XNNPACK thread pool, which is
the threads). Every setting is a row of the candidate table (``name@t2,mode=parallel``,
``name@xnnpack=off``); the fastest that passes the same gate ships, and ties (overlapping CIs) keep
the default options. Measurements go through the measurement cache like any other (the options are
part of the request, so part of the key). The agent's runners (``device_agents/edgekit_agent.py``,
``Runner.OPTIONS``) apply the options and refuse unknown ones; ``ship/runtime.json`` records the
setting that shipped (``edgekit/ship.py``).

The grid stays small: each option's non-default values are tried one at a time at every thread
count (one factor at a time, never the product of the options), and an option that only matters
with several threads is tried only above one thread. At MAX_THREADS = 4 cores that is 15 settings
for onnxruntime (3 at one thread, 4 at each of 2..4: the default, two optimization levels, parallel
mode), 12 for LiteRT (the default, XNNPACK off, CompiledModel) and 4 for ExecuTorch; the product
would be 21 and 16. The search's time budget still bounds them: a setting not reached is a dropped
row with that reason."""

from __future__ import annotations

import time

# runtime -> option -> its values, the runtime's default first; every other value is a setting tried.
# What each means on the device, and what the installed runtimes offer, is in the agent's runners.
# ExecuTorch has none: XNNPACK delegation is fixed when the .pte is lowered, and its XNNPACK thread
# pool is sized by the threads (ExecuTorchRunner._size_pool).
RUNTIME_OPTIONS: dict[str, dict[str, tuple]] = {
    "onnxruntime": {"graph_optimization_level": ("all", "extended", "basic"),
                    "execution_mode": ("sequential", "parallel")},
    "litert": {"xnnpack": ("on", "off"), "api": ("interpreter", "compiled")},
    "executorch": {},
}
# options tried only above one thread: onnxruntime's parallel mode runs independent nodes on an
# inter-op pool, which one thread does not have
MULTI_THREAD_ONLY = frozenset({"execution_mode"})
# options sent along with another option's value: parallel mode's inter-op pool gets the setting's threads
IMPLIED = {("execution_mode", "parallel"): lambda threads: {"inter_op_threads": threads}}
# the candidate table's short names (``name@t2,opt=basic,mode=parallel``)
SHORT = {"graph_optimization_level": "opt", "execution_mode": "mode", "inter_op_threads": "inter"}
MAX_THREADS = 4


def settings_grid(runtime: str, cores: int, threads_fixed: int | None) -> list[dict]:
    """Every (threads, options) setting to try, the default first: per thread count, the default
    options, then each option's other values one at a time (see the module docstring for the cap)."""
    threads = [threads_fixed] if threads_fixed else list(range(1, max(1, min(cores, MAX_THREADS)) + 1))
    opts = RUNTIME_OPTIONS.get(runtime, {})
    grid = []
    for t in threads:
        grid.append({"threads": t, "options": {}})
        for key in sorted(opts):
            if key in MULTI_THREAD_ONLY and t < 2:
                continue
            for value in opts[key][1:]:
                extra = IMPLIED.get((key, value), lambda _t: {})(t)
                grid.append({"threads": t, "options": {key: value, **extra}})
    return grid


def label(name: str, setting: dict, default_threads: int) -> str:
    """``name@t2,mode=parallel``: the threads when not the default, then each option by its short
    name (an implied option left out when it only repeats the setting's threads)."""
    t = setting["threads"]
    parts = [] if t == default_threads else [f"t{t}"]
    for k, v in sorted(setting["options"].items()):
        if k == "inter_op_threads" and v == t and setting["options"].get("execution_mode") == "parallel":
            continue
        parts.append(f"{SHORT.get(k, k)}={v}")
    return f"{name}@{','.join(parts)}" if parts else name


def tune_runtime(session, run, final: dict, cands: list, chosen, settings, opts, deadline: float,
                 progress, objective: str = "p50"):
    """Measure ``chosen`` under each runtime setting; returns (the variant to ship, its settings)."""
    from ..device_session import MeasureFailure
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
