"""A .tflite file's ops and tensors as TFLite Micro sees them: the builtin ops (the firmware's
``MicroMutableOpResolver`` list), the weights' bytes, and where the activations peak.

The peak is computed from the graph: a non-constant tensor lives from the op that writes it (a graph input from
the first op) to the last op that reads it (a graph output to the end); at each op the live tensors' bytes are
summed, and the op with the largest sum names the tensors that hold the peak. This is the lower bound TFLM's
memory planner packs into; the arena itself is measured by the interpreter (``interpreter.py``), which adds its
own bookkeeping and the kernels' scratch buffers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .kernels import builtin_names

# TFLite TensorType -> bytes per element
_ITEMSIZE = {0: 4, 1: 2, 2: 4, 3: 1, 4: 8, 6: 1, 7: 2, 9: 1, 10: 8, 16: 4, 17: 1}


@dataclass(frozen=True)
class LiveTensor:
    name: str
    bytes: int
    shape: tuple[int, ...] = ()

    def describe(self) -> str:
        return f"{self.name} {list(self.shape)} ({self.bytes} B)"


@dataclass(frozen=True)
class Peak:
    op_index: int  # the op at which the live activations peak
    op: str  # its builtin name
    bytes: int  # the live activations' bytes there
    tensors: tuple[LiveTensor, ...]  # the live tensors, largest first

    def describe(self, top: int = 4) -> str:
        names = ", ".join(t.describe() for t in self.tensors[:top])
        more = f" and {len(self.tensors) - top} more" if len(self.tensors) > top else ""
        return f"{self.bytes} B live at op {self.op_index} ({self.op}): {names}{more}"


@dataclass(frozen=True)
class Graph:
    ops: tuple[str, ...]  # the builtin name of each operator, in execution order
    weights_bytes: int  # bytes of the constant buffers (weights, biases, quantization tables)
    peak: Peak | None
    output_names: tuple[str, ...] = field(default=())  # the subgraph's outputs, in order
    largest_weights: tuple[LiveTensor, ...] = field(default=())  # the biggest constant tensors, largest first
    # multiply-accumulates per inference of the ops that do nearly all of them (CONV_2D, DEPTHWISE_CONV_2D,
    # FULLY_CONNECTED, TRANSPOSE_CONV, BATCH_MATMUL), by op type: what a latency estimate scales
    macs_by_op: dict[str, int] = field(default_factory=dict)

    @property
    def macs(self) -> int:
        return sum(self.macs_by_op.values())

    @property
    def op_set(self) -> list[str]:
        """The distinct builtin ops, sorted: the resolver's list."""
        return sorted(set(self.ops))


def _model(data: bytes) -> Any:
    from tflite_micro.tensorflow.lite.micro.python import schema_py_generated as schema  # heavy: flatbuffers

    return schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(bytearray(data), 0))


def _name(t: Any) -> str:
    n = t.name
    return n.decode() if isinstance(n, bytes) else str(n)


def read_graph(data: bytes) -> Graph:
    """The first subgraph's ops, weights and activation peak (TFLM runs subgraph 0; control flow is refused)."""
    model = _model(data)
    names = builtin_names()
    codes = [max(c.builtinCode, c.deprecatedBuiltinCode) for c in model.operatorCodes]
    sub = model.subgraphs[0]
    operators = list(sub.operators or [])
    ops = tuple(names.get(codes[o.opcodeIndex], f"CODE_{codes[o.opcodeIndex]}") for o in operators)
    tensors = list(sub.tensors or [])
    const = {i for i, t in enumerate(tensors) if t.buffer and model.buffers[t.buffer].data is not None
             and len(model.buffers[t.buffer].data) > 0}
    weights = sum(len(model.buffers[tensors[i].buffer].data) for i in const)
    big = sorted((_live(tensors[i], len(model.buffers[tensors[i].buffer].data)) for i in const),
                 key=lambda t: -t.bytes)[:5]
    macs: dict[str, int] = {}
    for o, op in zip(operators, ops):
        n = _macs(op, [tensors[i] if i >= 0 else None for i in (o.inputs if o.inputs is not None else [])],
                  [tensors[i] for i in (o.outputs if o.outputs is not None else [])])
        if n:
            macs[op] = macs.get(op, 0) + n
    return Graph(ops=ops, weights_bytes=int(weights), peak=_peak(operators, tensors, const, ops, sub),
                 output_names=tuple(_name(tensors[i]) for i in (sub.outputs if sub.outputs is not None else [])),
                 largest_weights=tuple(big), macs_by_op=macs)


_FLOAT = {0: "float32", 1: "float16", 10: "float64"}
_INT8 = 9


def full_integer_problems(data: bytes, limit: int = 4) -> list[str]:
    """Why a .tflite is not a full-integer INT8 file (int8 inputs and outputs, no float activation): each graph
    input or output that is not int8, and the first ``limit`` float activations with the op that writes them.
    Empty: it is one."""
    model = _model(data)
    names = builtin_names()
    codes = [max(c.builtinCode, c.deprecatedBuiltinCode) for c in model.operatorCodes]
    sub = model.subgraphs[0]
    tensors = list(sub.tensors or [])
    out = [f"{role} {_name(tensors[i])} is {_FLOAT.get(tensors[i].type, f'type {tensors[i].type}')}, not int8"
           for role, idx in (("input", sub.inputs), ("output", sub.outputs)) for i in (idx if idx is not None else [])
           if tensors[i].type != _INT8]
    floats = []
    for k, o in enumerate(sub.operators or []):
        op = names.get(codes[o.opcodeIndex], f"CODE_{codes[o.opcodeIndex]}")
        floats += [f"op {k} ({op}) writes {_FLOAT[tensors[i].type]} {_name(tensors[i])}"
                   for i in (o.outputs if o.outputs is not None else []) if tensors[i].type in _FLOAT]
    return out + floats[:limit] + ([f"and {len(floats) - limit} more float activations"] if len(floats) > limit else [])


def _shape(t: Any) -> list[int]:
    return [int(d) for d in (t.shape if t is not None and t.shape is not None else [])]


def _macs(op: str, ins: list[Any], outs: list[Any]) -> int:
    """One op's multiply-accumulates: each output element of a convolution or matrix product sums over its
    receptive field (kernel height x width x input channels; a depthwise one, kernel height x width)."""
    if not outs or len(ins) < 2:
        return 0
    out_elems = int(np.prod(_shape(outs[0]), dtype=np.int64))
    w = _shape(ins[1])
    if op == "CONV_2D" and len(w) == 4:  # filter [out, kh, kw, in]
        return out_elems * w[1] * w[2] * w[3]
    if op == "DEPTHWISE_CONV_2D" and len(w) == 4:  # filter [1, kh, kw, out]
        return out_elems * w[1] * w[2]
    if op == "FULLY_CONNECTED" and len(w) == 2:  # weights [out, in]
        return out_elems * w[1]
    if op == "TRANSPOSE_CONV" and len(ins) > 2:  # inputs: output shape, filter [out, kh, kw, in], data
        f, x = _shape(ins[1]), _shape(ins[2])
        return int(np.prod(x, dtype=np.int64)) * (f[0] * f[1] * f[2] if len(f) == 4 else 1)
    if op == "BATCH_MATMUL":
        a = _shape(ins[0])
        return out_elems * (a[-1] if a else 1)
    return 0


def _live(t: Any, size: int | None = None) -> LiveTensor:
    shape = tuple(int(d) for d in (t.shape if t.shape is not None else []))
    return LiveTensor(_name(t), _bytes(t) if size is None else int(size), shape)


def _bytes(t: Any) -> int:
    shape = [int(d) for d in (t.shape if t.shape is not None else [])]
    return int(np.prod(shape, dtype=np.int64)) * _ITEMSIZE.get(int(t.type), 4)


def _peak(operators: list[Any], tensors: list[Any], const: set[int], ops: tuple[str, ...], sub: Any) -> Peak | None:
    if not operators:
        return None
    last = len(operators) - 1
    first: dict[int, int] = {int(i): 0 for i in (sub.inputs if sub.inputs is not None else [])}
    end: dict[int, int] = {int(i): last for i in (sub.outputs if sub.outputs is not None else [])}
    for k, op in enumerate(operators):
        for i in (op.outputs if op.outputs is not None else []):
            first.setdefault(int(i), k)
        for i in (op.inputs if op.inputs is not None else []):
            if i >= 0:
                end[int(i)] = max(end.get(int(i), k), k)
                first.setdefault(int(i), k)
    live_at = []
    for k in range(len(operators)):
        live = [i for i in first if i not in const and first[i] <= k <= end.get(i, first[i])]
        live_at.append((sum(_bytes(tensors[i]) for i in live), k, live))
    total, k, live = max(live_at, key=lambda r: r[0])
    held = sorted((_live(tensors[i]) for i in live), key=lambda t: -t.bytes)
    return Peak(op_index=k, op=ops[k], bytes=int(total), tensors=tuple(held))
