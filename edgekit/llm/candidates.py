"""The builders of the language-model files edgekit races. Which files race is the format registry's table
(``formats.FORMATS``: each format row's ``generation_candidates``, beside the fixed graph's ``search_candidates``):
onnxruntime's float baseline, int8 and MatMulNBits int4 files, ExecuTorch's float, 8da8w, int8 and 8da4w files,
llama.cpp's GGUF files (Q8_0, Q4_0, Q4_K_M from one f16 conversion, each with llama-quantize's per-tensor account:
``export_gguf``). Every int4 file comes from a layer plan with its account and the recovery ladder
(``int4_ladder``). ``CANDIDATES`` is that table with each row's builder; the default deploy races the ``SHORT``
rows (the registry's ``quick`` ones); ``--search`` races every row.
A row is built when its runtime's exporter imports on this host and the target runs the runtime (its
``runtimes``; on the local target, what is installed here, since this host is the device)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..artifact import Artifact
from ..formats import FORMATS, Format
from ..inputs.targets import TargetSpec
from .build_cache import cached, hit_note, source_key
from .export_executorch import et_io, export_executorch
from .export_gguf import GGUFFile, convert_to_gguf, quantize_gguf
from .export_onnx import export_onnx, quantize_onnx_int8, quantize_onnx_nbits
from .int4_ladder import Calibration, build_int4
from .layer_plan import LayerChoice, plan_int4
from .llama_cpp import LlamaCppMissing, tools
from .source import LMSource

Build = Callable[[LMSource, Path, int, dict[str, Artifact], Calibration], Artifact]
GROUP = 32  # int4 weights a scale: ExecuTorch's export_llm default for 8da4w, MatMulNBits' usual block


def _lowered(
    src: LMSource,
    name: str,
    context: int,
    plan: list[LayerChoice],
    acc: dict[str, Any],
    out: Path,
    base: str | None,
    produce: Callable[[], Artifact],
) -> Artifact:
    """An int4 rung's file through the build cache (``build_cache``): keyed by the source, the layer plan and the
    base file, so another gate setting that picks the same rung lowers nothing; a restored file carries this
    run's account."""
    sk = source_key(src)
    doc = (
        None
        if sk is None
        else {
            "row": name,
            "source": sk,
            "context": context,
            "base": base,
            "plan": [(c.name, c.scheme, c.group) for c in plan],
        }
    )
    art = cached(doc, out, produce)
    if hit_note(art) is None:
        return art
    last = art.lineage[-1]
    quant = {**last.metrics.get("quantization", {}), **acc}
    return art.model_copy(
        update={
            "lineage": (*art.lineage[:-1], last.model_copy(update={"metrics": {**last.metrics, "quantization": quant}}))
        }
    )


def _ort_base(src: LMSource, out: Path, context: int, built: dict[str, Artifact]) -> Artifact:
    return built.get("ort-fp32") or export_onnx(src, out / "ort-fp32.onnx", context=context)


def _ort_fp32(src: LMSource, out: Path, context: int, built: dict[str, Artifact], cal: Calibration) -> Artifact:
    return export_onnx(src, out / "ort-fp32.onnx", context=context)


def _ort_int8(src: LMSource, out: Path, context: int, built: dict[str, Artifact], cal: Calibration) -> Artifact:
    return quantize_onnx_int8(_ort_base(src, out, context, built), out / "ort-int8.onnx")


def ort(precision: str) -> Build:
    """onnxruntime's float export, or its int8 weights computed in int8 (from the float file)."""
    return {"fp32": _ort_fp32, "int8": _ort_int8}[precision]


def ort_int4(block: int = GROUP) -> Build:
    """MatMulNBits 4-bit in blocks of ``block`` along the input (the last zero-padded), int8 compute."""
    name = "ort-int4" if block == GROUP else f"ort-int4-b{block}"

    def build(src: LMSource, out: Path, context: int, built: dict[str, Artifact], cal: Calibration) -> Artifact:
        base = _ort_base(src, out, context, built)

        def plan_for(keep: set[str], notes: dict[str, str]) -> list[LayerChoice]:
            return plan_int4(
                src.model, group=block, head=cal.head, keep_int8=keep, pads=True, int8_group=block, ladder_note=notes
            )

        def make(plan: list[LayerChoice], acc: dict[str, Any]) -> Artifact:
            return _lowered(
                src,
                name,
                context,
                plan,
                acc,
                out,
                base.sha256,
                lambda: quantize_onnx_nbits(
                    base,
                    out / f"{name}.onnx",
                    int4={c.name for c in plan if c.scheme == "int4"},
                    int8={c.name for c in plan if c.scheme == "int8"},
                    block_size=block,
                    plan_account=acc,
                ),
            )

        return build_int4(src.model, cal, context, plan_for=plan_for, make=make, name=name)

    return build


def et(precision: str) -> Build:
    def build(src: LMSource, out: Path, context: int, built: dict[str, Artifact], cal: Calibration) -> Artifact:
        return export_executorch(src, out / f"et-{precision}.pte", context=context, precision=precision)

    return build


def et_8da4w(group: int = GROUP) -> Build:
    """torchao int4 weights in groups of ``group`` with int8 activations per token (XNNPACK); a layer whose width
    the group does not divide is kept at int8 per channel, named in the account."""
    name = "et-8da4w" if group == GROUP else f"et-8da4w-g{group}"

    def build(src: LMSource, out: Path, context: int, built: dict[str, Artifact], cal: Calibration) -> Artifact:
        def plan_for(keep: set[str], notes: dict[str, str]) -> list[LayerChoice]:
            return plan_int4(
                src.model, group=group, head=cal.head, keep_int8=keep, pads=False, int8_group=None, ladder_note=notes
            )

        def make(plan: list[LayerChoice], acc: dict[str, Any]) -> Artifact:
            return _lowered(
                src,
                name,
                context,
                plan,
                acc,
                out,
                None,
                lambda: export_executorch(
                    src, out / f"{name}.pte", context=context, precision="8da4w", plan=plan, plan_account=acc
                ),
            )

        return build_int4(src.model, cal, context, plan_for=plan_for, make=make, name=name, activations_int8=True)

    return build


def gguf(file_type: str) -> Build:
    """A GGUF file quantized by llama-quantize from the run's f16 conversion (made once, by the first)."""

    def build(src: LMSource, out: Path, context: int, built: dict[str, Artifact], cal: Calibration) -> Artifact:
        base = out / "gguf-f16.gguf"
        key = (str(base), src.sha256)
        if _GGUF_BASE.get(key) is None or not base.is_file():
            _GGUF_BASE[key] = convert_to_gguf(src.path, base, outtype="f16")
        f16 = _GGUF_BASE[key]
        q = quantize_gguf(f16.path, out / f"gguf-{file_type.lower()}.gguf", file_type)
        step = q.step()
        step = step.model_copy(update={"metrics": {**step.metrics, "tensors": q.account}})
        return Artifact.from_file(
            q.path, Format.GGUF, et_io(src), precision=GGUF_PRECISION[file_type], lineage=[f16.step(), step]
        )

    return build


_GGUF_BASE: dict[tuple[str, str | None], GGUFFile] = {}  # (f16 file, source sha256) -> the f16 conversion
GGUF_PRECISION = {"F16": "fp16", "Q8_0": "int8", "Q4_0": "int4", "Q4_K_M": "int4"}


def _llama_cpp_ready() -> str | None:
    try:
        tools()
    except LlamaCppMissing as exc:
        return f"{exc.message} ({exc.hint})"
    return None


@dataclass(frozen=True)
class LMCandidate:
    name: str
    runtime: str
    precision: str
    build: Build
    exporter: str  # the host package the export needs
    module: str = ""  # the runtime's Python module (local target: it runs here when this imports); "": runtime
    slow: bool = False  # a slow lowering (race.py: started only when its prediction can beat the measured leader)
    calibrated: bool = False  # its file depends on the Calibration (the int4 ladder): part of its cache key

    def missing(self) -> str | None:
        """Why this host cannot build the file (None: it can)."""
        if self.exporter == "llama.cpp":
            return _llama_cpp_ready()
        if importlib.util.find_spec(self.exporter) is None:
            return f"{self.exporter} is not installed on this host (pip install 'edgekit[{self.exporter}]')"
        return None


def _from_registry() -> tuple[LMCandidate, ...]:
    """The registry's generation rows, each with its builder (made by the factory the row names)."""
    rows = []
    for spec in FORMATS:
        for g in spec.generation_candidates:
            module, _, func = g.build.partition(":")
            factory = getattr(importlib.import_module(module), func)
            runtime = spec.runtime or ""
            rows.append(
                LMCandidate(
                    g.name,
                    runtime,
                    g.precision,
                    factory(*g.args),
                    g.exporter or runtime,
                    g.module,
                    slow=g.slow,
                    calibrated=g.calibrated,
                )
            )
    return tuple(rows)


CANDIDATES = _from_registry()
BASELINE = next(g.name for s in FORMATS for g in s.generation_candidates if g.baseline)
# The short race (the default): each runtime's likeliest winners, measured on the benchmark models
# (benchmarks/llm_runtimes.py: int4 is each runtime's fastest; int8 stays as the fallback when int4 misses the
# tolerance, as tiny models do) plus the float baseline; the registry's rows say why the others are left to --search.
SHORT = tuple(g.name for s in FORMATS for g in s.generation_candidates if g.quick)


def candidates_for(target: TargetSpec) -> tuple[list[LMCandidate], dict[str, str]]:
    """(the rows to build, {row: why not} for the others)."""
    chosen, skipped = [], {}
    for c in CANDIDATES:
        runs_here = c.runtime in target.runtimes or (
            target.transport == "local" and importlib.util.find_spec(c.module or c.runtime) is not None
        )
        missing = c.missing() if runs_here else None
        if not runs_here:
            skipped[c.name] = (
                f"target {target.name} does not run {c.runtime} (its runtimes: {', '.join(target.runtimes)})"
            )
        elif missing:
            skipped[c.name] = missing
        else:
            chosen.append(c)
    return chosen, skipped
