"""PyTorch -> TFLite directly with ``litert-torch`` (Google's PyTorch -> LiteRT converter): the second
TFLite route, used when onnx2tf fails or misses its parity tolerance (see chain.py).

litert-torch keeps the PyTorch layout (NCHW stays NCHW), so no transposition is recorded. In
edgekit this route makes fp32 models; the quantized precisions go through onnx2tf.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..artifact import Artifact, IOSpec, LineageStep, TensorSpec
from ..errors import ConversionError, MissingExtraError
from ..formats import Format
from ..fsutil import atomic_path
from ..logs import quiet
from .parity import compare_outputs, parity_metrics
from .tflite.host_harness import _tflite_details, run_tflite_all
from .tflite.layout import _match, _signature_indices
from .torch_to_onnx import example_batch

HOP = "torch->tflite"


def available() -> bool:
    return importlib.util.find_spec("litert_torch") is not None


def _shape(d) -> tuple[int, ...]:
    return tuple(int(v) for v in d["shape"])


def ordered_outputs(dout: list, sig_out: dict[str, int], refs: list[np.ndarray], run: Callable) -> list:
    """The converted file's output tensors in the PyTorch program's output order, never by position
    alone: by the signature's ``output_K`` keys (litert-torch names the K-th program output so), else
    each by the one tensor with the reference output's shape, else (shared shapes, no signature) by
    the values ``run(tensors)`` gives on the probe: the same-shape tensor closest to the reference."""
    if len(dout) != len(refs):
        raise ConversionError(f"the TFLite model has {len(dout)} outputs, the PyTorch program {len(refs)}", hop=HOP)
    by_index = {int(d["index"]): d for d in dout}
    keyed = [by_index.get(sig_out.get(f"output_{k}", -1)) for k in range(len(refs))]
    if all(d is not None for d in keyed) and len({id(d) for d in keyed}) == len(keyed):
        return keyed
    fits = [[d for d in dout if _shape(d) == tuple(r.shape)] for r in refs]
    if all(len(f) == 1 for f in fits) and len({id(f[0]) for f in fits}) == len(fits):
        return [f[0] for f in fits]
    got = run(dout)
    left, picked = set(range(len(dout))), []
    for r in refs:
        err = {j: float(np.max(np.abs(got[j].astype(np.float64) - r))) for j in left if got[j].shape == r.shape}
        if not err:
            raise ConversionError(f"no output of the TFLite model has the shape {tuple(r.shape)} of the PyTorch "
                                  "program's output", hop=HOP)
        j = min(err, key=err.get)
        left.discard(j)
        picked.append(dout[j])
    return picked


def torch_to_tflite(source, out_path: str | Path, *, precision: str = "fp32", parity_inputs: list[np.ndarray],
                    onnx_art: Artifact | None = None, parity_samples: int = 64) -> Artifact:
    """Convert ``source.program`` (a torch.export program) to ``out_path`` and check parity
    against the PyTorch reference on ``parity_inputs``."""

    if not available():
        raise MissingExtraError("litert-torch", "litert-torch", "the direct PyTorch -> TFLite route")
    if source.program is None:
        raise ConversionError("the litert-torch route starts from a PyTorch model; the source is ONNX", hop=HOP)
    if precision != "fp32":
        raise ConversionError(f"edgekit's litert-torch route makes fp32 models, not {precision}", hop=HOP,
                              hint="quantized TFLite models come from the onnx2tf route")
    import torch

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    probe = [np.asarray(x[:parity_samples]) for x in parity_inputs]
    example = tuple(torch.from_numpy(example_batch(x, source)) for x in probe)
    start = time.perf_counter()
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".edgekit-litert-", dir=out_path.parent))
    try:
        try:
            with quiet("litert_torch", "tensorflow", "absl", "jax"):
                import litert_torch

                edge = litert_torch.convert(source.program.module(), example)
                edge.export(str(work / "model.tflite"))
        except Exception as exc:  # the converter's errors come from torch, MLIR and TF layers
            first = str(exc).splitlines()[0][:300] if str(exc) else ""
            raise ConversionError(f"litert-torch failed: {type(exc).__name__}: {first}", hop=HOP,
                                  hint="the op named above has no LiteRT lowering; try the onnx2tf route "
                                  "(from the ONNX model)") from exc
        seconds = time.perf_counter() - start
        src_io = source.artifact.io
        din, dout = _tflite_details(work / "model.tflite")
        din = din if len(din) == len(src_io.inputs) else _match(din, src_io.inputs, "input")
        specs_in = tuple(TensorSpec(name=d["name"], shape=s.shape, dtype=np.dtype(d["dtype"]).name, layout=s.layout)
                         for d, s in zip(din, src_io.inputs))
        outs = onnx_art.io.outputs if onnx_art is not None else src_io.outputs
        refs = [np.asarray(r) for r in source.reference_all(probe)]
        dout = ordered_outputs(dout, _signature_indices(work / "model.tflite")[1], refs,
                               lambda ds: run_tflite_all(work / "model.tflite", IOSpec(inputs=specs_in, outputs=tuple(
                                   TensorSpec(name=d["name"], shape=_shape(d), dtype=np.dtype(d["dtype"]).name)
                                   for d in ds)), probe))
        specs_out = tuple(TensorSpec(name=d["name"], shape=s.shape, dtype=np.dtype(d["dtype"]).name)
                          for d, s in zip(dout, outs))
        io = IOSpec(inputs=specs_in, outputs=specs_out)
        gots = run_tflite_all(work / "model.tflite", io, probe)
        names = [s.name for s in outs]
        results = compare_outputs(refs, gots, source.reference_name, names)
        with atomic_path(out_path) as tmp:
            shutil.copyfile(work / "model.tflite", tmp)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    pm = parity_metrics(results, precision)
    metrics = {**pm, "route": "litert-torch", "precision": precision, "convert_seconds": round(seconds, 3),
               "chain_parity": pm["parity"]}
    from importlib.metadata import version

    step = LineageStep(kind="convert", name=HOP, config={"precision": precision, "converter": "litert-torch",
                                                         "litert-torch": version("litert-torch")},
                       metrics=metrics, seconds=round(time.perf_counter() - start, 3))
    return source.artifact.derive(out_path, fmt=Format.TFLITE, io=io, step=step, precision=precision)


__all__ = ["HOP", "available", "ordered_outputs", "torch_to_tflite"]
