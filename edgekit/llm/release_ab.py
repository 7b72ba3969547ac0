"""The release gate's speed comparison for a language model: this release's shipped file and the last release's,
timed in alternating rounds in one device session.

The race measures every file once, one after another; two measurements minutes apart on a shared device differ
by its load, clocks and heat (on this project's 2-core host a busy neighbour moved decode tokens/s by 15% within
a minute), so comparing them read an unchanged release as a regression. Here the two files take turns (A B, B A,
A B ...; A the last release, B this one), each turn a short decode-only agent run (no scoring, the quickest
prefill), so slow drift hits both sides alike. Each round's ratio is the median time a token of B over A's; the
judgement is the fixed-graph A/B's (``report/release.py: judge_ab``): the median round ratio, a bootstrap CI over
rounds, and an exact Wilcoxon signed-rank test over them. Each side runs with its own settings: the last release
at the threads and runtime options its report recorded, this release at its shipped row's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..artifact import Artifact
from ..devices.session import DeviceSession, MeasureFailure, RunSettings
from ..inputs.targets import MeasureDefaults
from ..measure.stats import ABBlocks
from ..report.release import LatencyJudgement, judge_ab
from .request import GenerateSettings, generate_request

# pairs of turns: the exact signed-rank test reaches p = 0.008 at 8 pairs (at 6, 0.031: every pair must agree)
ROUNDS = 8


@dataclass(frozen=True)
class Side:
    """One file as it runs in the comparison."""

    name: str
    art: Artifact
    context: int  # the positions its file takes (an ExecuTorch file's static cache)
    threads: int
    runtime_options: dict[str, Any] | None


def _turn(session: DeviceSession, side: Side, m: MeasureDefaults, windows: np.ndarray, label: str) -> list[float]:
    """One decode-only agent run of ``side``: its per-token times (ms); a failure raises with the agent's words."""
    mm = m.model_copy(update={"threads": side.threads, "min_seconds": max(0.1, m.min_seconds / 4)})
    req = generate_request(
        variant=label,
        art=side.art,
        model_remote=session.remote(side.art.path),
        measure=mm,
        settings=GenerateSettings(context=side.context, decode_tokens=1, prefill_repeats=1),
        windows=windows,
        scoring=None,
        greedy=None,
        outputs_remote=None,
        runtime_options=side.runtime_options,
    )
    res = session.run(req, RunSettings(measure=mm, cached=False, timeout_s=req.timeout_s + 600))
    if isinstance(res, MeasureFailure):
        raise res.error()
    return [float(x) for x in res.doc["latency_ms"]["raw"]]


def decode_ab(
    session: DeviceSession,
    last: Side,
    new: Side,
    m: MeasureDefaults,
    windows: np.ndarray,
    rounds: int = ROUNDS,
    progress: Callable[[str], None] | None = None,
) -> LatencyJudgement:
    """``new`` against ``last`` in ``rounds`` alternating pairs of turns; the judgement's ratio is new / last time
    a token (> 1: this release decodes slower)."""
    session.deliver([last.art, new.art])
    blocks = ABBlocks()
    for i in range(rounds):
        if progress:
            progress(f"release A/B: round {i + 1} of {rounds} ({last.name} and {new.name}, decode only)")
        order = ("a", "b") if i % 2 == 0 else ("b", "a")
        times: dict[str, list[float]] = {}
        for key in order:
            side = last if key == "a" else new
            times[key] = _turn(session, side, m, windows, f"{side.name}-ab{i}")
        blocks.a.append(times["a"])
        blocks.b.append(times["b"])
        blocks.order.extend(order)
    return judge_ab(blocks)
