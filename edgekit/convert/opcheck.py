"""Op coverage before converting: which ONNX ops the model uses, and which of them a converter route
cannot take, named with their node names. Failing here costs milliseconds; failing inside a
converter costs minutes and a stack trace that names no op.

The onnx2tf op list is read from the installed package's ``ops/`` folder (one module per ONNX op
type), so it follows the installed version and needs no TensorFlow import.
"""

from __future__ import annotations

import importlib.util
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ConversionError, DataError, MissingExtraError
from ..inputs.source import onnx_dim

# ONNX domains the default ONNX op set lives in; anything else is a custom op no converter knows.
_STANDARD_DOMAINS = {"", "ai.onnx"}
# Ops a converted graph may still need as TensorFlow "Flex" ops are found after conversion, when
# the LiteRT interpreter refuses the model (see onnx_to_tflite.py), not guessed here.


@dataclass(frozen=True)
class OpReport:
    route: str
    ops: dict[str, list[str]]  # op type -> node names (all ops of the model)
    unsupported: dict[str, list[str]] = field(default_factory=dict)  # op type -> node names

    @property
    def ok(self) -> bool:
        return not self.unsupported

    def describe(self, limit: int = 5) -> str:
        parts = []
        for op, nodes in sorted(self.unsupported.items()):
            shown = ", ".join(repr(n) for n in nodes[:limit]) + (f" (+{len(nodes) - limit} more)" if len(nodes) > limit else "")
            parts.append(f"{op} at {shown}")
        return "; ".join(parts)


def model_ops(model) -> dict[str, list[str]]:
    """Op type -> node names, including ops inside subgraphs (If/Loop/Scan bodies). Custom-domain
    ops are keyed ``domain::Op``."""
    found: dict[str, list[str]] = defaultdict(list)

    def walk(graph):
        for i, node in enumerate(graph.node):
            key = node.op_type if node.domain in _STANDARD_DOMAINS else f"{node.domain}::{node.op_type}"
            found[key].append(node.name or f"{node.op_type}_{i}")
            for attr in node.attribute:
                if attr.g is not None and attr.g.node:
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)

    walk(model.graph)
    return dict(found)


def onnx2tf_supported_ops() -> set[str]:
    spec = importlib.util.find_spec("onnx2tf")
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtraError("onnx2tf", "tflite", "ONNX -> TFLite conversion")
    ops_dir = Path(list(spec.submodule_search_locations)[0]) / "ops"
    return {p.stem for p in ops_dir.glob("*.py") if p.stem[:1].isupper()}


def check_ops(model, route: str = "onnx2tf") -> OpReport:
    """The model's ops and the ones ``route`` cannot convert (for a TFLite target)."""
    if isinstance(model, (str, Path)):
        import onnx

        model = onnx.load(str(model), load_external_data=False)
    ops = model_ops(model)
    if route != "onnx2tf":
        raise ValueError(f"no op table for route {route!r}")
    supported = onnx2tf_supported_ops()
    unsupported = {op: nodes for op, nodes in ops.items() if op not in supported}
    return OpReport(route=route, ops=ops, unsupported=unsupported)


def require_ops(model, hop: str, route: str = "onnx2tf") -> OpReport:
    """``check_ops`` that raises a ConversionError naming every blocking op and node."""
    rep = check_ops(model, route)
    if not rep.ok:
        raise ConversionError(
            f"the model uses ops that {route} cannot convert for TFLite: {rep.describe()}",
            hop=hop,
            hint="replace these ops in the PyTorch model (or keep this model on ONNX Runtime: --to onnx), "
            "or try the direct PyTorch route (litert-torch) by converting from the .pt2",
        )
    return rep


def dynamic_dims(model) -> dict[str, list[int]]:
    """Input name -> axes (other than the batch axis) whose size is not fixed."""
    init = {i.name for i in model.graph.initializer}
    out: dict[str, list[int]] = {}
    for v in model.graph.input:
        if v.name in init:
            continue
        dims = v.type.tensor_type.shape.dim
        bad = [ax for ax, d in enumerate(dims) if ax > 0 and onnx_dim(d) is None]
        if bad:
            out[v.name] = bad
    return out


def sizes_from_samples(model, xs: list[np.ndarray] | None, given: dict[str, tuple[int, ...]] | None = None,
                       *, fed: set[str] | frozenset[str] = frozenset()) -> dict[str, tuple[int, ...]]:
    """Fixed sizes for the dynamic inputs that ``given`` does not size, read from sample inputs (the
    eval or calibration data: the shapes the model is used at). The samples are the inputs the data
    feeds, in the model's order: every input but ``fed`` (a stream's constants and state, which
    edgekit feeds itself), so they pair by name, never by position among all inputs; a count that does
    not match sizes nothing (the converter's own check then names the input). The batch axis becomes
    1 when it is dynamic; an input whose samples' rank differs is left out."""
    given = dict(given or {})
    if not xs:
        return given
    init = {i.name for i in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in init and v.name not in fed]
    if len(inputs) != len(xs):
        return given
    dyn = dynamic_dims(model)
    for v, x in zip(inputs, xs):
        if v.name in given and tuple(given[v.name][1:]) != tuple(np.shape(x)[1:]):
            raise DataError(f"input {v.name!r}: --input-shape {','.join(map(str, given[v.name]))} does not match the "
                            f"data's samples {tuple(np.shape(x)[1:])}",
                            hint="give --input-shape the data's sizes, or leave it out: the data's shapes fix them")
        if v.name in given or v.name not in dyn:
            continue
        dims = v.type.tensor_type.shape.dim
        shape = tuple(np.shape(x))
        if len(shape) != len(dims):
            continue
        given[v.name] = tuple(onnx_dim(d) or (1 if ax == 0 else int(shape[ax]))
                              for ax, d in enumerate(dims))
    return given


def require_static_shapes(model, hop: str, input_shapes: dict[str, tuple[int, ...]] | None = None) -> None:
    dyn = {k: v for k, v in dynamic_dims(model).items() if not (input_shapes and k in input_shapes)}
    if dyn:
        desc = ", ".join(f"{k} (axes {v})" for k, v in dyn.items())
        raise ConversionError(
            f"the model has inputs with dynamic sizes the converter cannot resolve: {desc}",
            hop=hop,
            hint="give data at the shapes to convert at (--calib-data/--eval-data: their arrays' shapes fix the "
            "sizes), or `edgekit convert --input-shape NAME:1,3,224,224` (one per dynamic input), or export the "
            "model with static shapes",
        )


__all__ = ["OpReport", "check_ops", "require_ops", "model_ops", "dynamic_dims", "sizes_from_samples",
           "require_static_shapes"]
