"""The language-model variants edgekit builds and races: one row each (name, runtime, precision), the
runtime's float file first (the baseline), then its INT8 files (onnxruntime: int8 weights computed in int8;
ExecuTorch: int8 weights with int8 activations per token (8da8w), and int8 weight-only), then its INT4 files
(``MatMulNBits`` 4-bit blocks of 32; ExecuTorch 8da4w, groups of 32), each from a layer plan with its account
and the recovery ladder (``int4_ladder``).
A row is built when its runtime's exporter imports on this host and the target runs the runtime (its
``runtimes``; on the local target, what is installed here, since this host is the device)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..artifact import Artifact
from ..targets import TargetSpec
from .export_executorch import export_executorch
from .export_onnx import export_onnx, quantize_onnx_int8, quantize_onnx_nbits
from .int4_ladder import Calibration, build_int4
from .layer_plan import plan_int4
from .source import LMSource

Build = Callable[[LMSource, Path, int, dict[str, Artifact], Calibration], Artifact]
GROUP = 32  # int4 weights a scale: ExecuTorch's export_llm default for 8da4w, MatMulNBits' usual block


def _ort_base(src: LMSource, out: Path, context: int, built: dict[str, Artifact]) -> Artifact:
    return built.get("ort-fp32") or export_onnx(src, out / "ort-fp32.onnx", context=context)


def _ort_fp32(src: LMSource, out: Path, context: int, built: dict[str, Artifact], cal: Calibration) -> Artifact:
    return export_onnx(src, out / "ort-fp32.onnx", context=context)


def _ort_int8(src: LMSource, out: Path, context: int, built: dict[str, Artifact], cal: Calibration) -> Artifact:
    return quantize_onnx_int8(_ort_base(src, out, context, built), out / "ort-int8.onnx")


def _ort_int4(src: LMSource, out: Path, context: int, built: dict[str, Artifact], cal: Calibration) -> Artifact:
    base = _ort_base(src, out, context, built)

    def plan_for(keep: set[str], notes: dict[str, str]) -> list:
        return plan_int4(src.model, group=GROUP, head=cal.head, keep_int8=keep, pads=True, int8_group=GROUP,
                         ladder_note=notes)

    def make(plan: list, acc: dict) -> Artifact:
        return quantize_onnx_nbits(base, out / "ort-int4.onnx", int4={c.name for c in plan if c.scheme == "int4"},
                                   int8={c.name for c in plan if c.scheme == "int8"}, block_size=GROUP,
                                   plan_account=acc)

    return build_int4(src.model, cal, context, plan_for=plan_for, make=make, name="ort-int4")


def _et(precision: str) -> Build:
    def build(src: LMSource, out: Path, context: int, built: dict[str, Artifact], cal: Calibration) -> Artifact:
        return export_executorch(src, out / f"et-{precision}.pte", context=context, precision=precision)

    return build


def _et_8da4w(src: LMSource, out: Path, context: int, built: dict[str, Artifact], cal: Calibration) -> Artifact:
    def plan_for(keep: set[str], notes: dict[str, str]) -> list:
        return plan_int4(src.model, group=GROUP, head=cal.head, keep_int8=keep, pads=False, int8_group=None,
                         ladder_note=notes)

    def make(plan: list, acc: dict) -> Artifact:
        return export_executorch(src, out / "et-8da4w.pte", context=context, precision="8da4w", plan=plan,
                                 plan_account=acc)

    return build_int4(src.model, cal, context, plan_for=plan_for, make=make, name="et-8da4w")


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
    LMCandidate("ort-int4", "onnxruntime", "int4", _ort_int4, "onnxruntime"),
    LMCandidate("et-fp32", "executorch", "fp32", _et("fp32"), "executorch"),
    LMCandidate("et-8da8w", "executorch", "8da8w", _et("8da8w"), "executorch"),
    LMCandidate("et-8da4w", "executorch", "8da4w", _et_8da4w, "executorch"),
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
            skipped[c.name] = (f"target {target.name} does not run {c.runtime} "
                               f"(its runtimes: {', '.join(target.runtimes)})")
        elif importlib.util.find_spec(c.exporter) is None:
            skipped[c.name] = f"{c.exporter} is not installed on this host (pip install 'edgekit[{c.exporter}]')"
        else:
            chosen.append(c)
    return chosen, skipped
