"""PyTorch -> ExecuTorch (.pte) lowered to the XNNPACK delegate: fp32, and int8 through PT2E
(``prepare_pt2e``/``convert_pt2e`` with XNNPACK's quantizer, symmetric per-channel weights; activations
either static, calibrated on the user's calibration set (``quantization: full``), or dynamic, quantized
per batch at run time (``quantization: dynamic``: no calibration; XNNPACK's dynamic quantizer takes the
Linear and Conv layers, which suits transformers whose activation ranges move with the input).
The model's I/O stays float in all three.

Parity runs the .pte on this host through the agent's own ``ExecuTorchRunner`` (imported from its
file), fed exactly as the device feeds it, in chunks of the program's fixed batch.

A .pte's memory plan is sized for the shapes it was exported with, so a program with a dynamic
axis is re-exported at the example shapes (one sample, or the static batch) and says so in the
lineage (``fixed_shapes``).
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..agent.inprocess import load_agent
from ..artifact import Artifact, IOSpec, LineageStep, TensorSpec
from ..errors import ConversionError, MissingExtraError
from ..formats import Format
from ..fsutil import atomic_path
from ..inputs.source import model_batch, run_batched, synthetic_inputs
from ..logs import quiet
from .parity import compare_outputs, parity_metrics
from .torch_to_onnx import example_batch

HOP = "torch->executorch"
PRECISIONS = ("fp32", "int8")
CALIBRATION_SAMPLES = 200  # the calibration set's first samples (the same default as TFLite's)


class ExecutorchConfig(BaseModel):
    """Options of the PyTorch -> ExecuTorch hop (the recipe's ``convert: {to: executorch, ...}`` step)."""

    model_config = ConfigDict(extra="forbid")

    precision: Literal["fp32", "int8"] = "fp32"
    quantization: Literal["full", "dynamic"] = Field(
        "full", description="int8 only: static activations calibrated on --calib-data (full) or quantized at "
        "run time (dynamic: weights only need no calibration)")
    calibration_samples: int = Field(CALIBRATION_SAMPLES, ge=1, description="calibration samples used (first N)")

    @property
    def needs_calibration(self) -> bool:
        return self.precision == "int8" and self.quantization == "full"

    @property
    def label(self) -> str:
        return self.precision if self.precision == "fp32" else f"int8 {'static' if self.quantization == 'full' else 'dynamic'}"


def available() -> bool:
    return importlib.util.find_spec("executorch") is not None


def _example(source, xs: list[np.ndarray]):
    import torch


    return tuple(torch.from_numpy(example_batch(np.asarray(x), source)) for x in xs)


def _static_program(source, example):
    """The program with every input shape fixed: the source's own when it has no dynamic axis,
    else a re-export of its module at the example shapes (and which shapes were fixed)."""
    import torch

    if all(d is not None for s in source.artifact.io.inputs for d in s.shape):
        return source.program, None
    fixed = {s.name: list(x.shape) for s, x in zip(source.artifact.io.inputs, example)}
    try:
        return torch.export.export(source.program.module(), example), fixed
    except Exception as exc:  # torch.export raises many types (UserError, GuardOnDataDependent..., RuntimeError)
        raise ConversionError(f"re-exporting the program at fixed shapes {fixed} for ExecuTorch failed: "
                              f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}",
                              hop=HOP, hint="export the model with static input shapes") from exc


def _is_float(node) -> bool:
    import torch

    val = node.meta.get("val")
    return not isinstance(val, torch.Tensor) or val.dtype.is_floating_point


def _quantized_program(ep, example, calib: list[np.ndarray] | None, samples: int, dynamic: bool = False):
    """PT2E with XNNPACK's quantizer: observers inserted, the calibration samples run through them in
    chunks of the program's batch (dynamic: the example once, which only traces; its activations are
    quantized at run time), then folded into quantize/dequantize pairs and re-exported."""
    import torch
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e


    class FloatOnlyQuantizer(XNNPACKQuantizer):
        """XNNPACK's quantizer turns the scalars of add/mul into float tensor constants before annotating,
        also those of integer arithmetic (BERT's position indices are ``arange + 0``), and an index tensor
        that turns float fails; such a constant gets its integer user's dtype back, and integer tensors
        are never annotated."""

        def transform_for_annotation(self, model):
            model = super().transform_for_annotation(model)
            for node in model.graph.nodes:
                t = getattr(model, node.target, None) if node.op == "get_attr" else None
                ints = {u.meta["val"].dtype for u in node.users if not _is_float(u)}
                if isinstance(t, torch.Tensor) and t.dtype.is_floating_point and len(ints) == 1:
                    setattr(model, node.target, t.to(ints.pop()))
            return model

        def annotate(self, model):
            model = super().annotate(model)
            for node in model.graph.nodes:
                if "quantization_annotation" in node.meta and not _is_float(node):
                    del node.meta["quantization_annotation"]
            return model

    quantizer = FloatOnlyQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True,
                                                                                  is_dynamic=dynamic))
    prepared = prepare_pt2e(ep.module(), quantizer)
    batch = model_batch([tuple(x.shape) for x in example]) or 1
    cal = [x.numpy() for x in example] if dynamic else [np.asarray(x[:samples]) for x in calib]

    def observe(feed):
        with torch.no_grad():
            out = prepared(*[torch.from_numpy(np.ascontiguousarray(x)) for x in feed])
        return [np.zeros(len(feed[0]))] if out is not None else []

    run_batched(observe, cal, batch)
    return torch.export.export(convert_pt2e(prepared), example), (None if dynamic else int(len(cal[0])))


def _delegation(edge) -> dict:
    from executorch.devtools.backend_debug import get_delegation_info

    info = get_delegation_info(edge.exported_program().graph_module)
    portable = sorted(op for op, b in info.delegation_by_operator.items() if b.non_delegated)
    return {"delegate": "XnnpackBackend", "delegated_subgraphs": int(info.num_delegated_subgraphs),
            "delegated_nodes": int(info.num_delegated_nodes), "portable_nodes": int(info.num_non_delegated_nodes),
            "portable_ops": portable}


def run_pte_all(path: Path, io: IOSpec, xs: list[np.ndarray], threads: int = 1) -> list[np.ndarray]:
    """Every output of a .pte on ``xs`` (user layout and dtype), in ``io.outputs`` order, fed with the
    agent's own code (ExecuTorchRunner, tensors.prepare, tensors.restore_output) in chunks of its fixed batch."""

    agent = load_agent()
    ins = [s.model_dump(mode="json") for s in io.inputs]
    outs = [s.model_dump(mode="json") for s in io.outputs]
    try:
        runner = agent.runners.RUNNERS["executorch"](str(path), threads, ins, outs)
    except agent.AgentFailure as exc:
        raise ConversionError(f"the .pte does not load in ExecuTorch's runtime: {exc}", hop=HOP) from exc

    def once(feed: list[np.ndarray]) -> list[np.ndarray]:
        try:
            got = runner.run([agent.tensors.prepare(x, s) for x, s in zip(feed, ins)])
        except Exception as exc:  # the runtime raises RuntimeError naming the failed kernel/delegate
            raise ConversionError(f"the .pte fails in ExecuTorch's runtime: {str(exc).strip()[:400]}",
                                  hop=HOP) from exc
        return [agent.tensors.restore_output(y, s) for y, s in zip(got, outs)]

    return run_batched(once, list(xs), runner.static_batch())


def torch_to_executorch(source, out_path: str | Path, *, precision: str = "fp32", parity_inputs: list[np.ndarray],
                        calib: list[np.ndarray] | None = None, calibration_samples: int = CALIBRATION_SAMPLES,
                        parity_samples: int = 64, quantization: str = "full") -> Artifact:
    """Lower ``source.program`` to an XNNPACK-delegated .pte at ``out_path`` (int8: static activations
    calibrated on ``calib``, or ``quantization="dynamic"``) and check parity against the PyTorch
    reference on ``parity_inputs``."""
    if not available():
        raise MissingExtraError("executorch", "executorch", "PyTorch -> ExecuTorch conversion")
    if source.program is None:
        raise ConversionError("ExecuTorch conversion starts from a PyTorch model (.pt2, .pth+--arch or nn.Module); "
                              "it has no ONNX front end", hop=HOP, hint="give edgekit the PyTorch model")
    if precision not in PRECISIONS:
        raise ConversionError(f"edgekit's ExecuTorch hop makes {' and '.join(PRECISIONS)} programs, not {precision}",
                              hop=HOP)
    if quantization not in ("full", "dynamic"):
        raise ConversionError(f"ExecuTorch int8 quantization is full (static) or dynamic, not {quantization}", hop=HOP)
    dynamic = precision == "int8" and quantization == "dynamic"
    if precision == "int8" and not dynamic and not calib:
        raise ConversionError("int8 ExecuTorch (PT2E static quantization) is calibrated on your data, and none was "
                              "given", hop=HOP, hint="pass --calib-data CALIB.npz, or --quantization dynamic")
    from executorch import version as et_version
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    out_path = Path(out_path)
    if out_path.suffix != ".pte":
        raise ConversionError(f"{out_path.name}: an ExecuTorch program is saved as a .pte", hop=HOP,
                              hint="use --out model.pte")
    probe = [np.asarray(x[:parity_samples]) for x in parity_inputs]
    example = _example(source, probe)
    start = time.perf_counter()
    ep, fixed = _static_program(source, example)
    calibrated = None
    try:
        with quiet("executorch", "torchao", "torch"):
            if precision == "int8":
                ep, calibrated = _quantized_program(ep, example, list(calib) if calib else None,
                                                    calibration_samples, dynamic)
            edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
            delegation = _delegation(edge)
            program = edge.to_executorch()
    except ConversionError:
        raise
    except Exception as exc:  # export, quantizer, partitioner and emitter errors come from many layers
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        raise ConversionError(f"ExecuTorch lowering failed: {type(exc).__name__}: {first}", hop=HOP,
                              hint="the op named above has no ExecuTorch kernel or XNNPACK lowering; keep this "
                              "model on ONNX/TFLite") from exc
    seconds = time.perf_counter() - start
    src_io = source.artifact.io
    io = IOSpec(inputs=tuple(TensorSpec(name=s.name, shape=tuple(x.shape), dtype=s.dtype, layout=s.layout)
                             for s, x in zip(src_io.inputs, example)),
                outputs=src_io.outputs)
    with atomic_path(out_path) as tmp:
        tmp.write_bytes(program.buffer)
        gots = run_pte_all(tmp, io, probe)
    results = compare_outputs(source.reference_all(probe), gots, source.reference_name, [s.name for s in io.outputs])
    pm = parity_metrics(results, precision)
    metrics = {**pm, "route": "xnnpack", "precision": precision, "convert_seconds": round(seconds, 3),
               "delegation": delegation, "fixed_shapes": fixed, "chain_parity": pm["parity"]}
    config = {"precision": precision, "converter": "executorch", "executorch": et_version.__version__,
              "partitioner": "XnnpackPartitioner"}
    if precision == "int8":
        config["quantization"] = "dynamic" if dynamic else "full"
        config["quantizer"] = (f"XNNPACKQuantizer(symmetric, per-channel weights, "
                               f"{'dynamic' if dynamic else 'static'} activations)")
        metrics["calibration_samples"] = calibrated
    step = LineageStep(kind="convert", name=HOP, config=config, metrics=metrics,
                       seconds=round(time.perf_counter() - start, 3))
    return source.artifact.derive(out_path, fmt=Format.EXECUTORCH, io=io, step=step, precision=precision)


def executorch_hop(h) -> Artifact:
    """The registry's hop (``formats.FORMATS``' executorch row): a ``convert.hops.HopInput`` in. Parity
    runs on the eval inputs, else the calibration inputs, else seeded synthetic ones (static shapes)."""

    if h.source is None:
        raise ConversionError("ExecuTorch conversion needs the PyTorch model; this run started from ONNX", hop=HOP,
                              hint="give edgekit the .pt2 (or .pth with --arch)")
    cfg = h.config if h.config is not None else ExecutorchConfig(precision=h.precision)
    calib = list(h.calib.xs) if h.calib is not None else None
    xs = h.parity_inputs or calib or synthetic_inputs(h.source.artifact.io)
    h.progress(f"lowering PyTorch -> ExecuTorch (XNNPACK, {cfg.label})")
    return torch_to_executorch(h.source, h.out, precision=h.precision, parity_inputs=list(xs), calib=calib,
                               calibration_samples=cfg.calibration_samples, quantization=cfg.quantization)


__all__ = ["ExecutorchConfig", "torch_to_executorch", "executorch_hop", "run_pte_all", "available", "HOP", "PRECISIONS"]
