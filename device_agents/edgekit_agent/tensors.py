"""Tensors between the user's data and a runtime: the eval data's shards, a runtime's input layout and
dtype (transpose, quantization) and back, a fixed batch padded. The host's parity checks and the browser
bridge import this module (through ``edgekit.agent.inprocess``), so host and device feed runtimes alike."""

from __future__ import annotations

from typing import Any, List, Sequence

import numpy as np

from .protocol import EXIT_BAD_REQUEST, AgentFailure, Doc

Shard = List[Any]  # one shard: an array per input the data feeds, in the model's input order


def prepare(x: Any, spec: Doc) -> np.ndarray:
    """User data (as the source model takes it) -> what this runtime's tensor takes."""
    if spec.get("transpose"):
        x = np.transpose(x, spec["transpose"])
    dtype = np.dtype(spec["dtype"])
    if dtype.kind in "iu" and spec.get("scale"):
        info = np.iinfo(dtype)  # type: ignore[type-var]
        q = np.round(x / spec["scale"] + spec.get("zero_point", 0))
        x = np.clip(q, info.min, info.max)
    return np.asarray(np.asarray(x).astype(dtype, copy=False), order="C")  # a 0-d constant stays 0-d


def restore_output(y: Any, spec: Doc | None) -> np.ndarray:
    """A runtime's output -> the source model's layout, float32 (integer outputs dequantized)."""
    y = np.asarray(y)
    if spec and spec.get("scale") and y.dtype.kind in "iu":
        y = (y.astype(np.float32) - spec.get("zero_point", 0)) * spec["scale"]
    if spec and spec.get("transpose"):
        inv = [0] * len(spec["transpose"])
        for i, p in enumerate(spec["transpose"]):
            inv[p] = i
        y = np.transpose(y, inv)
    return np.asarray(y, dtype=np.float32)


def pad(x: Any, size: int) -> np.ndarray:
    """``x`` grown to ``size`` samples by repeating its last sample (for a fixed-batch model)."""
    x = np.asarray(x)
    if len(x) >= size:
        return np.asarray(x[:size])
    return np.concatenate([x, np.repeat(x[-1:], size - len(x), axis=0)], axis=0)


def load_eval(ev: Doc, input_specs: Sequence[Doc]) -> list[Shard]:
    """The eval inputs as a list of shards, each a list of arrays in the model's input order: the
    .npz is one shard; a folder's .npy shards are memory-mapped and read one at a time, so a set
    larger than the device's memory is scored in bounded memory. Labels stay on the host."""
    x_keys = ev.get("x_keys") or ["x"]
    shards: list[Shard] = []
    if ev.get("shards"):
        for sh in ev["shards"]:
            try:
                shards.append([np.load(sh[k], mmap_mode="r", allow_pickle=False) for k in x_keys])
            except (OSError, ValueError, KeyError) as exc:
                raise AgentFailure("bad_data", f"cannot read eval shard {sh}: {exc}", EXIT_BAD_REQUEST) from exc
    else:
        path = ev["path"]
        try:
            data = np.load(path, allow_pickle=False)
        except Exception as exc:
            raise AgentFailure("bad_data", f"cannot read eval data {path}: {exc}", EXIT_BAD_REQUEST) from exc
        missing = [k for k in x_keys if k not in data.files]
        if missing:
            raise AgentFailure(
                "bad_data", f"eval data {path} has no key(s) {missing}; it has {data.files}", EXIT_BAD_REQUEST
            )
        shards = [[np.asarray(data[k]) for k in x_keys]]
    for xs in shards:
        if len(xs) != len(input_specs):
            raise AgentFailure(
                "bad_data", f"model takes {len(input_specs)} inputs, eval data gives {len(xs)}", EXIT_BAD_REQUEST
            )
        if any(len(x) != len(xs[0]) for x in xs):
            raise AgentFailure("bad_data", "eval inputs have different sample counts", EXIT_BAD_REQUEST)
    return shards


def synthetic_inputs(input_specs: Sequence[Doc]) -> list[np.ndarray]:
    """Seeded inputs of the specs' shapes (a dynamic size as 1) and source dtypes, for timing without data."""
    rng = np.random.default_rng(0)
    xs = []
    for spec in input_specs:
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in spec["shape"]]
        dt = np.dtype(spec.get("source_dtype") or "float32")
        if dt.kind == "f":
            xs.append(rng.standard_normal(shape).astype(dt))
        else:
            xs.append(rng.integers(0, 2, size=shape).astype(dt))
    return xs
