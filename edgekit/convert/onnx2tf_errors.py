"""onnx2tf's failures in words: the ONNX node it was converting (op type, inputs and their shapes from the
model edgekit handed it) and the cause, without its colour codes, its trace frames or its advice about
its own command-line flags (-b, -ois, -kt...), which edgekit does not offer."""

from __future__ import annotations

import re
from typing import Iterator

from ..inputs.source import onnx_dim

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# onnx2tf's advice about its own command-line flags (-b, -ois, -kt, -kat, -onwdt, -prf, -osd...), which
# edgekit does not offer, and the lines that only frame its trace
_ADVICE = re.compile(r"(?:^|\s)-{1,2}[a-z][a-z_]*\b.*\boption|(?:use|try|with)(?: the)?:? `?-{1,2}[a-z]"
                     r"|Read this and deal with it|#parameter-replacement|The trace log is below|"
                     r"^(?:ERROR:\s*)?input_onnx_file_path:|Please (?:try running|convert again)|"
                     r"automatic (?:replacement )?JSON|JSON generation", re.I)
_TRACE = re.compile(r"^(?:Traceback \(most recent call last\)|File \"|\^+$|~*\^+~*$|raise |During handling|"
                    r"The above exception)")


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour codes (onnx2tf colours its ERROR/INFO prefixes)."""
    return _ANSI.sub("", text)


def _log_lines(text: str) -> list[str]:
    """A converter log's lines that say something: no colour codes, no trace frames, no advice about
    onnx2tf's command-line flags."""
    out = []
    for ln in strip_ansi(text).splitlines():
        ln = ln.strip()
        if ln and not _TRACE.match(ln) and not _ADVICE.search(ln):
            out.append(ln)
    return out


def log_tail(text: str, n: int = 6) -> str:
    lines = _log_lines(text)
    errs = [ln for ln in lines if "ERROR" in ln or "Error" in ln or "error" in ln]
    return " | ".join((errs or lines)[-n:])[-800:]


def _exc_reason(exc: BaseException) -> str:
    """The cause an exception from onnx2tf/TensorFlow states, on one line: without Keras' framing
    ("Exception encountered when calling layer...", "Call arguments received..."), the trace
    frames, and TF's internal node expression."""
    text = strip_ansi(str(exc))
    if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        return f"no tensor named {exc.args[0]!r} was made before it was read"
    keep = []
    for ln in text.splitlines():
        ln = re.sub(r"^\w*(?:Error|Exception):\s*", "", ln.strip())
        if ln.startswith("Call arguments received"):
            break
        if not ln or _TRACE.match(ln) or ln.startswith(("in user code:", "Exception encountered when calling layer",
                                                        "lambda ", "•")) or _ADVICE.search(ln):
            continue
        keep.append(ln)
    reason = " ".join(keep) or (text.strip().splitlines() or [""])[0]
    reason = re.sub(r" for '\{\{node [^']*'", "", reason)  # TF's graph-node expression names TF ops, not ONNX ones
    return reason[:400]


def failing_node(exc: BaseException, log: str) -> str | None:
    """The ONNX node onnx2tf was converting when it failed: what onnx2tf attached to the exception,
    else its log ("onnx_op_name: ..."), else the op name Keras reports for the failing layer."""
    name = getattr(exc, "onnx_op_name", None)
    if name:
        return str(name)
    found = re.findall(r"onnx_op_name:\s*(\S+)", strip_ansi(log))
    if found:
        return found[-1]
    found = re.findall(r"\bname='([^']+)'", strip_ansi(str(exc)))
    return found[-1] if found else None


def _shape_text(shapes: dict, name: str) -> str:
    s = shapes.get(name)
    return "(" + ", ".join("?" if v is None else str(v) for v in s) + ("," if len(s) == 1 else "") + ")" \
        if s is not None else "(shape unknown)"


def _graphs(graph) -> Iterator:
    """``graph`` and every subgraph in it (If branches, Loop and Scan bodies)."""
    yield graph
    for n in graph.node:
        for a in n.attribute:
            if a.HasField("g"):
                yield from _graphs(a.g)
            for g in a.graphs:
                yield from _graphs(g)


def all_nodes(model) -> list:
    return [n for g in _graphs(model.graph) for n in g.node]


def _graph_shapes(model) -> dict[str, list]:
    import onnx

    shapes: dict[str, list] = {}
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # an aid for the message only
        inferred = model
    for g in _graphs(inferred.graph):
        for v in [*g.value_info, *g.input, *g.output]:
            t = v.type.tensor_type
            if t.HasField("shape"):
                shapes.setdefault(v.name, [onnx_dim(d) for d in t.shape.dim])
        for i in g.initializer:
            shapes.setdefault(i.name, [int(d) for d in i.dims])
        for n in g.node:
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
                shapes.setdefault(n.output[0], [int(d) for d in n.attribute[0].t.dims])
    return shapes


def describe_node(model, name: str | None, renamed: dict[str, str]) -> str | None:
    """'node NAME (Op; inputs a (1, 3, 8, 8), b (8,))', NAME as the user's model spells it."""
    if not name:
        return None
    nodes = {n.name: n for n in all_nodes(model)}
    clean = re.sub(r"^wa/", "/", name)
    node = nodes.get(name) or nodes.get(clean) or nodes.get(clean.replace("__", ":"))
    if node is None:
        return f"node {renamed.get(clean, clean)!r}"
    shapes = _graph_shapes(model)
    ins = ", ".join(f"{i} {_shape_text(shapes, i)}" for i in node.input if i)
    return f"node {renamed.get(node.name, node.name)!r} ({node.op_type}" + (f"; inputs {ins}" if ins else "") + ")"


def _describe_tensor(model, tensor: str, renamed: dict[str, str]) -> str:
    nodes = all_nodes(model)
    made = [n for n in nodes if tensor in n.output]
    read = [n for n in nodes if tensor in n.input]
    parts = []
    if made:
        parts.append(f"made by {made[0].op_type} node {renamed.get(made[0].name, made[0].name)!r}")
    if read:
        parts.append("read by " + ", ".join(f"{n.op_type} node {renamed.get(n.name, n.name)!r}" for n in read[:3]))
    return f"tensor {tensor!r}" + (f" ({'; '.join(parts)})" if parts else " (not in the ONNX graph)")


def onnx2tf_failure(exc: BaseException, log: str, model=None, renamed: dict[str, str] | None = None) -> str:
    """One line naming why onnx2tf failed: the ONNX node it was converting (op type, inputs and their
    shapes, read from the model handed to onnx2tf) and the cause, without colour codes or advice
    about onnx2tf's own command-line flags."""
    renamed = renamed or {}
    node = failing_node(exc, log)
    where = (describe_node(model, node, renamed) if model is not None else (f"node {node!r}" if node else None))
    if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        what = (_describe_tensor(model, exc.args[0], renamed) if model is not None else f"tensor {exc.args[0]!r}")
        cause = f"onnx2tf found no converted value for the {what} (KeyError)"
    else:
        cause = f"{type(exc).__name__}: {_exc_reason(exc)}"
    return (f"onnx2tf failed converting {where}: " if where else "onnx2tf failed: ") + cause


__all__ = ["strip_ansi", "log_tail", "failing_node", "describe_node", "all_nodes", "onnx2tf_failure"]
