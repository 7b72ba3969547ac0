"""Threads per runtime in a language model's race (issue #37): the thread count that decodes fastest differs by
runtime and device (llama.cpp's matmuls scale with cores until memory bandwidth is the limit, onnxruntime's
intra-op pool pays later on small models, XNNPACK in between), so after the race each runtime's best file inside
the quality gate is measured again, on the device, at the other thread counts (``devices.threads.thread_counts``,
as the fixed-graph search counts them) up to the cores the agent may use (``devices.threads.thread_limit``: the
target's cores, at most 4, capped by CPU affinity and cgroup quota).

Each setting is a full row of the race, named ``FILE@tN`` (the fixed-graph search's spelling): the same file,
its own timings and its own scoring on the device (its logits are scored again rather than assumed unchanged).
A setting competes only when it is clearly faster than its file at the measured threads (decode: by the one
tie rule, ``report/decision.speed_tied``, on the two rows' tokens/s CIs; TTFT and prefill: 5% better);
otherwise it loses with that reason and the default stays. ``--threads N`` fixes the threads: nothing is tuned.
``ship/runtime.json`` records the shipped setting's threads."""

from __future__ import annotations

from typing import Any

from ..devices.threads import thread_counts, thread_limit
from ..inputs.targets import TargetSpec
from ..report.decision import TIE_TOLERANCE, objective_cost, speed_ratio
from ..report.model import VariantResult
from .judge import LMGate, variant_checks

MARGIN = 0.05  # TTFT / prefill: a setting must be this much better to replace the measured threads


def tuned_name(name: str, threads: int) -> str:
    return f"{name}@t{threads}"


def file_of(name: str) -> str:
    """The built file a row measures (``gguf-q4_0@t2`` -> ``gguf-q4_0``)."""
    return name.split("@", 1)[0]


def settings_to_try(
    results: list[VariantResult], cfg: LMGate, objective: str, doc: dict[str, Any] | None, spec: TargetSpec
) -> tuple[list[tuple[str, int]], str | None]:
    """([(file, threads)] to measure: each runtime's best file inside the gate at every other thread count),
    and why the threads were capped below the target's cores (None: not capped)."""
    limit, why = thread_limit(doc, spec.cores)
    best: dict[str, VariantResult] = {}
    for v in results:
        value = objective_cost(v, objective)
        if value is None or any(not c.passed for c in variant_checks(v, cfg)):
            continue
        cur = best.get(v.runtime.name)
        if cur is None or value < (objective_cost(cur, objective) or float("inf")):
            best[v.runtime.name] = v
    rows = [(v.name, t) for v in best.values() for t in thread_counts(limit) if t != v.runtime.threads]
    return rows, why


def not_competing(results: list[VariantResult], objective: str) -> dict[str, str]:
    """{row: why it does not replace its file's measured threads} for the ``@tN`` rows not clearly faster."""
    by_name = {v.name: v for v in results}
    out: dict[str, str] = {}
    for v in results:
        base = by_name.get(file_of(v.name))
        if base is None or base is v or v.generation is None or base.generation is None:
            continue
        if objective == "decode":
            vg, bg = v.generation, base.generation
            lo, hi = vg.decode_tokens_per_s_ci95 or [0.0, 0.0]
            b_lo, b_hi = bg.decode_tokens_per_s_ci95 or [0.0, 0.0]
            # the project's one tie rule (report/decision.speed_tied): the time ratio's CI, from the two rows'
            # tokens/s CIs, must clear the tie band for the setting to replace its file's measured threads
            r = speed_ratio(base, v, "decode")
            if r is None:
                out[v.name] = f"not proved faster than {base.name}: a decode rate without its CI"
                continue
            if r.faster:
                continue
            figures = (
                f"decode {vg.decode_tokens_per_s:.1f} tok/s (95% CI {lo:.1f}-{hi:.1f}) vs "
                f"{bg.decode_tokens_per_s:.1f} ({b_lo:.1f}-{b_hi:.1f})"
            )
            out[v.name] = (
                f"slower at {v.runtime.threads} threads than {base.name} at {base.runtime.threads}: {figures}"
                if r.slower
                else f"not proved faster than {base.name} at {base.runtime.threads} thread(s): {figures}: "
                f"{r.describe()}, within the {TIE_TOLERANCE:.0%} tie band"
            )
        else:
            a, b = objective_cost(v, objective), objective_cost(base, objective)
            if a is not None and b is not None and a < b * (1 - MARGIN):
                continue
            out[v.name] = f"not {MARGIN:.0%} better than {base.name} at {base.runtime.threads} thread(s) by {objective}"
    return out
