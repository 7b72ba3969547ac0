"""Layer sensitivity to INT8, measured once: the output error of quantizing each tensor alone.

Given the float model and its full-INT8 QDQ build (the scales and zero points onnxruntime chose
from the calibration), each quantized tensor -- an activation with its QuantizeLinear parameters,
or a node's weights as the QDQ model stores them -- is a *unit*. One extra ONNX graph is built from
the float model in which every unit has a switch: ``Where(switch[i] > 0.5, QDQ(T), T)`` (weights:
the dequantized INT8 copy or the float one). onnxruntime then runs the float model with exactly one
unit quantized at a time on a few eval samples, so each unit's sensitivity is the relative error it
alone causes on the model's outputs vs fp32 (``|y_i - y|^2 / |y|^2``), with no re-quantization and
no re-calibration (about N forward passes of the subset, not N quantize runs). The switches go into
one graph per group of ``GROUP`` units (the rest float), since a graph computes every switched
quantize-dequantize on every run: ~4x faster on PP-OCRv4's recognizer's 552 units.
``Where`` rather than arithmetic mixing keeps infinities (attention masks) intact.

Reverting a unit to float means keeping in float every quantizable node that makes onnxruntime
quantize it: an activation's producer and its consumers (a QDQ graph quantizes a tensor when either
side is quantized), a weight's node. ``Unit.nodes`` is that group; the accuracy-aware pass keeps the
groups of the most sensitive units in float, fewest first (``nodes_to_exclude``).

The cheaper proxy of onnxruntime's ``qdq_loss_debug`` (SQNR of each tensor in the quantized model vs
float) measures accumulated error where it shows up, not where it comes from, and an SQNR over a
tensor is dominated by its largest values (a -3.4e38 mask hides that every attention score rounds to
zero), so edgekit measures each unit's own effect on the outputs instead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..inputs.source import model_batch, run_batched
from ..inputs.stateful import run as run_stream
from ..timeline import budget_exceeded, check_deadline, seconds_left

MIN_SAMPLES = 4  # below this a tensor's error is noise: the step is not started
GROUP = 32  # units switched in one model: each run computes its own group's quantize-dequantize nodes only

SWITCH = "edgekit_sensitivity_switch"
_Q_IN = "_QuantizeLinear_Input"
_W_Q = "_quantized"


@dataclass
class Unit:
    tensor: str
    kind: str  # "activation" | "weights"
    nodes: tuple[str, ...]  # quantizable nodes to keep in float to keep this tensor in float
    error: float = 0.0  # relative output error with only this unit quantized (0 = none)

    def as_dict(self) -> dict:
        return {"tensor": self.tensor, "kind": self.kind, "nodes": list(self.nodes),
                "relative_output_error": float(f"{self.error:.4g}")}


@dataclass
class Sensitivity:
    units: list[Unit]  # most sensitive first
    samples: int
    seconds: float
    all_quantized_error: float  # every unit on: should be close to the full-INT8 model's error
    skipped: list[str] = field(default_factory=list)  # quantized tensors the float graph does not have


def _unit_params(qdq_model, float_names: set[str], float_inits: dict):
    """(activation name -> (scale, zero point)), (weight name -> dequantized float array) of a QDQ model."""
    from onnx import numpy_helper

    inits = {i.name: i for i in qdq_model.graph.initializer}
    acts: dict[str, tuple] = {}
    weights: dict[str, np.ndarray] = {}
    skipped: list[str] = []
    for nd in qdq_model.graph.node:
        if nd.op_type == "QuantizeLinear" and nd.input[0] not in inits:
            name = nd.input[0][: -len(_Q_IN)] if nd.input[0].endswith(_Q_IN) else nd.input[0]
            if name not in float_names:
                skipped.append(name)
                continue
            if len(nd.input) < 2 or nd.input[1] not in inits:
                continue
            zp = inits[nd.input[2]] if len(nd.input) > 2 and nd.input[2] in inits else None
            acts.setdefault(name, (inits[nd.input[1]], zp))
        elif nd.op_type == "DequantizeLinear" and nd.input[0] in inits and nd.input[0].endswith(_W_Q):
            name = nd.input[0][: -len(_W_Q)]
            if name not in float_inits or float_inits[name].data_type != 1:  # float32 weights only
                continue
            q = numpy_helper.to_array(inits[nd.input[0]]).astype(np.float64)
            scale = numpy_helper.to_array(inits[nd.input[1]]).astype(np.float64)
            zp = (numpy_helper.to_array(inits[nd.input[2]]).astype(np.float64)
                  if len(nd.input) > 2 and nd.input[2] in inits else np.zeros_like(scale))
            axis = next((a.i for a in nd.attribute if a.name == "axis"), 1)
            if scale.size > 1:
                shape = [1] * q.ndim
                shape[axis] = -1
                scale, zp = scale.reshape(shape), zp.reshape(shape)
            deq = ((q - zp) * scale).astype(np.float32)
            if deq.shape == tuple(float_inits[name].dims):
                weights[name] = deq
    return acts, weights, skipped


def build_switch_model(float_path: Path, qdq_path: Path, candidates: set[str], out: Path,
                       span: tuple[int, int] | None = None):
    """Write the float model with a switch per unit to ``out``; returns (units, skipped). ``span``
    (start, stop): only the units numbered start..stop-1 get a switch (switch index ``i - start``),
    the others stay float: a run pays for the quantize-dequantize nodes of its own units only."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    fm = onnx.load(str(float_path))
    qm = onnx.load(str(qdq_path))
    g = fm.graph
    float_inits = {i.name: i for i in g.initializer}
    producer = {o: nd for nd in g.node for o in nd.output}
    consumers: dict[str, list] = {}
    for nd in g.node:
        for i in nd.input:
            consumers.setdefault(i, []).append(nd)
    vtype = {v.name: v.type.tensor_type.elem_type for v in (*g.input, *g.value_info, *g.output)}
    float_names = set(producer) | {i.name for i in g.input}
    acts, weights, skipped = _unit_params(qm, float_names, float_inits)

    units: list[Unit] = []
    head: list = []  # nodes that only need initializers/graph inputs: first
    after: dict[str, list] = {}  # producer node name -> mix nodes of its outputs
    renames: dict[str, str] = {}  # producer output -> its raw name

    def group(names) -> tuple[str, ...]:
        return tuple(sorted({n.name for n in names if n is not None and n.name in candidates}))

    start, stop = span if span is not None else (0, 1 << 62)
    seen = 0  # units numbered so far, built or not

    def take() -> bool:
        nonlocal seen
        seen += 1
        return start <= seen - 1 < stop

    def switch(idx: int, tag: str) -> str:
        k = f"{tag}__sw_idx"
        g.initializer.append(numpy_helper.from_array(np.array(idx, dtype=np.int64), k))
        return k

    for name, (scale, zp) in acts.items():
        if vtype.get(name, 1) != TensorProto.FLOAT:
            continue
        nodes = group([producer.get(name), *consumers.get(name, [])])
        if not nodes or not take():
            continue
        i = len(units)
        units.append(Unit(name, "activation", nodes))
        tag = f"edgekit_u{i}"
        s = onnx.TensorProto()
        s.CopyFrom(scale)
        s.name = f"{tag}__scale"
        g.initializer.append(s)
        q_in = [f"{tag}__scale"]
        if zp is not None:
            z = onnx.TensorProto()
            z.CopyFrom(zp)
            z.name = f"{tag}__zp"
            g.initializer.append(z)
            q_in.append(z.name)
        raw = name if name not in producer else f"{name}__fp32"
        mixed = f"{tag}__mixed" if name not in producer else name
        nodes_ = [
            helper.make_node("QuantizeLinear", [raw, *q_in], [f"{tag}__q"], name=f"{tag}__Q"),
            helper.make_node("DequantizeLinear", [f"{tag}__q", *q_in], [f"{tag}__dq"], name=f"{tag}__DQ"),
            helper.make_node("Gather", [SWITCH, switch(i, tag)], [f"{tag}__s"], name=f"{tag}__G"),
            helper.make_node("Greater", [f"{tag}__s", "edgekit_half"], [f"{tag}__on"], name=f"{tag}__GT"),
            helper.make_node("Where", [f"{tag}__on", f"{tag}__dq", raw], [mixed], name=f"{tag}__W"),
        ]
        if name in producer:
            renames[name] = raw
            after.setdefault(producer[name].name, []).extend(nodes_)
        else:  # a graph input: its consumers read the mixed copy
            head.extend(nodes_)
            for c in consumers.get(name, []):
                for j, inp in enumerate(c.input):
                    if inp == name:
                        c.input[j] = mixed
    by_node: dict[str, list[str]] = {}
    for w in weights:
        for c in consumers.get(w, []):
            if c.name in candidates:
                by_node.setdefault(c.name, []).append(w)
    for node_name, ws in by_node.items():
        if not take():
            continue
        i = len(units)
        units.append(Unit(",".join(ws), "weights", (node_name,)))
        tag = f"edgekit_u{i}"
        sw = switch(i, tag)
        head.append(helper.make_node("Gather", [SWITCH, sw], [f"{tag}__s"], name=f"{tag}__G"))
        head.append(helper.make_node("Greater", [f"{tag}__s", "edgekit_half"], [f"{tag}__on"], name=f"{tag}__GT"))
        for k, w in enumerate(ws):
            g.initializer.append(numpy_helper.from_array(weights[w], f"{tag}__w{k}"))
            head.append(helper.make_node("Where", [f"{tag}__on", f"{tag}__w{k}", w], [f"{tag}__mixed{k}"],
                                         name=f"{tag}__W{k}"))
            node = next(n for n in g.node if n.name == node_name)
            for j, inp in enumerate(node.input):
                if inp == w:
                    node.input[j] = f"{tag}__mixed{k}"
    g.initializer.append(numpy_helper.from_array(np.array(0.5, dtype=np.float32), "edgekit_half"))
    for nd in g.node:
        for j, o in enumerate(nd.output):
            if o in renames:
                nd.output[j] = renames[o]
    ordered = list(head)
    for nd in g.node:
        ordered.append(nd)
        ordered.extend(after.get(nd.name, []))
    del g.node[:]
    g.node.extend(ordered)
    g.input.append(helper.make_tensor_value_info(SWITCH, TensorProto.FLOAT, [len(units)]))
    onnx.save(fm, str(out))
    return units, skipped


def measure(float_path: Path, qdq_path: Path, xs: list[np.ndarray], candidates: set[str], workdir: Path,
            samples: int = 32, output_idx: list[int] | None = None, stream=None) -> Sensitivity:
    """Each unit's relative output error on the first ``samples`` samples of ``xs``, most sensitive first.
    ``stream`` (edgekit/inputs/stateful.py): the constants fed beside the data, the state carried from sample to
    sample through the switched model itself (as the quantized model carries its own in use).

    The units are switched in groups of ``GROUP``, one model per group, each unit against its own
    group's all-off run: a model with a switch on every unit computes every quantize-dequantize on
    every run (PP-OCRv4's recognizer, 552 units: 118 ms a sample against 25 ms in float)."""
    import onnxruntime as ort


    started = time.perf_counter()
    path = workdir / "sensitivity.onnx"
    units, skipped = build_switch_model(Path(float_path), Path(qdq_path), candidates, path)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3

    def session(p: Path):
        return ort.InferenceSession(str(p), sess_options=so, providers=["CPUExecutionProvider"])

    sess = session(path)
    ins = [i for i in sess.get_inputs() if i.name != SWITCH]
    batch = model_batch([tuple(d if isinstance(d, int) else None for d in i.shape) for i in ins])
    xs = [np.asarray(x[:samples]) for x in xs]
    dtypes = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32,
              "tensor(bool)": np.bool_, "tensor(float16)": np.float16}

    order = list(stream.inputs) if stream is not None else [i.name for i in ins]  # what a feed holds
    types = {i.name: i.type for i in ins}

    def run(sess, sw: np.ndarray | None) -> list[np.ndarray]:  # sw None: the float model
        def once(feed):
            f = {n: np.ascontiguousarray(np.asarray(x).astype(dtypes.get(types[n], np.float32), copy=False))
                 for n, x in zip(order, feed)}
            if sw is not None:
                f[SWITCH] = sw
            return sess.run(None, f)
        outs = run_stream(once, xs, stream) if stream is not None else run_batched(once, xs, batch)
        pick = output_idx if output_idx is not None else range(len(outs))
        return [np.asarray(outs[k], dtype=np.float64) for k in pick if np.issubdtype(np.asarray(outs[k]).dtype, np.floating)]

    def rel_err(outs, ref) -> float:
        num = sum(float(np.nansum((o - r) ** 2)) for o, r in zip(outs, ref))
        den = sum(float(np.nansum(r ** 2)) for r in ref)
        bad = any(not np.all(np.isfinite(o)) for o in outs)
        return float("inf") if bad else num / max(den, 1e-30)

    k = len(units)
    spans = [(a, min(a + GROUP, k)) for a in range(0, k, GROUP)]
    group_path = workdir / "sensitivity-group.onnx"
    left = seconds_left()
    if spans and left is not None:  # fewer samples when a run per unit cannot fit the time left
        # A group's run costs the float model's plus its share of the switched graph's extra cost (the
        # switched weights of a Conv cost most: onnxruntime cannot pre-pack them), timed on the float
        # model and the graph with every switch; a group's build, timed on the first.
        t0 = time.perf_counter()
        run(session(Path(float_path)), None)
        t1 = time.perf_counter()
        run(sess, np.zeros(k, dtype=np.float32))
        t2 = time.perf_counter()
        build_switch_model(Path(float_path), Path(qdq_path), candidates, group_path, spans[0])
        session(group_path)
        build = time.perf_counter() - t2
        n = max(1, len(xs[0]) if xs else 1)
        float_s, full_s = (t1 - t0) / n, (t2 - t1) / n
        per_sample = float_s + min(GROUP, k) / k * max(0.0, full_s - float_s)
        # a run per unit, a reference run per group, the full graph's all-on and all-off runs; the builds
        runs, builds = k + len(spans), len(spans) * build
        fit = int((0.5 * left - builds) / (runs * per_sample + 2 * full_s)) if per_sample > 0 else len(xs[0])
        if fit < min(MIN_SAMPLES, len(xs[0]) if xs else 0):
            raise budget_exceeded(f"layer sensitivity not started: {k} quantized tensors x {MIN_SAMPLES} samples "
                                  f"would take ~{builds + (runs * per_sample + 2 * full_s) * MIN_SAMPLES:.0f} s, "
                                  f"and it may take half of the {left:.0f} s left (the ladder's trials and the "
                                  "search's device stages need the rest)")
        if xs and fit < len(xs[0]):
            xs = [x[:fit] for x in xs]
    for gi, (a, b) in enumerate(spans):
        check_deadline(f"layer sensitivity, tensor {a + 1} of {k}")
        group, _ = build_switch_model(Path(float_path), Path(qdq_path), candidates, group_path, (a, b))
        if [u.tensor for u in group] != [u.tensor for u in units[a:b]]:  # the numbering is deterministic
            raise RuntimeError(f"layer sensitivity: group {gi} switches other tensors than its units")
        gsess = session(group_path)
        ref = run(gsess, np.zeros(b - a, dtype=np.float32))
        for i in range(a, b):
            check_deadline(f"layer sensitivity, tensor {i + 1} of {k}")  # one run per tensor: hours on a large model
            sw = np.zeros(b - a, dtype=np.float32)
            sw[i - a] = 1.0
            units[i].error = rel_err(run(gsess, sw), ref)
    total = rel_err(run(sess, np.ones(k, dtype=np.float32)), run(sess, np.zeros(k, dtype=np.float32))) if k else 0.0
    path.unlink(missing_ok=True)
    group_path.unlink(missing_ok=True)
    units.sort(key=lambda u: u.error, reverse=True)
    return Sensitivity(units=units, samples=len(xs[0]) if xs else 0, seconds=round(time.perf_counter() - started, 3),
                       all_quantized_error=total, skipped=sorted(set(skipped)))
