"""A stream model's constant inputs folded into its ONNX graph, for converters that cannot read control flow.

Silero VAD branches on its sample-rate input: the whole graph is an ``If(sr == 16000)`` whose branches hold
more ``If`` nodes on the input's rank and sizes. OpenVINO's ONNX frontend cannot convert those branches
("Conversion is failed for: If-16 ... Conv-16"). With ``--const sr=16000`` the run feeds one value, so the
branch is known: the constant becomes an initializer, the dynamic sizes become the ones the run uses (the
state's shape; the data's sample shape, batch 1 for a stateful stream), and onnxslim folds the branches
away. The folded model keeps the source's inputs in their order (a folded constant stays as an input the
graph no longer reads), so the request, the stream's wiring and ship.json address it as they address the
source; the value it computes with is the one the stream records, and its lineage says so
(``constants_folded``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from ..inputs.stateful import Stream
from ..logs import quiet
from .onnx2tf_prepare import _SIMPLIFY_LOCK, SIMPLIFY_FOLD_LIMIT, SIMPLIFY_SKIP


def _dims(v) -> list:
    return list(v.type.tensor_type.shape.dim)


def _used_names(graph) -> set[str]:
    """Every tensor name a node reads, in subgraphs too (an If's branches read outer names)."""
    used: set[str] = set()
    for node in graph.node:
        used.update(node.input)
        for a in node.attribute:
            if a.g is not None and a.g.ByteSize():
                used |= _used_names(a.g)
            for g in a.graphs:
                used |= _used_names(g)
    return used


def fold_stream(src: Path, stream: Stream, data: list[np.ndarray], out: Path) -> dict:
    """Write ``src`` with ``stream``'s constants folded to ``out``. Returns what was done, for the lineage:
    ``{"constants_folded": {name: value}, "input_shapes": {name: shape}, "tool": ...}``, or
    ``{"skipped": reason}`` (nothing written) when onnxslim is missing or the graph still reads a constant
    after folding (the model is then converted as it is)."""
    import onnx
    from onnx import numpy_helper


    if importlib.util.find_spec("onnxslim") is None:
        return {"skipped": "onnxslim is not installed (pip install 'edgekit[tflite]')"}
    import onnxslim

    model = onnx.load(str(src))
    g = model.graph
    originals = {v.name: onnx.ValueInfoProto.FromString(v.SerializeToString()) for v in g.input}
    order = [v.name for v in g.input]
    sizes: dict[str, list[int]] = {s.input: list(s.shape) for s in stream.state}
    for name, x in zip([n for n in stream.inputs if n not in stream.fed], data):
        shape = list(np.shape(x))
        if shape:
            shape[0] = 1 if stream.stateful else -1  # -1: a dynamic batch stays dynamic
        sizes[name] = shape
    fixed: dict[str, list[int]] = {}
    for v in list(g.input):
        if v.name in stream.constants:
            g.input.remove(v)
            g.initializer.append(numpy_helper.from_array(np.asarray(stream.constants[v.name]), v.name))
            continue
        want = sizes.get(v.name)
        dims = _dims(v)
        if want is None or len(want) != len(dims):
            continue
        for d, w in zip(dims, want):
            if w > 0 and not d.HasField("dim_value"):
                d.ClearField("dim_param")
                d.dim_value = int(w)
        fixed[v.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    tool = f"onnxslim {getattr(onnxslim, '__version__', '?')}"
    try:
        with _SIMPLIFY_LOCK, quiet("onnxslim"):
            slim = onnxslim.slim(model, skip_optimizations=list(SIMPLIFY_SKIP), size_threshold=SIMPLIFY_FOLD_LIMIT)
    except Exception as exc:  # a simplifier bug: convert the model as it is
        return {"skipped": f"onnxslim failed: {type(exc).__name__}: {str(exc)[:200]}"}
    still = sorted(set(stream.constants) & _used_names(slim.graph))
    if still:
        return {"skipped": f"the graph still reads {still} after folding"}
    left = {v.name: v for v in slim.graph.input}
    for init in [i for i in slim.graph.initializer if i.name in stream.constants]:
        slim.graph.initializer.remove(init)
    inputs = [left.get(n) or originals[n] for n in order if n in left or n in stream.constants]
    del slim.graph.input[:]
    slim.graph.input.extend(inputs)
    onnx.save(slim, str(out))
    return {"tool": tool, "constants_folded": {k: np.asarray(v).tolist() for k, v in stream.constants.items()},
            "input_shapes": fixed}


__all__ = ["fold_stream"]
