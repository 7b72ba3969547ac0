"""The language-model variants edgekit builds and races: one row each (name, runtime, precision), the
runtime's float file first (the baseline), then its INT8 files (onnxruntime: int8 weights computed in int8;
ExecuTorch: int8 weights with int8 activations per token (8da8w), and int8 weight-only). A row is built when its runtime's
exporter imports on this host and the target runs the runtime (its ``runtimes``; on the local target, what is
installed here, since this host is the device)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..artifact import Artifact
from ..targets import TargetSpec
from .source import LMSource

Build = Callable[[LMSource, Path, int, dict[str, Artifact]], Artifact]


def _ort_fp32(src: LMSource, out: Path, context: int, built: dict[str, Artifact]) -> Artifact:
    from .export_onnx import export_onnx

    return export_onnx(src, out / "ort-fp32.onnx", context=context)


def _ort_int8(src: LMSource, out: Path, context: int, built: dict[str, Artifact]) -> Artifact:
    from .export_onnx import export_onnx, quantize_onnx_int8

    base = built.get("ort-fp32") or export_onnx(src, out / "ort-fp32.onnx", context=context)
    return quantize_onnx_int8(base, out / "ort-int8.onnx")


def _et(precision: str) -> Build:
    def build(src: LMSource, out: Path, context: int, built: dict[str, Artifact]) -> Artifact:
        from .export_executorch import export_executorch

        return export_executorch(src, out / f"et-{precision}.pte", context=context, precision=precision)

    return build


@dataclass(frozen=True)
class LMCandidate:
    name: str
    runtime: str
    precision: str
    build: Build
    exporter: str  # the host package the export needs


CANDIDATES = (
    LMCandidate("ort-fp32", "onnxruntime", "fp32", _ort_fp32, "onnxruntime"),
    LMCandidate("ort-int8", "onnxruntime", "int8", _ort_int8, "onnxruntime"),
    LMCandidate("et-fp32", "executorch", "fp32", _et("fp32"), "executorch"),
    LMCandidate("et-8da8w", "executorch", "8da8w", _et("8da8w"), "executorch"),
    LMCandidate("et-int8", "executorch", "int8", _et("int8"), "executorch"),
)
BASELINE = "ort-fp32"


def candidates_for(target: TargetSpec) -> tuple[list[LMCandidate], dict[str, str]]:
    """(the rows to build, {row: why not} for the others)."""
    chosen, skipped = [], {}
    for c in CANDIDATES:
        runs_here = c.runtime in target.runtimes or (
            target.transport == "local" and importlib.util.find_spec(c.runtime) is not None)
        if not runs_here:
            skipped[c.name] = f"target {target.name} does not run {c.runtime} (its runtimes: {', '.join(target.runtimes)})"
        elif importlib.util.find_spec(c.exporter) is None:
            skipped[c.name] = f"{c.exporter} is not installed on this host (pip install 'edgekit[{c.exporter}]')"
        else:
            chosen.append(c)
    return chosen, skipped
