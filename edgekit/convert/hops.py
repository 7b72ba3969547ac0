"""One way to convert: ``convert_to(artifact, to, out, ...)`` picks the hop that makes ``to`` from the
format registry (``formats.FORMATS``: each row names its hop as ``module:function`` and the format
that hop reads) and chains the hop before it when the artifact is not in that format yet (PyTorch ->
ONNX -> TFLite). `edgekit convert` (``convert/api.py``) and the recipe's ``convert`` step
(``passes/convert.py``) both go through it.

A hop is a function ``hop(h: HopInput) -> Artifact`` whose result's last lineage step is
``kind: convert`` with ``parity`` and ``parity_violations``. The adapters below wrap the existing hop
modules; a new runtime's hop module can expose such a function itself and name it in its row.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..artifact import Artifact
from ..config import validate
from ..errors import BadInputError, ConversionError, PassError
from ..formats import Format, FormatSpec, convert_targets, format_spec
from ..inputs.data import Dataset
from .chain import convert_to_tflite
from .torch_to_coreml import torch_to_coreml
from .torch_to_onnx import export_onnx


@dataclass(frozen=True)
class HopInput:
    artifact: Artifact  # the model in the row's ``hop_from`` format (a PyTorch hop reads ``source``)
    source: Any  # the loaded Source (its PyTorch program and references), or None
    out: Path
    precision: str = "fp32"
    config: Any = None  # the row's ``hop_config`` instance (None for a hop without options)
    calib: Dataset | None = None
    parity_inputs: list[np.ndarray] | None = None
    route: str = "auto"
    progress: Callable[[str], None] = lambda _m: None


def load_object(target: str) -> Any:
    mod, _, name = target.partition(":")
    return getattr(importlib.import_module(mod), name)


def target_spec(to: Format | str) -> FormatSpec:
    """The row of a conversion target; BadInputError naming the targets for anything else."""
    try:
        row = format_spec(to)
    except ValueError:
        row = None
    if row is None or row.hop is None:
        raise BadInputError(f"edgekit does not convert to {getattr(to, 'value', to)!r}",
                            hint=f"convert to one of: {', '.join(convert_targets())}")
    return row


def hop_config(to: Format | str, precision: str = "fp32", options: dict | None = None, *,
               context: str | None = None, hint: str | None = None):
    """The hop's typed options (its row's ``hop_config`` class) from ``precision`` and ``options``;
    None for a hop without options. With ``context`` a bad value is a ConfigError naming it (else
    pydantic's ValidationError)."""
    row = target_spec(to)
    if row.hop_config is None:
        return None
    cls = load_object(row.hop_config)
    data = {"precision": precision, **(options or {})}
    if context is None:
        return cls(**data)

    return validate(cls, data, context, hint=hint)


def check_parity(art: Artifact, row: FormatSpec) -> None:
    """ConversionError when the artifact's last hop recorded parity violations."""
    step = art.lineage[-1]
    violations = step.metrics.get("parity_violations")
    if violations:
        raise ConversionError(f"{row.label} conversion is out of parity tolerance: " + "; ".join(violations),
                              hop=step.name, hint=row.parity_hint or "an op converts with different numerics; "
                              "check the model in eval() mode")


def convert_to(artifact: Artifact, to: Format | str, out: str | Path, *, source=None, precision: str = "fp32",
               config: Any = None, options: dict | None = None, calib: Dataset | None = None,
               parity_inputs: list[np.ndarray] | None = None, route: str = "auto", workdir: Path | None = None,
               progress: Callable[[str], None] | None = None) -> Artifact:
    """``artifact`` converted to ``to`` at ``out`` by the registry's hop (an artifact already in
    ``to`` is returned as it is). When the hop reads another format that a hop makes (TFLite reads
    ONNX), that hop runs first, into ``workdir`` (default: beside ``out``), and must be within its
    parity tolerance."""
    row = target_spec(to)
    out = Path(out)
    if artifact.format == row.format:
        return artifact
    if config is None:
        config = hop_config(row.format, precision, options)
    start = artifact
    if row.hop_from is not None and artifact.format != row.hop_from:
        prev = format_spec(row.hop_from)
        if prev.hop is not None:  # e.g. PyTorch -> ONNX before ONNX -> TFLite
            mid = (workdir / f"model{prev.suffix}") if workdir is not None else \
                out.with_name(f".{out.stem}.input{prev.suffix}")
            start = convert_to(artifact, prev.format, mid, source=source, parity_inputs=parity_inputs,
                               workdir=workdir, progress=progress)
            check_parity(start, prev)
    hop = load_object(row.hop)
    return hop(HopInput(artifact=start, source=source, out=out, precision=precision, config=config, calib=calib,
                        parity_inputs=parity_inputs, route=route, progress=progress or (lambda _m: None)))


# --------------------------------------------------------------------------- the hops of the built-in rows
def torch_to_onnx_hop(h: HopInput) -> Artifact:
    if h.source is None or h.source.program is None:
        raise ConversionError("ONNX export needs the PyTorch model", hop="torch->onnx",
                              hint="give edgekit the .pt2 (or .pth with --arch)")
    h.progress("exporting PyTorch -> ONNX (parity check)")
    xs = h.parity_inputs or (list(h.calib.xs) if h.calib is not None else None)
    if not xs:
        raise BadInputError("exporting to ONNX needs sample inputs (the parity check and the export's example)",
                            hint="pass --eval-data or --calib-data")
    return export_onnx(h.source, h.out, xs)


def to_tflite_hop(h: HopInput) -> Artifact:
    if h.artifact.format != Format.ONNX:
        raise PassError("convert to tflite starts from the ONNX model", hint="the pipeline exports it first")
    h.progress(f"converting ONNX -> TFLite ({h.config.label})")
    return convert_to_tflite(h.artifact, h.out, h.config, source=h.source, calib=h.calib,
                             parity_inputs=h.parity_inputs, route=h.route)


def torch_to_coreml_hop(h: HopInput) -> Artifact:
    if h.source is None:
        raise ConversionError("Core ML conversion needs the PyTorch model; this run started from ONNX",
                              hop="torch->coreml", hint="give edgekit the .pt2 (or .pth with --arch)")
    h.progress("converting PyTorch -> Core ML")
    return torch_to_coreml(h.source, h.out, h.config, parity_inputs=h.parity_inputs)


__all__ = ["HopInput", "convert_to", "hop_config", "target_spec", "check_parity", "load_object"]
