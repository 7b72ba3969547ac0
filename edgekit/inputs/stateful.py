"""Streaming and stateful models: model inputs that are not in the eval data (issue #25).

- A constant input (``--const NAME=VALUE``, or a 0-d array in the data named like the input: a sample
  rate, a threshold) is fed unchanged with every run.
- A state input (``--state OUT:IN``) starts as zeros of the input's shape (a dynamic axis: 1) and, after
  each eval sample, takes what the model returned in output OUT: the samples run one at a time (batch
  1), in the data's order, as a streaming model runs in use (Silero VAD's LSTM state).

:func:`resolve_stream` checks both against the model once (exit 2 naming its inputs and outputs;
:func:`for_source` does so for ``deploy`` and ``quantize``, which pass it on with every data set);
:class:`Stream` assembles each run's feed (the data's arrays, the constants, the state, in the model's
input order); :func:`run` runs a one-feed function over the data that way (the host's reference
outputs), :func:`feeds` yields the feeds in order (static INT8 calibration). The agent does the same
from the request's ``stream`` (``device_agents/edgekit_agent/streams.py`` ``stream_plan``); both join the
per-sample outputs alike (:func:`join_samples`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from ..artifact import Artifact, IOSpec, TensorSpec
from ..errors import BadInputError, DataError
from ..formats import Format
from .source import model_batch, run_batched

Once = Callable[[list[np.ndarray]], list[np.ndarray]]  # every model input in order -> every output


@dataclass(frozen=True, eq=False)
class StateLink:
    output: str  # the model output that holds the next state
    input: str  # the model input it is fed back to
    shape: tuple[int, ...]  # the zeros it starts from
    dtype: str


@dataclass(frozen=True, eq=False)
class Stream:
    inputs: tuple[str, ...]  # every model input, in the model's order (source names)
    outputs: tuple[str, ...]
    constants: dict[str, np.ndarray] = field(default_factory=dict)  # input -> value (its dtype and shape)
    state: tuple[StateLink, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)  # constant -> "--const" | "data"
    batch: int | None = None  # the data inputs' static batch (None: dynamic); 1 when stateful

    @property
    def stateful(self) -> bool:
        return bool(self.state)

    @property
    def fed(self) -> frozenset[str]:
        """The inputs edgekit feeds itself (not from the data)."""
        return frozenset(self.constants) | {s.input for s in self.state}

    def data_io(self, io: IOSpec) -> IOSpec:
        """The model's io with only the inputs the data feeds (what the data is checked against)."""
        return IOSpec(inputs=tuple(s for s in io.inputs if s.name not in self.fed), outputs=io.outputs)

    def zeros(self) -> dict[str, np.ndarray]:
        return {s.input: np.zeros(s.shape, np.dtype(s.dtype)) for s in self.state}

    def feed(self, data: list[np.ndarray], state: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Every model input in order: the data's arrays where the data feeds it, else the constant or
        the current state."""
        it = iter(data)
        return [self.constants[n] if n in self.constants else state[n] if n in state else next(it)
                for n in self.inputs]

    def next_state(self, outs: list[np.ndarray]) -> dict[str, np.ndarray]:
        new = {}
        for s in self.state:
            y = np.asarray(outs[self.outputs.index(s.output)])
            if tuple(y.shape) != s.shape:
                raise DataError(f"--state {s.output}:{s.input}: output {s.output!r} has shape {tuple(y.shape)}, "
                                f"and input {s.input!r} starts as zeros of shape {s.shape}",
                                hint="name the output that returns the next value of that input (same shape)")
            new[s.input] = y.astype(np.dtype(s.dtype), copy=False)
        return new

    def settings(self) -> dict[str, Any]:
        """What the report, the lineage and ship.json record."""
        return {"constants": {k: v.tolist() for k, v in self.constants.items()},
                "constants_from": dict(self.sources),
                "state": [{"output": s.output, "input": s.input, "shape": list(s.shape), "dtype": s.dtype}
                          for s in self.state],
                "batch": 1 if self.stateful else self.batch,
                **({"order": "one sample at a time in eval-sample order, state from zeros, each sample fed the "
                             "state outputs of the one before"} if self.stateful else {})}

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.settings(), sort_keys=True).encode()).hexdigest()[:16]

    def wire(self, io: IOSpec, source_io: IOSpec) -> dict[str, Any]:
        """The request's ``stream``, in the names of the file ``io`` describes (matched by position with the
        source model's)."""
        ins = {s.name: f.name for s, f in zip(source_io.inputs, io.inputs)}
        outs = {s.name: f.name for s, f in zip(source_io.outputs, io.outputs)}
        return {"constants": {ins[k]: {"dtype": str(v.dtype), "shape": list(v.shape), "values": v.ravel().tolist()}
                              for k, v in self.constants.items()},
                "state": [{"output": outs[s.output], "input": ins[s.input], "shape": list(s.shape)} for s in self.state]}


# --------------------------------------------------------------------------- the command line
def parse_constants(items: list[str]) -> dict[str, np.ndarray]:
    """``NAME=VALUE`` words (``--const``) -> name -> value: a number, or comma-separated numbers for a
    1-D input. Cast to the input's dtype and shape once the model is known (:func:`resolve_stream`)."""
    out: dict[str, np.ndarray] = {}
    for item in items:
        name, sep, value = (p.strip() for p in item.partition("="))
        if not sep or not name or not value:
            raise BadInputError(f"--const {item!r} is not NAME=VALUE", hint="e.g. --const sr=16000")
        if name in out:
            raise BadInputError(f"--const {name} is given twice", hint="give each constant input once")
        try:
            nums = [_number(v) for v in value.split(",")]
        except ValueError:
            raise BadInputError(f"--const {item!r}: {value!r} is not a number (or comma-separated numbers)",
                                hint="e.g. --const sr=16000, or --const scale=0.5,0.5,0.5; a larger constant "
                                "goes in the eval .npz as a 0-d or fixed array named like the input") from None
        out[name] = np.asarray(nums[0] if len(nums) == 1 else nums)
    return out


def _number(text: str) -> int | float:
    t = text.strip()
    if t.lower() in ("true", "false"):
        return int(t.lower() == "true")
    try:
        return int(t)
    except ValueError:
        return float(t)


def parse_state(items: list[str]) -> list[tuple[str, str]]:
    """``OUT:IN`` words (``--state``) -> (output, input) pairs."""
    out: list[tuple[str, str]] = []
    for item in items:
        o, sep, i = (p.strip() for p in item.partition(":"))
        if not sep or not o or not i or ":" in i:
            raise BadInputError(f"--state {item!r} is not OUTPUT:INPUT",
                                hint="e.g. --state stateN:state (the output that returns the next state, then "
                                "the input it is fed back to)")
        if i in (p[1] for p in out):
            raise BadInputError(f"--state: input {i!r} is fed by two outputs", hint="give each state input once")
        out.append((o, i))
    return out


# --------------------------------------------------------------------------- checked against the model
def resolve_stream(io: IOSpec, constants: dict[str, Any] | None, state: list[tuple[str, str]] | None,
                   data_constants: dict[str, np.ndarray] | None = None) -> Stream | None:
    """The constants (``--const`` over the data's 0-d arrays named like an input) and the state links,
    checked against the model's inputs and outputs; None when the model takes neither."""
    specs = {s.name: s for s in io.inputs}
    named = {k: v for k, v in (data_constants or {}).items() if k in specs}
    given = {k: np.asarray(v) for k, v in (constants or {}).items()}
    for k in given:
        if k not in specs:
            raise BadInputError(f"--const {k}: the model has no input {k!r}", hint=f"its inputs are {_names(io.inputs)}")
    for k in set(given) & set(named):
        if not np.array_equal(given[k], named[k]):
            raise BadInputError(f"--const {k}={given[k].tolist()} contradicts the eval data's array {k!r} "
                                f"({named[k].tolist()})", hint="drop one of them")
    values = {**named, **given}
    consts = {k: _cast(k, v, specs[k]) for k, v in values.items()}
    links = tuple(_link(o, i, io, consts) for o, i in (state or []))
    if not consts and not links:
        return None
    data = [s for s in io.inputs if s.name not in set(consts) | {s.input for s in links}]
    if not data:
        raise BadInputError("--const/--state feed every model input: nothing is left for the eval data",
                            hint=f"the data must feed at least one of {_names(io.inputs)}")
    return Stream(inputs=tuple(specs), outputs=tuple(o.name for o in io.outputs), constants=consts, state=links,
                  sources={k: "--const" if k in given else "data" for k in consts},
                  batch=1 if links else model_batch([s.shape for s in data]))


def _names(specs) -> str:
    return ", ".join(f"{s.name} {tuple('?' if d is None else d for d in s.shape)}" for s in specs)


def _cast(name: str, value: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """``value`` in the input's dtype and shape (a scalar for a 0-d input, the static shape when fixed)."""
    dt = np.dtype(spec.dtype)
    v = np.asarray(value)
    if dt.kind in "iub" and v.dtype.kind == "f" and not np.all(np.equal(np.mod(v, 1), 0)):
        raise BadInputError(f"--const {name}={v.tolist()}: input {name!r} takes {spec.dtype} (whole numbers)",
                            hint=f"e.g. --const {name}={int(np.ravel(v)[0])}")
    v = v.astype(dt)
    shape = tuple(spec.shape)
    if all(d is not None for d in shape):
        if v.size != int(np.prod(shape, dtype=np.int64)):
            raise BadInputError(f"--const {name}: {v.size} value(s) for input {name!r} of shape {shape}",
                                hint=f"give {int(np.prod(shape, dtype=np.int64))} value(s), comma-separated")
        return v.reshape(shape)
    if v.ndim != len(shape):
        raise BadInputError(f"--const {name}: a value of shape {v.shape} for input {name!r} of shape "
                            f"{tuple('?' if d is None else d for d in shape)}",
                            hint=f"store it in the eval .npz as an array named {name!r} of the input's rank")
    return v


def _link(out: str, inp: str, io: IOSpec, consts: dict) -> StateLink:
    outs = [o.name for o in io.outputs]
    specs = {s.name: s for s in io.inputs}
    if out not in outs:
        raise BadInputError(f"--state {out}:{inp}: the model has no output {out!r}",
                            hint=f"its outputs are {_names(io.outputs)}")
    if inp not in specs:
        raise BadInputError(f"--state {out}:{inp}: the model has no input {inp!r}", hint=f"its inputs are {_names(io.inputs)}")
    if inp in consts:
        raise BadInputError(f"input {inp!r} is both a --const and a --state input", hint="it is one or the other")
    spec = specs[inp]
    return StateLink(output=out, input=inp, shape=tuple(1 if d is None else int(d) for d in spec.shape),
                     dtype=spec.dtype)


def missing_inputs_hint(io: IOSpec, missing: list[str], streams: bool = True) -> str:
    """What to say when the data lacks model inputs: they may be a streaming model's state or constants.
    ``streams``: the command takes --const/--state; where it does not (``edgekit convert``, whose parity
    feeds every input from the data), the hint says which commands do, never a flag it lacks."""
    outs = ", ".join(o.name for o in io.outputs)
    if not streams:
        return (f"this command feeds every model input from the data and has no --const/--state: add the "
                f"array(s) {missing} to the .npz when each sample has its own (batch-first) value; a streaming "
                f"model's state (carried from sample to sample, e.g. --state OUTPUT:{missing[0]}; the model's "
                f"outputs: {outs}) and constant inputs (--const NAME=VALUE) are taken by `edgekit deploy` and "
                f"`edgekit quantize`")
    return (f"an input the model returns the next value of (a streaming model's state) is carried with --state "
            f"OUTPUT:INPUT (e.g. --state OUTPUT:{missing[0]}; the model's outputs: {outs}); a constant (a sample "
            f"rate) is --const NAME=VALUE; else add the array to the .npz")


# --------------------------------------------------------------------------- running with it
def join_samples(parts: list[np.ndarray]) -> np.ndarray:
    """Per-sample outputs as one array: joined on the batch axis where each has one (a first axis of
    1), else stacked on a new first axis (a state output (2, 1, 128) -> (N, 2, 1, 128))."""
    if all(p.ndim and p.shape[0] == 1 for p in parts):
        return np.concatenate(parts, axis=0)
    return np.stack(parts)


def run(once: Once, xs: list[np.ndarray], stream: Stream) -> list[np.ndarray]:
    """Every output of ``once`` over the data ``xs`` (the data's inputs, samples first), fed as the
    stream says: with state, one sample at a time in order, each fed the state the one before returned
    (zeros first); with constants only, in batches (the static batch, else 64), the constants beside."""
    if not stream.stateful:
        return run_batched(lambda feed: once(stream.feed(feed, {})), list(xs), stream.batch)
    parts: list[list[np.ndarray]] = []
    for _, outs in _carried(once, xs, stream):
        parts = parts or [[] for _ in outs]
        for k, y in enumerate(outs):
            parts[k].append(y)
    return [join_samples(p) for p in parts]


def _carried(once: Once, xs: list[np.ndarray], stream: Stream) -> Iterator[tuple[list[np.ndarray], list[np.ndarray]]]:
    state = stream.zeros()
    for i in range(len(xs[0])):
        feed = stream.feed([np.asarray(x[i:i + 1]) for x in xs], state)
        outs = [np.asarray(y) for y in once(feed)]
        state = stream.next_state(outs)
        yield feed, outs


def feeds(once: Once, xs: list[np.ndarray], stream: Stream) -> Iterator[list[np.ndarray]]:
    """Each sample's whole feed (every model input), one sample at a time in order; with state, the state
    ``once`` (the float model) returned for the sample before. For calibration readers."""
    if not stream.stateful:
        for i in range(len(xs[0])):
            yield stream.feed([np.asarray(x[i:i + 1]) for x in xs], {})
        return
    for feed, _ in _carried(once, xs, stream):
        yield feed


def from_interface(face: dict, source_io: IOSpec) -> Stream | None:
    """The stream ship.json's interface records (``constants``, ``state``), for ``edgekit run ship/``."""
    consts, state = face.get("constants") or {}, face.get("state") or []
    if not consts and not state:
        return None
    dtypes = {s.name: s.dtype for s in source_io.inputs}
    return Stream(inputs=tuple(dtypes), outputs=tuple(o.name for o in source_io.outputs),
                  constants={k: np.asarray(v, np.dtype(dtypes[k])) for k, v in consts.items()},
                  state=tuple(StateLink(s["output"], s["input"], tuple(s["shape"]), s["dtype"]) for s in state),
                  batch=face.get("batch"))


def for_source(source, constants: dict[str, Any] | None, state: list[tuple[str, str]] | None,
               data_constants: dict[str, np.ndarray] | None = None) -> Stream | None:
    """:func:`resolve_stream` for a loaded model (``deploy`` and ``quantize``): an ONNX model only (the
    PyTorch export feeds batch-first inputs only), recorded in the source's lineage (:func:`recorded`:
    every artifact derived from it inherits it). None when the data feeds every input."""

    stream = resolve_stream(source.artifact.io, constants, state, data_constants)
    if stream is None:
        return None
    if source.artifact.format == Format.TORCH:
        raise BadInputError("--const/--state take an ONNX model here (the PyTorch export runs batch-first inputs only)",
                            hint="export the model to ONNX (torch.onnx.export) and give the .onnx")
    source.artifact = recorded(source.artifact, stream)
    return stream


def recorded(art: Artifact, stream: Stream) -> Artifact:
    """``art`` with the stream in its source step's config (``stream``): every variant derived from it
    inherits it, and ship.json's interface reads it from there (:func:`of_artifact`)."""
    steps = list(art.lineage)
    k = next((i for i, s in enumerate(steps) if s.kind == "source"), None)
    if k is None:
        return art
    steps[k] = steps[k].model_copy(update={"config": {**steps[k].config, "stream": stream.settings()}})
    return art.model_copy(update={"lineage": tuple(steps)})


def of_artifact(art: Artifact) -> dict | None:
    """The stream settings recorded in ``art``'s lineage (:func:`recorded`), or None."""
    return next((s.config["stream"] for s in art.lineage if s.kind == "source" and s.config.get("stream")), None)


def stream_of(art: Artifact) -> Stream | None:
    """The :class:`Stream` recorded in ``art``'s lineage, in the names of ``art.io`` (the ONNX model it was
    resolved against), or None: what a converter feeds its parity runs with."""
    return from_interface(of_artifact(art) or {}, art.io)
