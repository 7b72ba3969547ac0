"""A microcontroller's measurement, with no board: one full-integer INT8 .tflite through TFLite Micro's kernels on
this host (the arena it needs, its outputs on the eval set) and through LiteRT (XNNPACK / its reference kernels),
the two compared, and the fit against the part. The gate judges the TFLM outputs; LiteRT's are reported beside
them, with their disagreement: TFLM's reference kernels and LiteRT's round differently."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..artifact import IOSpec
from ..convert.tflite.host_harness import run_tflite_all
from ..errors import BadInputError
from ..inputs.targets import Microcontroller
from .fit import Fit, judge_fit
from .interpreter import Arena, run_tflm, smallest_arena
from .kernels import SOURCE, tflm_kernels
from .tflite_graph import Graph, read_graph

# TFLM vs LiteRT on the same int8 file: an output may differ by this many of its quantization steps (the kernels'
# rounding of requantization differs: TFLM's reference kernels vs XNNPACK); more is a kernel disagreement
PARITY_STEPS = 2

LATENCY_REASON = ("no board attached: TFLite Micro ran on this host (x86-64), so its timing is not the part's; "
                  "the deploy makes no estimate (micro.macs counts the work; benchmarks/micro_mlperf_tiny.py fits "
                  "an estimate on published MLPerf Tiny figures and states its error)")


@dataclass
class MicroMeasurement:
    graph: Graph
    arena: Arena
    fit: Fit
    tflm: list[np.ndarray]  # every output through TFLM, float (dequantized), the user's layout
    litert: list[np.ndarray]  # the same through LiteRT
    disagreement: dict[str, dict[str, Any]]  # per output: max_abs_err, in quantization steps, top-1 agreement
    within_tolerance: bool


def refuse_file_ops(graph: Graph) -> None:
    """The converted file itself checked op by op against TFLM's kernels (the ONNX check's lowering table is
    edgekit's; this is the file)."""
    missing = [(k, op) for k, op in enumerate(graph.ops) if op not in tflm_kernels()]
    if missing:
        where = ", ".join(f"op {k} {op}" for k, op in missing[:8])
        raise BadInputError(f"the converted file has op(s) TFLite Micro has no kernel for ({SOURCE}): {where}",
                            hint="replace the layers these come from, or target a runtime that has them")


def disagreement(tflm: list[np.ndarray], litert: list[np.ndarray], io: IOSpec) -> tuple[dict[str, dict[str, Any]],
                                                                                        bool]:
    out: dict[str, dict[str, Any]] = {}
    ok = True
    for spec, a, b in zip(io.outputs, tflm, litert):
        err = float(np.max(np.abs(a - b))) if a.size else 0.0
        steps = err / spec.scale if spec.scale else None
        row: dict[str, Any] = {"max_abs_err": err, "max_steps": steps, "limit_steps": PARITY_STEPS,
                               "exact_share": float(np.mean(a == b)) if a.size else 1.0}
        if a.ndim >= 2 and a.shape[-1] > 1:
            row["top1_agreement"] = float(np.mean(np.argmax(a, -1) == np.argmax(b, -1)))
        row["passed"] = steps is None and err < 1e-4 or steps is not None and steps <= PARITY_STEPS + 1e-6
        ok = ok and bool(row["passed"])
        out[spec.name] = row
    return out, ok


def measure_micro(tflite: Path, io: IOSpec, part: Microcontroller, xs: list[np.ndarray]) -> MicroMeasurement:
    """Fit, TFLM outputs and LiteRT outputs of one INT8 file on ``xs`` (the user's layout, float)."""
    data = Path(tflite).read_bytes()
    graph = read_graph(data)
    refuse_file_ops(graph)
    arena = smallest_arena(Path(tflite))
    fit = judge_fit(part, arena, len(data), graph.peak, graph.largest_weights)
    tflm = run_tflm(Path(tflite), arena.bytes, io, xs)
    litert = run_tflite_all(Path(tflite), io, xs)
    table, ok = disagreement(tflm, litert, io)
    return MicroMeasurement(graph=graph, arena=arena, fit=fit, tflm=tflm, litert=litert, disagreement=table,
                            within_tolerance=ok)
