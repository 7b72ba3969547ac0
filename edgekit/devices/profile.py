"""Per-op profiles from the device runtime's own profiler, mapped back to the PyTorch modules.

The agent answers a profiling request (``DeviceSession.profile_doc``) with its ``op_profile``
document: kernel time per executed node, from onnxruntime's profiler or ExecuTorch's ETDump (LiteRT's
Python API has none: the document then says so, with no figures). :func:`op_profile` turns it into an
:class:`OpProfile`: ops by time per inference, each with the PyTorch module it came from. The
torch.export -> ONNX (dynamo) exporter records that in every node's ``metadata_props``
(``pkg.torch.onnx.name_scopes``: ``['', 'blocks', 'blocks.0', 'blocks.0.conv', 'conv2d_1']``, the
last entry being the FX node); onnxruntime's own rewrites keep a trace of the original name (a fused
node ``fused node_linear``, a layout-transformed ``relu_1_nchwc`` named after its output tensor, a
duplicated ``..._DequantizeLinear/duplicated``), and its quantizer names the nodes it adds after the
tensor they quantize (``relu_QuantizeLinear``, ``blocks.0.conv.weight_DequantizeLinear``) or the node
they replace (``node_conv2d_quant``): each is traced back to the float node or tensor, and so to
its module. :func:`profile_variants` profiles the chosen variants in a device session; comparing two profiles is
``report/profile_diff.py``'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..convert.onnx_modules import ROOT as _ROOT
from ..convert.onnx_modules import module_of as _module_of
from ..report.model import OpProfile, OpTime, OpTypeTime
from ..report.profile_diff import COMPUTE, QDQ, family, is_slower

if TYPE_CHECKING:
    from onnx import GraphProto, NodeProto

    from .session import DeviceSession, Measured, RunSettings

DEFAULT_RUNS = 20
# what onnxruntime and its quantizer append to the name of the node or tensor they start from
_SUFFIXES = re.compile(r"(?:/duplicated|_token_\d+|_nchwc|_quant|_QuantizeLinear|_DequantizeLinear|"
                       r"_output_\d+|_output|_fused)$")
_WEIGHT_SUFFIXES = re.compile(r"(?:_DequantizeLinear_Output|_DequantizeLinear|_quantized|_output_\d+)$")


def _weight_module(tensor: str) -> str | None:
    """``features.0`` for a weight tensor ``features.0.weight`` (also once quantized:
    ``features.0.weight_quantized``, ``features.0.weight_DequantizeLinear_Output``)."""
    t = _WEIGHT_SUFFIXES.sub("", tensor)
    return t[: -len(".weight")] if t.endswith(".weight") and len(t) > len(".weight") else None


# --------------------------------------------------------------------------- nodes -> modules
def _from_quantizer(n: NodeProto) -> bool:
    """A node onnxruntime's quantizer adds or rewrites: Q/DQ, or an integer kernel (QOperator)."""
    t = n.op_type or ""
    return t in QDQ or t.startswith(("QLinear", "QGemm", "DynamicQuantize")) or "Integer" in t


class ModuleIndex:
    """An ONNX graph's nodes traced to PyTorch modules. A node the exporter annotated has its own
    module; one it did not (a quantizer's Q/DQ, QOperator node) is traced by its name (the node or
    tensor it was named after), by a weight it reads (``stem.weight_quantized`` -> ``stem``), then
    by its data input's producer (an activation's quantization belongs where it was produced; the
    model's input: the model's own forward), then by its consumer (a weight's DequantizeLinear)."""

    def __init__(self, graph: GraphProto):
        self.nodes: dict[str, NodeProto] = {n.name: n for n in graph.node}
        self.producer: dict[str, NodeProto] = {o: n for n in graph.node for o in n.output}
        self.consumers: dict[str, list[NodeProto]] = {}
        for n in graph.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.graph_inputs = {i.name for i in graph.input} - {t.name for t in graph.initializer}
        self.own = {n.name: m for n in graph.node if (m := _module_of(n)) is not None}
        for n in graph.node:  # a Conv/Gemm belongs to the module whose weight it reads (the exporter
            # labels a Conv with a BatchNorm folded into it as the BatchNorm)
            wm = _weight_module(n.input[1]) if family(n.op_type) in COMPUTE and len(n.input) > 1 else None
            if wm is not None:
                mine = self.own.get(n.name)
                self.own[n.name] = (wm, mine[1] if mine and mine[0] == wm else None)
        self.modules = {m for m, _ in self.own.values()}
        self.classes = {m: c for m, c in self.own.values() if c}
        for mod in list(self.modules):
            parts = mod.split(".")
            self.modules.update(".".join(parts[:k]) for k in range(1, len(parts)))
        self._memo: dict[tuple[str, str], tuple[str, str | None] | None] = {}

    def __bool__(self) -> bool:
        return bool(self.own)

    def _by_weight(self, names: Iterable[str]) -> tuple[str, str | None] | None:
        for name in names:
            head = name
            while "." in head:
                head = head.rsplit(".", 1)[0]
                if head in self.modules:
                    return head, self.classes.get(head)
        return None

    def _node_for(self, name: str) -> NodeProto | None:
        for c in _candidates(name):
            if c in self.nodes:
                return self.nodes[c]
            if c in self.producer:
                return self.producer[c]
        return None

    def _resolve(self, n: NodeProto, way: str = "any") -> tuple[str, str | None] | None:
        key = (n.name, way)
        if key in self._memo:
            return self._memo[key]
        self._memo[key] = None  # a cycle (not in a valid graph) resolves to nothing
        m = self.own.get(n.name)
        if m is None and way == "any":
            named = self._node_for(_SUFFIXES.sub("", n.name))
            if named is not None and named is not n and named.name in self.own:
                m = self.own[named.name]
        if m is None and way == "any":
            m = self._by_weight(n.input)
        if m is None and not _from_quantizer(n):
            pass  # a node neither the exporter nor the quantizer made (added by hand): not traced
        elif m is None and way in ("any", "up") and n.input:
            first = n.input[0]
            p = self.producer.get(first)
            m = self._resolve(p, "up") if p is not None else ((_ROOT, None) if first in self.graph_inputs else None)
        if m is None and _from_quantizer(n) and way in ("any", "down") and n.output:
            for c in self.consumers.get(n.output[0], []):
                m = self._resolve(c, "down")
                if m is not None:
                    break
        self._memo[key] = m
        return m

    def trace(self, name: str, op_type: str | None = None) -> tuple[str, str | None] | None:
        """(module, class) of a node as the runtime names it (``relu_1_nchwc``, ``fused node_linear``,
        ``x_DequantizeLinear/duplicated``), or None. A fused node named after its last op's output
        (Conv+Relu as ``relu_nchwc``) is traced to the op of its own type a few producers up."""
        n = self._node_for(name)
        if n is None:
            return self._by_weight(_candidates(name))
        if op_type and family(n.op_type) != family(op_type):
            up: NodeProto | None = n
            for _ in range(3):
                up = self.producer.get(up.input[0]) if up is not None and up.input else None
                if up is None:
                    break
                if family(up.op_type) == family(op_type):
                    n = up
                    break
        return self._resolve(n)


def module_index(onnx_path: str | Path) -> ModuleIndex:
    import onnx

    return ModuleIndex(onnx.load(str(onnx_path), load_external_data=False).graph)


def _candidates(name: str) -> Iterator[str]:
    n = name[len("fused "):] if name.startswith("fused ") else name
    while True:
        yield n
        shorter = _SUFFIXES.sub("", n)
        if shorter == n or not shorter:
            return
        n = shorter


# --------------------------------------------------------------------------- the profile
def _ir_node(name: str, index: "ModuleIndex") -> str:
    """An OpenVINO layer's name as the ONNX node (or tensor) it came from: the IR keeps the ONNX node names
    and appends its own steps (``node_Conv_24/WithoutBiases``); a layout Reorder is named after the layer it
    feeds (``x_f32_abcd_bf16_acdb_node_Conv_24/WithoutBiases``). The name itself when none is found."""
    head = name.split("/", 1)[0]
    parts = head.split("_")
    for k in range(len(parts)):  # the longest tail that the ONNX graph names
        tail = "_".join(parts[k:])
        if tail in index.nodes or tail in index.producer:
            return tail
    return name


def op_profile(doc: dict[str, Any] | None, artifact: Any = None, onnx_graph: Any = None) -> OpProfile:
    """The agent's ``op_profile`` document as an :class:`OpProfile`, each ONNX node traced to its
    PyTorch module through ``artifact``'s graph (an Artifact, a path, or None); an OpenVINO IR's layers
    through ``onnx_graph``, the ONNX model it was converted from (its layers keep the ONNX node names)."""
    if not doc:
        return OpProfile(reason="the agent returned no per-op profile (an agent older than the profile request?)")
    if not doc.get("source"):
        return OpProfile(reason=doc.get("reason") or "the runtime gave no per-op profile")
    runs = max(int(doc.get("runs") or 0), 1)
    total_us = doc.get("total_us")
    total_ms = float(total_us) / 1000.0 if total_us is not None else None
    index, mapping = _index_for(onnx_graph if doc["source"] == "openvino" and onnx_graph is not None else artifact,
                                doc["source"])
    if index is not None and doc["source"] == "openvino":
        mapping = ("OpenVINO's layer names, which keep the ONNX node names of the model the IR was converted from "
                   "(its '/WithoutBiases'-style steps and layout Reorders traced to the layer they belong to); "
                   + mapping)
    ops: list[OpTime] = []
    for o in doc.get("ops") or []:
        t_ms = float(o.get("total_us") or 0.0) / 1000.0
        calls = int(o.get("calls") or 0)
        med = o.get("median_us")
        per_run = float(med) * calls / runs / 1000.0 if med is not None else t_ms / runs
        if index and doc["source"] == "openvino":  # the plugin's op types are not ONNX's (Convolution, Reorder)
            m = index.trace(_ir_node(o["node"], index))
        else:
            m = index.trace(o["node"], o.get("op_type")) if index else None
        ops.append(OpTime(node=o["node"], op_type=o.get("op_type"), module=m[0] if m else None,
                          module_class=m[1] if m else None, provider=o.get("provider"), calls=calls,
                          total_ms=round(t_ms, 6), mean_ms=round(t_ms / runs, 6), ms=round(per_run, 6),
                          share=round(t_ms / total_ms, 4) if total_ms else None))
    ops.sort(key=lambda o: -o.ms)
    med_run = doc.get("median_run_us")
    mapped = [o for o in ops if o.module is not None]
    kernel_ms = sum(o.ms for o in ops)
    return OpProfile(source=doc["source"], runs=runs, total_ms=round(total_ms, 6) if total_ms is not None else None,
                     mean_run_ms=round(total_ms / runs, 6) if total_ms is not None else None,
                     median_run_ms=round(float(med_run) / 1000.0, 6) if med_run is not None else None, ops=ops,
                     by_op_type=_by_op_type(ops, runs, total_ms), mapping=mapping, mapped_nodes=len(mapped),
                     mapped_share=round(sum(o.ms for o in mapped) / kernel_ms, 4) if kernel_ms else None)


def _index_for(artifact: Any, source: str) -> tuple["ModuleIndex | None", str]:
    path = getattr(artifact, "path", artifact)
    if path is None:
        return None, "no model file given: nodes are not traced to modules"
    path = Path(path)
    if path.suffix != ".onnx":
        if source == "executorch":
            return None, ("ExecuTorch names delegated ops by the delegate's kernels (XNNPACK); tracing them to "
                        "modules needs an ETRecord, which the export does not keep")
        return None, f"nodes of a {path.suffix} model are not traced to modules"
    try:
        index = module_index(path)
    except Exception as exc:  # an unreadable graph leaves the profile unmapped, with the reason
        return None, f"the ONNX graph could not be read for module names: {type(exc).__name__}: {exc}"
    if not index:
        return None, "the ONNX graph carries no exporter metadata (not exported by torch.onnx dynamo)"
    return index, ("ONNX node metadata (pkg.torch.onnx.name_scopes) of the torch.export -> ONNX export; "
                   "onnxruntime's fused/rewritten and the quantizer's nodes traced by name")


def _by_op_type(ops: list[OpTime], runs: int, total_ms: float | None) -> list[OpTypeTime]:
    agg: dict[str, tuple[int, int, float, float]] = {}  # op type -> (nodes, calls, total ms, ms per run)
    for o in ops:
        n, c, t, m = agg.get(o.op_type or "?", (0, 0, 0.0, 0.0))
        agg[o.op_type or "?"] = (n + 1, c + o.calls, t + o.total_ms, m + o.ms)
    rows = [OpTypeTime(op_type=k, nodes=n, calls=c, mean_ms=round(t / runs, 6), ms=round(m, 6),
                       share=round(t / total_ms, 4) if total_ms else None) for k, (n, c, t, m) in agg.items()]
    return sorted(rows, key=lambda r: -r.ms)


# --------------------------------------------------------------------------- on the device
def profiled_names(measured: dict[str, "Measured"], baseline: str, every: bool = False, also: Iterable[str] = (),
                   slower: bool = True) -> list[str]:
    """Which variants to profile: ``also`` (e.g. a search's selection) and, with ``slower``, the
    ones slower than the baseline, with the baseline to compare them with; ``every``: all of them.
    Empty when there is nothing to compare (a profiling run costs device time)."""
    base = measured[baseline].result if baseline in measured else None
    also = set(also)
    names = [n for n, m in measured.items()
             if every or (n != baseline and (n in also or (slower and is_slower(m.result, base))))]
    return names if every else ([baseline, *names] if names else [])


def profile_variants(session: "DeviceSession", measured: dict[str, "Measured"], names: Iterable[str],
                     settings: "RunSettings", per_variant: dict[str, "RunSettings"] | None = None,
                     runs: int = DEFAULT_RUNS) -> dict[str, OpProfile]:
    """Profile ``names`` on the device (a separate short run each, never the timed figures), each
    with its own measurement settings (``per_variant``, e.g. a tuned runtime option, else
    ``settings``), and set each one's ``result.op_profile``."""
    out: dict[str, OpProfile] = {}
    for n in [n for n in dict.fromkeys(names) if n in measured]:
        m = measured[n]
        session.progress(f"profiling {n} per op on the device ({runs} runs)")
        s = (per_variant or {}).get(n, settings)
        out[n] = op_profile(session.profile_doc(n, m.artifact, s, runs=runs), m.artifact,
                            _converted_from(m.artifact, measured))
        m.result.op_profile = out[n]
    return out


def _converted_from(art: Any, measured: dict[str, "Measured"]) -> Any:
    """The measured ONNX artifact ``art``'s last conversion started from (its lineage's input sha256), or None."""
    last = art.lineage[-1] if getattr(art, "lineage", None) else None
    want = last.input_sha256 if last is not None and last.kind == "convert" else None
    return next((m.artifact for m in measured.values() if want and m.artifact.sha256 == want
                 and m.artifact.path.suffix == ".onnx"), None)


__all__ = ["op_profile", "profile_variants", "profiled_names", "module_index", "ModuleIndex"]
