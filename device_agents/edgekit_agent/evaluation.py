"""The eval pass: every output of the model on the eval set, in chunks the model takes (a fixed batch
padded), per shape bucket where the data holds several sample shapes; the other buckets' latency."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .protocol import EXIT_BAD_REQUEST, EXIT_RUNTIME, AgentFailure, Doc
from .stats import summarize
from .streams import StreamPlan, assemble, zero_state
from .tensors import Shard, pad, prepare, restore_output


@dataclass
class Batching:
    """How samples are fed: ``static`` is a fixed-batch model's batch (None: dynamic), ``eval`` the chunk
    of the eval pass, ``timed`` the chunk the timed runs feed."""

    static: int | None
    eval: int
    timed: int


def batching(runner: Any, ev: Doc | None, plan: StreamPlan | None = None) -> Batching:
    """A model with a fixed batch N gets chunks of exactly N (the last one padded, the padding's outputs
    dropped); a dynamic batch gets chunks of ``batch_size``. A stateful model (a stream with state) gets
    one sample at a time; with constants only, the batch is read off the inputs the data feeds (a
    constant's first axis is no batch)."""
    if plan is not None and plan.stateful:
        return Batching(static=None, eval=1, timed=1)
    static = runner.static_batch() if plan is None else _data_batch(runner, plan)
    if static:
        return Batching(static=static, eval=static, timed=static)
    return Batching(static=None, eval=int((ev or {}).get("batch_size", 64)), timed=1)


def _data_batch(runner: Any, plan: StreamPlan) -> int | None:
    shapes = getattr(runner, "input_shapes", None)
    if shapes is None:
        return int(runner.static_batch() or 0) or None
    firsts = [shapes[k][0] for k in plan.data if k < len(shapes) and shapes[k]]
    return next((int(d) for d in firsts if isinstance(d, int) and d > 0), None)


def eval_outputs(
    runner: Any,
    shards: Sequence[Shard],
    in_specs: Sequence[Doc],
    out_specs: Sequence[Doc],
    bs: int,
    static: int | None,
    plan: StreamPlan | None = None,
) -> list[np.ndarray]:
    """Every output of the model on the whole eval set (shard by shard), in the user's layout (a
    stream's constants fed beside each chunk)."""
    per_output: list[list[np.ndarray]] | None = None
    chunks = ((xs, i) for xs in shards for i in range(0, len(xs[0]), bs))
    try:
        for xs, i in chunks:
            chunk = [np.asarray(x[i : i + bs]) for x in xs]
            got = len(chunk[0])
            if static:
                chunk = [pad(c, static) for c in chunk]
            res = runner.run([prepare(c, s) for c, s in zip(assemble(plan, chunk, {}), in_specs)])
            res = [restore_output(o, out_specs[k] if k < len(out_specs) else None) for k, o in enumerate(res)]
            if per_output is None:
                per_output = [[] for _ in res]
            for k, o in enumerate(res):
                per_output[k].append(o[:got] if static and o.ndim and len(o) == static else o)
    except AgentFailure:
        raise
    except Exception as exc:
        raise AgentFailure("inference_failed", f"{runner.name} failed on the eval set: {exc}", EXIT_RUNTIME) from exc
    return [np.concatenate(parts, axis=0) for parts in per_output or []]


def bucket_groups(
    shards: list[Shard], counts: Sequence[int] | None, plan: StreamPlan | None
) -> list[list[Shard]] | None:
    """The eval shards split into shape buckets (``counts``: shards per bucket, in order), or None for
    data of one shape."""
    if not counts:
        return None
    if sum(counts) != len(shards) or any(c < 1 for c in counts):
        raise AgentFailure(
            "bad_data", f"eval buckets {list(counts)} do not add up to the {len(shards)} shards", EXIT_BAD_REQUEST
        )
    if plan is not None and plan.stateful:
        raise AgentFailure(
            "bad_data", "a stateful stream cannot run over eval data at several shapes", EXIT_BAD_REQUEST
        )
    out, at = [], 0
    for c in counts:
        out.append(shards[at : at + c])
        at += c
    return out


def bucket_latency(
    runner: Any,
    groups: Sequence[Sequence[Shard]],
    raw0: list[float],
    batch: Batching,
    plan: StreamPlan | None,
    in_specs: Sequence[Doc],
    req: Doc,
) -> list[Doc]:
    """Latency per shape bucket: bucket 0's are the main timed runs (``raw0``); every other bucket's
    first chunk is timed after a few untimed runs, as many runs as bucket 0 had (at most 200, at least 5)."""
    runs = max(5, min(len(raw0), 200))
    warm = min(int(req.get("warmup", 10)), 10)
    out = []
    for j, g in enumerate(groups):
        samples = sum(len(sh[0]) for sh in g)
        shapes = [list(x.shape[1:]) for x in g[0]]
        if j == 0:
            ms = raw0
        else:
            chunk = [pad(np.asarray(x[0 : batch.timed]), batch.timed) for x in g[0]]
            feeds = [prepare(x, s) for x, s in zip(assemble(plan, chunk, zero_state(plan, in_specs)), in_specs)]
            for _ in range(warm):
                runner.run(feeds)
            ms = []
            for _ in range(runs):
                a = time.perf_counter_ns()
                runner.run(feeds)
                ms.append((time.perf_counter_ns() - a) / 1e6)
        st = summarize(ms)
        out.append({"shapes": shapes, "samples": samples, "runs": st["runs"], "p50": st["p50"], "mean": st["mean"]})
    return out
