"""PyTorch (torch.export program) -> ONNX, with a parity check on the eval inputs."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..artifact import Artifact, LineageStep
from ..errors import ConversionError
from ..formats import Format
from ..inputs.source import Source, load_onnx, model_batch, onnx_io, ort_reference_all
from ..logs import quiet
from .parity import compare_outputs, parity_metrics

HOP = "torch->onnx"
DEFAULT_OPSET = 18


def export_onnx(source: Source, out_path: Path, parity_inputs: list[np.ndarray], *,
                opset: int = DEFAULT_OPSET, check: bool = True) -> Artifact:
    import onnx
    import torch

    if source.program is None:
        raise ConversionError("the source is not a PyTorch program", hop=HOP)
    ep = source.program
    example = tuple(torch.from_numpy(example_batch(x, source)) for x in parity_inputs)
    start = time.perf_counter()
    tmp = out_path.with_name(f".{out_path.name}.partial")
    try:
        # The exporter prints progress and warnings on stdout/stderr; keep the CLI readable.
        with quiet("torch.onnx", "torch.export", "onnxscript"):
            torch.onnx.export(ep, example, str(tmp), dynamo=True, opset_version=opset, verbose=False,
                              external_data=False)
        model = onnx.load(str(tmp))
        onnx.checker.check_model(model)
        tmp.replace(out_path)
    except Exception as exc:  # exporter failures come as many types; report the hop and the first line
        tmp.unlink(missing_ok=True)
        raise ConversionError(f"export failed: {type(exc).__name__}: {str(exc).splitlines()[0][:400] if str(exc) else ''}",
                              hop=HOP, hint="check the model runs under torch.export; unsupported ops are named above") from exc
    seconds = time.perf_counter() - start
    io_spec = onnx_io(model)
    # keep the user-facing input names/layout of the source program
    metrics: dict = {}
    if check:
        gots = ort_reference_all(out_path)(parity_inputs)
        refs = source.reference_all(parity_inputs)
        names = [s.name for s in io_spec.outputs]
        if len(refs) != len(gots) or len(names) != len(gots):
            raise ConversionError(f"the ONNX model has {len(gots)} outputs, the PyTorch program {len(refs)}", hop=HOP)
        # Recorded, not raised: the gate fails on it with the hop named, and the report shows why.
        metrics.update(parity_metrics(compare_outputs(refs, gots, source.reference_name, names), "fp32"))
    step = LineageStep(kind="convert", name=HOP, config={"opset": opset, "exporter": "torch.onnx dynamo",
                                                         "torch": torch.__version__}, metrics=metrics,
                       seconds=round(seconds, 3))
    return source.artifact.derive(out_path, fmt=Format.ONNX, io=io_spec, step=step, precision="fp32")



def example_batch(x: np.ndarray, source: Source) -> np.ndarray:
    """One batch of ``x`` as the program takes it: its static batch size (samples repeated when
    there are fewer), else one sample."""
    n = model_batch([s.shape for s in source.artifact.io.inputs]) or 1
    idx = np.arange(n) % len(x)
    return np.ascontiguousarray(x[idx])


__all__ = ["export_onnx", "load_onnx", "example_batch"]
