"""Streaming inputs: the request's ``stream`` (edgekit/inputs/stateful.py on the host) names constant inputs fed
unchanged with every run, and state inputs that start as zeros and take the named output after each run;
the eval pass of a stateful model runs one sample at a time in eval-sample order, carrying the state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .protocol import EXIT_BAD_REQUEST, EXIT_RUNTIME, AgentFailure, Doc
from .tensors import Shard, prepare, restore_output


@dataclass
class StreamPlan:
    """The request's stream resolved to input/output positions."""

    n: int  # the model's inputs
    constants: dict[int, np.ndarray]  # input position -> the array fed with every run
    state: list[tuple[int, int, tuple[int, ...]]]  # (output position, input position it feeds, shape)
    data: list[int]  # the input positions the eval data feeds

    @property
    def stateful(self) -> bool:
        return bool(self.state)


def stream_plan(req: Doc, in_specs: Sequence[Doc], out_specs: Sequence[Doc]) -> StreamPlan | None:
    """The request's stream as a plan; None without one."""
    st = req.get("stream")
    if not st:
        return None
    ins, outs = [s.get("name") for s in in_specs], [s.get("name") for s in out_specs]

    def pos(names: list[Any], name: str, what: str) -> int:
        if name not in names:
            raise AgentFailure(
                "bad_request", f"stream {what} {name!r} is not one of the model's {what}s {names}", EXIT_BAD_REQUEST
            )
        return names.index(name)

    consts = {}
    for name, c in (st.get("constants") or {}).items():
        try:
            consts[pos(ins, name, "input")] = np.asarray(c["values"], dtype=np.dtype(c["dtype"])).reshape(c["shape"])
        except (KeyError, TypeError, ValueError) as exc:
            raise AgentFailure("bad_request", f"stream constant {name!r}: {exc}", EXIT_BAD_REQUEST) from exc
    try:
        links = [
            (pos(outs, s["output"], "output"), pos(ins, s["input"], "input"), tuple(int(d) for d in s["shape"]))
            for s in st.get("state") or []
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise AgentFailure("bad_request", f"stream state {st.get('state')!r}: {exc}", EXIT_BAD_REQUEST) from exc
    fed = set(consts) | {i for _, i, _ in links}
    return StreamPlan(
        n=len(in_specs), constants=consts, state=links, data=[k for k in range(len(in_specs)) if k not in fed]
    )


def data_specs(plan: StreamPlan | None, in_specs: Sequence[Doc]) -> list[Doc]:
    """The specs of the inputs the eval data feeds (all of them without a stream)."""
    return list(in_specs) if plan is None else [in_specs[k] for k in plan.data]


def zero_state(plan: StreamPlan | None, in_specs: Sequence[Doc]) -> dict[int, np.ndarray]:
    if plan is None:
        return {}
    return {
        i: np.zeros(shape, np.dtype(in_specs[i].get("source_dtype") or in_specs[i]["dtype"]))
        for _, i, shape in plan.state
    }


def assemble(plan: StreamPlan | None, data: Sequence[Any], state: dict[int, np.ndarray]) -> list[Any]:
    """Every input in the model's order: the data's arrays, the constants, the current state."""
    if plan is None:
        return list(data)
    it = iter(data)
    return [plan.constants[k] if k in plan.constants else state[k] if k in state else next(it) for k in range(plan.n)]


def next_state(
    plan: StreamPlan, outs: Sequence[Any], state: dict[int, np.ndarray], out_specs: Sequence[Doc]
) -> dict[int, np.ndarray]:
    new = {}
    for o, i, shape in plan.state:
        y = np.asarray(outs[o])
        if tuple(y.shape) != tuple(shape):
            name = out_specs[o].get("name") if o < len(out_specs) else o
            raise AgentFailure(
                "inference_failed",
                f"state output {name!r} has shape {list(y.shape)}; the state input it feeds takes {list(shape)}",
                EXIT_RUNTIME,
            )
        new[i] = y.astype(state[i].dtype, copy=False)
    return new


def join_samples(parts: Sequence[np.ndarray]) -> np.ndarray:
    """Per-sample outputs joined on the batch axis where each has one (a first axis of 1), else stacked on
    a new first axis (the same rule as the host's edgekit/inputs/stateful.py ``join_samples``)."""
    if all(p.ndim and p.shape[0] == 1 for p in parts):
        return np.concatenate(parts, axis=0)
    return np.stack(parts)


def stream_outputs(
    runner: Any, shards: Sequence[Shard], in_specs: Sequence[Doc], out_specs: Sequence[Doc], plan: StreamPlan
) -> list[np.ndarray]:
    """Every output of a stateful model on the eval set: one sample at a time, in order (shard after
    shard), each run fed the state the run before returned (zeros before the first)."""
    state = zero_state(plan, in_specs)
    parts: list[list[np.ndarray]] | None = None
    try:
        for xs in shards:
            for i in range(len(xs[0])):
                feed = assemble(plan, [np.asarray(x[i : i + 1]) for x in xs], state)
                res = runner.run([prepare(c, s) for c, s in zip(feed, in_specs)])
                res = [restore_output(o, out_specs[k] if k < len(out_specs) else None) for k, o in enumerate(res)]
                state = next_state(plan, res, state, out_specs)
                parts = parts or [[] for _ in res]
                for k, o in enumerate(res):
                    parts[k].append(o)
    except AgentFailure:
        raise
    except Exception as exc:
        raise AgentFailure("inference_failed", f"{runner.name} failed on the eval set: {exc}", EXIT_RUNTIME) from exc
    return [join_samples(p) for p in parts or []]
