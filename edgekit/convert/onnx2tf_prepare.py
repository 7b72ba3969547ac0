"""What onnx2tf is given: the ONNX model prepared so that onnx2tf converts it as the model means.

- input sizes fixed (TFLite graphs are static; a dynamic batch axis becomes 1) and shapes re-inferred
  (``fixed_shapes``);
- constant subgraphs folded by onnxslim, in this process, when shape inference still leaves tensors
  without a static shape (paddle2onnx's Shape -> Cast -> Slice -> Concat -> Reshape; ``simplify``);
- ConstantOfShape weights folded (``fold_constant_of_shape``), node names TensorFlow rejects as scope
  names ('Softmax@0') rewritten (``tf_node_names``), and layout hints for C == H == W tensors before a
  padded Conv (``layout_hints``);
- for full-integer INT8, padded MaxPools fed by an edge Pad (``edge_padded_max_pools``): onnx2tf's own
  padding value, float32's lowest, would enter the calibrated range.
"""

from __future__ import annotations

import itertools
import re
import threading

import numpy as np

from ..errors import ConversionError
from ..inputs.source import onnx_dim
from ..logs import quiet
from .onnx2tf_errors import all_nodes

HOP = "onnx->tflite"


def fixed_shapes(model, shapes: dict[str, tuple[int, ...]]):
    """A copy of ``model`` whose inputs have the given sizes (a dynamic batch axis becomes 1), with
    shapes re-inferred: TFLite graphs are static, and a dynamic axis left to the converter comes
    out as size 1."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    init = {i.name for i in m.graph.initializer}
    for v in m.graph.input:
        if v.name in init:
            continue
        dims = v.type.tensor_type.shape.dim
        want = shapes.get(v.name)
        if want is not None and len(want) != len(dims):
            raise ConversionError(f"--input-shape {v.name}: {len(want)} sizes for a rank-{len(dims)} input", hop=HOP)
        for ax, d in enumerate(dims):
            size = want[ax] if want is not None else (1 if ax == 0 and onnx_dim(d) is None else None)
            if size is not None:
                d.ClearField("dim_param")
                d.dim_value = int(size)
    del m.graph.value_info[:]
    for o in m.graph.output:  # let inference recompute them from the fixed inputs
        for d in o.type.tensor_type.shape.dim:
            if onnx_dim(d) is None:
                d.Clear()
    try:
        return onnx.shape_inference.infer_shapes(m, strict_mode=False)
    except Exception:  # inference is an aid for onnx2tf, not a requirement
        return m


_TF_SCOPE_CHARS = re.compile(r"[^A-Za-z0-9_.\\/>:-]")  # a TF name scope's characters, plus ':' (onnx2tf rewrites it)


def tf_node_names(model) -> tuple[object | None, dict[str, str]]:
    """A copy of ``model`` whose node names TensorFlow accepts as name scopes (None when all do),
    and {new name: the model's name}. onnx2tf names TF ops after the ONNX nodes; a name with other
    characters (paddle2onnx writes 'Softmax@0') fails the conversion ("'Softmax@0' is not a valid
    scope name"). Only node names change: tensor names, which the model's inputs and outputs are
    matched by, stay as they are. A leading '/' (torch.onnx's names) and ':' are left to onnx2tf,
    which rewrites them itself."""
    import onnx

    def fixed(name: str) -> str:
        new = _TF_SCOPE_CHARS.sub("_", name)
        return new if not new or re.match(r"[A-Za-z0-9./]", new) else f"n{new}"

    if all(fixed(n.name) == n.name for n in all_nodes(model)):
        return None, {}
    m = onnx.ModelProto()
    m.CopyFrom(model)
    taken = {n.name for n in all_nodes(m)}
    renamed: dict[str, str] = {}
    for n in all_nodes(m):  # subgraphs' nodes too: onnx2tf converts If/Loop bodies node by node
        new = fixed(n.name)
        if new == n.name:
            continue
        new = next(c for c in itertools.chain([new], (f"{new}_{j}" for j in itertools.count(1))) if c not in taken)
        taken.add(new)
        renamed[new] = n.name
        n.name = new
    return m, renamed


_SIMPLIFY_LOCK = threading.Lock()  # onnxslim keeps its optimization switches in class attributes
SIMPLIFY_SKIP = ["graph_fusion", "weight_tying"]  # no op fusion: onnx2tf sees the model's own ops
SIMPLIFY_FOLD_LIMIT = 10 << 20  # no folded constant above 10 MiB (an Expand/Tile of a constant would bloat the file)


def shapeless_tensors(model) -> list[str]:
    """Node outputs that ONNX shape inference leaves without a fully static shape (Constant nodes
    aside). onnx2tf picks each tensor's layout from its shape; one it has no shape for is guessed, and
    a Reshape fed by a Shape -> Cast -> Slice -> Concat chain (paddle2onnx's pattern, which
    onnx.shape_inference cannot follow) comes out in the wrong layout or fails a later op."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # no inference: nothing to say
        return []
    known = set()
    for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        t = v.type.tensor_type
        if t.HasField("shape") and all(onnx_dim(d) is not None or (d.HasField("dim_value") and d.dim_value == 0)
                                       for d in t.shape.dim):
            known.add(v.name)
    return [o for n in inferred.graph.node if n.op_type != "Constant" for o in n.output if o and o not in known]


def simplify(model) -> tuple[object | None, dict]:
    """``model`` with its constant subgraphs folded (shape computations become constants, so every
    tensor gets a static shape), dead nodes and duplicate subexpressions removed, through onnxslim's
    Python API in this process (no op fusion). Returns (the simplified model, or None when it did not
    give more tensors a static shape, or onnxslim is missing or failed; what was done, for the lineage)."""
    import importlib.util

    before = shapeless_tensors(model)
    info: dict = {"tool": "onnxslim", "shapeless_before": len(before)}
    if importlib.util.find_spec("onnxslim") is None:
        return None, {**info, "skipped": "onnxslim is not installed (pip install 'edgekit[tflite]')"}
    import onnxslim

    info["tool"] = f"onnxslim {getattr(onnxslim, '__version__', '?')}"
    try:
        with _SIMPLIFY_LOCK, quiet("onnxslim"):
            slim = onnxslim.slim(model, skip_optimizations=list(SIMPLIFY_SKIP), size_threshold=SIMPLIFY_FOLD_LIMIT)
    except Exception as exc:  # a simplifier bug: convert the model as it is
        return None, {**info, "skipped": f"onnxslim failed: {type(exc).__name__}: {str(exc)[:200]}"}
    if slim is None:
        return None, {**info, "skipped": "onnxslim returned no model"}
    after = shapeless_tensors(slim)
    info["shapeless_after"] = len(after)
    if len(after) >= len(before):
        return None, {**info, "skipped": "no more static shapes than before"}
    return slim, info


def fold_constant_of_shape(model):
    """A copy of ``model`` where every ConstantOfShape with a constant shape input is an initializer,
    or None when there is none. onnx2tf 1.28 reads a weight made by ConstantOfShape as if it were a
    Constant node's value (its 1-element ``value`` attribute) and fails ("axes don't match array")
    on models whose weights are made that way (e.g. the ONNX backend's "light" zoo models)."""
    import onnx
    from onnx import numpy_helper

    consts = {i.name: i for i in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts.setdefault(n.output[0], n.attribute[0].t)
    targets = [n for n in model.graph.node if n.op_type == "ConstantOfShape" and n.input and n.input[0] in consts]
    if not targets:
        return None
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = []
    for n in m.graph.node:
        if n.op_type == "ConstantOfShape" and n.input and n.input[0] in consts:
            shape = [int(d) for d in numpy_helper.to_array(consts[n.input[0]]).reshape(-1)]
            value = next((numpy_helper.to_array(a.t).reshape(-1) for a in n.attribute if a.name == "value"),
                         np.zeros(1, np.float32))
            m.graph.initializer.append(numpy_helper.from_array(np.full(shape, value[0], dtype=value.dtype), n.output[0]))
        else:
            keep.append(n)
    del m.graph.node[:]
    m.graph.node.extend(keep)
    return m


def _pool_attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _edge_pads(a: dict, size: list[int], out: list[int | None]) -> tuple[list[int], list[int]] | None:
    """A padded MaxPool's begin pads and the end pads that give its output size with ceil_mode off, or
    None when edge padding would change a max or the sizes do not check out."""
    k = list(a["kernel_shape"])
    r = len(k)
    s = list(a.get("strides") or [1] * r)
    pads = list(a.get("pads") or [0] * 2 * r)
    auto = a.get("auto_pad", b"NOTSET")
    if (auto.decode() if isinstance(auto, bytes) else auto) != "NOTSET":
        return None
    if any(d != 1 for d in a.get("dilations") or []):
        return None  # dilated windows may skip the edge value they would repeat
    begin, end, ceil = pads[:r], pads[r:], bool(a.get("ceil_mode", 0))
    new_end = []
    for ax in range(r):
        h, b = size[ax], begin[ax]
        if b >= k[ax]:
            return None
        span = h + b + end[ax] - k[ax]
        n = (-(-span // s[ax]) if ceil else span // s[ax]) + 1
        if ceil and (n - 1) * s[ax] >= h + b:  # PyTorch's and onnxruntime's rule: no window starts in the end pad
            n -= 1
        if out[ax] is not None and out[ax] != n:
            return None
        new_end.append(max(0, (n - 1) * s[ax] + k[ax] - h - b))
    return (begin, new_end) if any(begin) or any(new_end) else None


def edge_padded_max_pools(model) -> tuple[object | None, list[str]]:
    """A copy of ``model`` in which every padded MaxPool (explicit pads, or ``ceil_mode`` windows running
    past the end) reads an edge-padded input with no padding of its own, and the changed nodes' names;
    (None, []) when there is none. onnx2tf fills such padding with float32's lowest value, and a
    full-integer INT8 model calibrates that tensor's range with it in: MTCNN's ONet (three ceil-mode
    pools) lost all parity (landmarks cosine 0.17, face top-1 agreement 58%), a ResNet stem (MaxPool 3/2,
    pads 1) cosine 0.04, and the test zoo's transformers-ResNet detector's INT8 file crashed LiteRT ("double
    free"); with edge padding they keep it (0.992, 0.99+, 0.99997). Repeating the edge value changes no maximum: with dilation 1 every
    window holds the edge element it repeats (begin pads < kernel; the last window starts inside the
    input). Only for full-integer INT8: float files keep onnx2tf's padding (an edge pad is a MirrorPad
    chain XNNPACK does not take)."""
    import onnx
    from onnx import helper, numpy_helper

    pools = [i for i, n in enumerate(model.graph.node)
             if n.op_type == "MaxPool" and not (len(n.output) > 1 and n.output[1])]  # no Indices output
    if not pools:
        return None, []
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        return None, []
    shapes = {v.name: [onnx_dim(d) for d in v.type.tensor_type.shape.dim]
              for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
              if v.type.tensor_type.HasField("shape")}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 11)
    plan = {}
    for i in pools:
        n = model.graph.node[i]
        shp, out = shapes.get(n.input[0]), shapes.get(n.output[0])
        a = _pool_attrs(n)
        r = len(a.get("kernel_shape") or [])
        if not r or not shp or len(shp) != r + 2 or any(v is None for v in shp[2:]):
            continue
        got = _edge_pads(a, shp[2:], (out[2:] if out and len(out) == r + 2 else [None] * r))
        if got is not None:
            plan[i] = (*got, a)
    if not plan:
        return None, []
    m = onnx.ModelProto()
    m.CopyFrom(model)
    taken = {t for n in m.graph.node for t in [*n.input, *n.output]} | {i.name for i in m.graph.initializer}
    nodes, changed = [], []
    for i, n in enumerate(m.graph.node):
        if i not in plan:
            nodes.append(n)
            continue
        begin, end, a = plan[i]
        stem = f"{n.output[0]}_edge"
        padded = next(c for c in itertools.chain([stem], (f"{stem}{j}" for j in itertools.count(1))) if c not in taken)
        taken.add(padded)
        full = [0, 0, *begin, 0, 0, *end]
        if opset >= 11:
            pads_name = f"{padded}_pads"
            m.graph.initializer.append(numpy_helper.from_array(np.array(full, np.int64), pads_name))
            nodes.append(helper.make_node("Pad", [n.input[0], pads_name], [padded], name=f"{n.name or padded}_edge_pad",
                                          mode="edge"))
        else:
            nodes.append(helper.make_node("Pad", [n.input[0]], [padded], name=f"{n.name or padded}_edge_pad",
                                          mode="edge", pads=full))
        keep = {k: v for k, v in a.items() if k in ("kernel_shape", "strides", "storage_order")}
        pool = helper.make_node("MaxPool", [padded], list(n.output), name=n.name, **keep)
        nodes.append(pool)
        changed.append(n.name or n.output[0])
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m, changed


def layout_hints(model) -> tuple[object | None, list[dict]]:
    """onnx2tf param replacements for 4-D tensors whose layout onnx2tf 1.28 cannot tell from their
    shape, and a copy of ``model`` with names given to unnamed target nodes (None when no name was
    needed). onnx2tf guesses whether a TF tensor is in ONNX (NCHW) or NHWC order by comparing shapes;
    when C == H == W (a Segformer stage at 64x64: tokens (N, 256, 16) reshaped to 16x16x16) it
    guesses wrong: a Transpose(0,3,1,2) after a Reshape to (N,H,W,C) becomes a real transpose
    instead of a no-op, and a Reshape to (N,C,H,W) stays in ONNX order. A Conv corrects that by its
    own error-driven search, except a Conv with explicit pads: it pads first and scores its
    candidates on the unpadded tensor, so it keeps the wrong layout (max abs error ~2 on Segformer,
    argmax still mostly right). The hints make such a tensor NHWC, which every consumer then reads
    correctly: the Transpose's perm becomes identity, the Reshape's output gets a (0,2,3,1) transpose."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # inference is an aid: no shapes, no hints
        return None, []
    shapes: dict[str, list] = {}
    for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        dims = v.type.tensor_type.shape.dim
        shapes[v.name] = [onnx_dim(d) for d in dims]
    producer = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)

    def ambiguous(name: str) -> bool:
        s = shapes.get(name) or []
        return len(s) == 4 and None not in s and s[1] == s[2] == s[3] and s[1] > 1

    def padded_conv(name: str) -> bool:
        return any(c.op_type == "Conv" and c.input[0] == name and
                   any(v for a in c.attribute if a.name == "pads" for v in a.ints) for c in consumers.get(name, []))

    targets = []
    for n in model.graph.node:
        out = n.output[0] if n.output else ""
        if not ambiguous(out) or not padded_conv(out):
            continue
        perm = next((list(a.ints) for a in n.attribute if a.name == "perm"), None)
        src = producer.get(n.input[0]) if n.input else None
        if n.op_type == "Transpose" and perm == [0, 3, 1, 2] and src is not None and src.op_type == "Reshape":
            targets.append((n, {"param_target": "attributes", "param_name": "perm", "values": [0, 1, 2, 3]}))
        elif n.op_type == "Reshape" and len(shapes.get(n.input[0]) or []) != 4:
            targets.append((n, {"param_target": "outputs", "param_name": out, "post_process_transpose_perm": [0, 2, 3, 1]}))
    if not targets:
        return None, []
    named = None
    if any(not n.name for n, _ in targets):
        named = onnx.ModelProto()
        named.CopyFrom(model)
        taken = {n.name for n in model.graph.node}
        for k, n in enumerate(named.graph.node):
            if not n.name:
                n.name = next(f"edgekit_node_{k}_{j}" for j in itertools.count() if f"edgekit_node_{k}_{j}" not in taken)
        by_out = {n.output[0]: n.name for n in named.graph.node if n.output}
        targets = [(by_out[n.output[0]], op) for n, op in targets]
    else:
        targets = [(n.name, op) for n, op in targets]
    return named, [{"op_name": name, **op} for name, op in targets]


__all__ = ["fixed_shapes", "fold_constant_of_shape", "layout_hints", "tf_node_names", "shapeless_tensors", "simplify", "SIMPLIFY_SKIP", "SIMPLIFY_FOLD_LIMIT"]
