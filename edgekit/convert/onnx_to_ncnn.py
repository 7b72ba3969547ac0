"""ONNX -> NCNN (``.param`` graph + ``.bin`` weights, one artifact of two files) through pnnx, for NCNN's
CPU path: fp32 and fp16.

pnnx (PyPI ``pnnx``: a native converter binary) reads the fp32 ONNX model, so a model that arrived as
ONNX converts the same way as one exported from PyTorch; it writes fp32 or fp16 weights (``fp16=0/1``).
What NCNN computes in is a run-time option: by default it stores and computes in fp16 wherever the CPU
can, x86 included, so the fp32 variant pins ``fp16: off`` (the artifact's ``runtime_options``, which the
host sends with every request for it) and the fp16 variant runs NCNN's default. NCNN's Mat has no batch
axis: the model takes batch 1, float inputs only.

INT8 is not offered: NCNN's INT8 path needs ``ncnn2table`` (calibration) and ``ncnn2int8``, which neither
the ``ncnn`` nor the ``pnnx`` wheel ships (Debian 12 has no ncnn package either).

Parity runs the model on this host through the agent's own ``NCNNRunner``, one sample at a time,
against onnxruntime running the ONNX model.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from ..agent.inprocess import load_agent
from ..artifact import Artifact, IOSpec, LineageStep, TensorSpec
from ..errors import ConversionError, MissingExtraError
from ..formats import Format, companion_clash
from ..fsutil import publish_files
from ..inputs.source import ort_reference_all, run_batched, synthetic_inputs
from .parity import compare_outputs, parity_metrics

HOP = "onnx->ncnn"
PRECISIONS = ("fp32", "fp16")
INT8_MISSING = ("NCNN INT8 needs ncnn2table (calibration) and ncnn2int8, which the ncnn and pnnx wheels do not "
                "ship; build them from NCNN's source (tools/quantize) to add it")


class NcnnConfig(BaseModel):
    """Options of the ONNX -> NCNN hop (the recipe's ``convert: {to: ncnn, ...}`` step)."""

    model_config = ConfigDict(extra="forbid")

    precision: Literal["fp32", "fp16"] = "fp32"

    @property
    def label(self) -> str:
        return {"fp32": "fp32 (fp16 off)", "fp16": "fp16 storage and arithmetic"}[self.precision]


def available() -> bool:
    return importlib.util.find_spec("pnnx") is not None and importlib.util.find_spec("ncnn") is not None


def _pnnx_binary() -> str:
    import pnnx

    return pnnx.EXEC_PATH


def run_ncnn_all(path: Path, io: IOSpec, xs: list[np.ndarray], fp16: str) -> list[np.ndarray]:
    """Every output of the NCNN model on ``xs`` in ``io.outputs`` order, one sample at a time, through the
    agent's NCNNRunner with ``fp16`` (its runtime option)."""

    agent = load_agent()
    ins = [s.model_dump(mode="json") for s in io.inputs]
    outs = [s.model_dump(mode="json") for s in io.outputs]
    try:
        runner = agent.runners.RUNNERS["ncnn"](str(path), 1, ins, outs, runtime_options={"fp16": fp16})
    except agent.AgentFailure as exc:
        raise ConversionError(f"the model does not load in NCNN: {exc}", hop=HOP) from exc
    return run_batched(lambda feed: runner.run([agent.tensors.prepare(x, s) for x, s in zip(feed, ins)]), list(xs), 1)


def unknown_layers(param: Path) -> dict[str, int]:
    """Layer types in an NCNN .param that this NCNN has no layer for, with their counts: ops pnnx could not
    translate stay in the graph under their PyTorch names (``nn.InstanceNorm1d``), and NCNN then refuses the
    whole file with a line on stderr that names only the first."""
    import ncnn

    lines = param.read_text(errors="replace").splitlines()[2:]  # the magic number, then the layer/blob counts
    found: dict[str, int] = {}
    for line in lines:
        kind = line.split(maxsplit=1)[0] if line.strip() else None
        if kind and ncnn.layer_to_index(kind) < 0:
            found[kind] = found.get(kind, 0) + 1
    return found


def _refuse_unknown_layers(param: Path) -> None:
    unknown = unknown_layers(param)
    if unknown:
        ops = ", ".join(f"{k} (x{n})" if n > 1 else k for k, n in sorted(unknown.items()))
        raise ConversionError(f"pnnx left op(s) that NCNN has no layer for: {ops}", hop=HOP,
                              hint="keep this model on onnxruntime, LiteRT or OpenVINO, or export it without "
                                   "those ops")


def onnx_to_ncnn(art: Artifact, out_path: str | Path, cfg: NcnnConfig, *, parity_inputs: list[np.ndarray],
                 parity_samples: int = 64) -> Artifact:
    """The ONNX artifact as an NCNN model at ``out_path`` (``.param``; the ``.bin`` beside it), parity-checked."""
    if not available():
        raise MissingExtraError("ncnn", "ncnn", "ONNX -> NCNN conversion (pnnx) and the NCNN runtime")
    if art.format != Format.ONNX:
        raise ConversionError(f"NCNN conversion starts from the ONNX model, got {art.format.value}", hop=HOP)
    out_path = Path(out_path)
    if out_path.suffix != ".param":
        raise ConversionError(f"{out_path.name}: an NCNN model is saved as a .param (its .bin beside it)", hop=HOP,
                              hint="use --out model.param")
    clash = companion_clash(out_path, Format.NCNN)
    if clash is not None:
        raise ConversionError(f"{out_path.with_suffix('.bin').name} holds the weights of {clash.name}, another model beside "
                              f"it: writing the NCNN model there would break that one", hop=HOP,
                              hint=f"choose another name than {out_path.stem} (e.g. --out {out_path.stem}-ncnn{out_path.suffix})")
    bad = [f"{s.name} ({s.dtype})" for s in art.io.inputs if np.dtype(s.dtype).kind != "f"]
    if bad:
        raise ConversionError(f"NCNN takes float inputs; this model's {', '.join(bad)} are not", hop=HOP,
                              hint="keep this model on onnxruntime, LiteRT or OpenVINO")
    batches = {s.shape[0] for s in art.io.inputs if s.shape}
    if batches - {1, None}:
        raise ConversionError(f"NCNN's Mat has no batch axis: the model must take batch 1, its inputs take "
                              f"{sorted(b for b in batches if b)}", hop=HOP, hint="export the model at batch 1")
    shapes = []
    for s in art.io.inputs:
        dims = [1 if d is None else int(d) for d in s.shape]
        shapes.append("[" + ",".join(str(d) for d in dims) + "]f32")
    start = time.perf_counter()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_path.stem}.", dir=out_path.parent))
    try:  # pnnx writes several files next to its input: it works in its own folder
        src = tmp / "model.onnx"
        shutil.copyfile(art.path, src)
        args = [_pnnx_binary(), src.name, "inputshape=" + ",".join(shapes), f"fp16={int(cfg.precision == 'fp16')}"]
        proc = subprocess.run(args, cwd=tmp, capture_output=True, text=True, timeout=600)
        param, weights = tmp / "model.ncnn.param", tmp / "model.ncnn.bin"
        if proc.returncode != 0 or not param.is_file() or not weights.is_file():
            tail = " ".join((proc.stderr or proc.stdout or "").strip().splitlines()[-3:])[:400]
            raise ConversionError(f"pnnx could not convert the model (exit {proc.returncode}): {tail}", hop=HOP,
                                  hint="an op above has no NCNN layer; keep this model on another runtime")
        seconds = time.perf_counter() - start
        _refuse_unknown_layers(param)
        probe = [np.asarray(x[:parity_samples]) for x in parity_inputs]
        io = IOSpec(inputs=tuple(TensorSpec(name=s.name, shape=tuple(1 if d is None else d for d in s.shape),
                                            dtype=s.dtype, layout=s.layout) for s in art.io.inputs),
                    outputs=art.io.outputs)
        fp16 = "on" if cfg.precision == "fp16" else "off"

        gots = run_ncnn_all(param, io, probe, fp16)
        results = compare_outputs(ort_reference_all(art.path)(probe), gots, "onnxruntime (the ONNX model)",
                                  [o.name for o in io.outputs])
        pm = parity_metrics(results, cfg.precision)
        publish_files([(param, out_path), (weights, out_path.with_suffix(".bin"))])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    import pnnx

    config = {"precision": cfg.precision, "converter": "pnnx", "pnnx": getattr(pnnx, "__version__", None),
              "runtime_options": {"fp16": fp16}, "int8": INT8_MISSING}
    metrics = {**pm, "route": "pnnx", "precision": cfg.precision, "convert_seconds": round(seconds, 3),
               "chain_parity": pm["parity"], "batch": 1}
    step = LineageStep(kind="convert", name=HOP, config=config, metrics=metrics,
                       seconds=round(time.perf_counter() - start, 3))
    return art.derive(out_path, fmt=Format.NCNN, io=io, step=step, precision=cfg.precision)


def ncnn_hop(h) -> Artifact:
    """The registry's hop (``formats.FORMATS``' ncnn row): a ``convert.hops.HopInput`` in."""

    cfg = h.config if h.config is not None else NcnnConfig(precision=h.precision)
    xs = h.parity_inputs or (list(h.calib.xs) if h.calib is not None else None) or synthetic_inputs(h.artifact.io)
    h.progress(f"converting ONNX -> NCNN with pnnx ({cfg.label})")
    return onnx_to_ncnn(h.artifact, h.out, cfg, parity_inputs=list(xs))


__all__ = ["NcnnConfig", "onnx_to_ncnn", "ncnn_hop", "run_ncnn_all", "available", "HOP", "PRECISIONS", "INT8_MISSING"]
