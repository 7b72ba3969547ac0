"""PyTorch -> Core ML (mlprogram) with coremltools: fp32, fp16, and int8 (8-bit linear weight
compression with ``coremltools.optimize.coreml``; activations stay float).

Core ML *prediction* runs only on macOS. On other hosts edgekit converts, validates the model spec
(program, inputs/outputs, weights) and says so: parity and profiling need a macOS host, and no
number is made up. On macOS the converted model is run on the eval inputs for parity.

Two things coremltools needs are done here and recorded in the lineage: a program exported from a
non-contiguous example (a view) is re-exported with contiguous inputs first (``reexport``), and
int64 inputs are declared int32, Core ML having no 64-bit integers (``input_casts``).
"""

from __future__ import annotations

import contextlib
import io
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..artifact import Artifact, IOSpec, LineageStep, TensorSpec
from ..errors import ConversionError, DeviceError, require
from ..formats import Format
from ..logs import quiet
from .parity import compare

HOP = "torch->coreml"
MACOS_NOTE = ("Core ML prediction needs macOS: the model was converted and its spec validated on this "
              f"{platform.system()} host, but parity and on-device profiling need a macOS host (or an iPhone "
              "reached from one)")


class CoremlConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    precision: Literal["fp32", "fp16", "int8"] = Field(
        "fp32", description="compute precision; int8 = 8-bit weight compression over an fp16 program")
    minimum_deployment_target: Literal["iOS16", "iOS17", "iOS18"] = "iOS16"
    parity_samples: int = Field(32, ge=1)


def can_predict() -> bool:
    return platform.system() == "Darwin"


_SPEC_DTYPES = {"FLOAT32": "float32", "FLOAT16": "float16", "DOUBLE": "float64", "INT32": "int32", "INT8": "int8"}


def _spec_dtype(feature) -> str | None:
    """The numpy name of a multiArray feature's element type (None for other feature kinds)."""
    if feature.type.WhichOneof("Type") != "multiArrayType":
        return None
    arr = feature.type.multiArrayType
    name = type(arr).ArrayDataType.Name(arr.dataType)
    return _SPEC_DTYPES.get(name, name.lower())


def validate_spec(path: Path, io_spec: IOSpec) -> dict:
    """Load the saved .mlpackage's spec (no prediction) and check it is a complete mlprogram whose
    inputs and outputs line up with the model's (same count, inputs in the same order)."""
    ct = require("coremltools", "coreml", "Core ML conversion")
    try:
        spec = ct.utils.load_spec(str(path))
    except Exception as exc:  # protobuf/IO errors: the package is not usable
        raise ConversionError(f"the saved Core ML package does not load: {exc}", hop=HOP) from exc
    kind = spec.WhichOneof("Type")
    if kind != "mlProgram":
        raise ConversionError(f"expected an mlprogram, got {kind}", hop=HOP)
    ins = [i.name for i in spec.description.input]
    outs = [o.name for o in spec.description.output]
    if len(ins) != len(io_spec.inputs) or len(outs) < 1:
        raise ConversionError(f"spec has inputs {ins} and outputs {outs}; the model has {len(io_spec.inputs)} inputs",
                              hop=HOP)
    if ins != [s.name for s in io_spec.inputs]:
        raise ConversionError(f"spec inputs {ins} are not the model's inputs {[s.name for s in io_spec.inputs]}",
                              hop=HOP)
    if io_spec.outputs and len(outs) != len(io_spec.outputs):
        raise ConversionError(f"spec has {len(outs)} outputs {outs}; the model has {len(io_spec.outputs)}", hop=HOP)
    funcs = list(spec.mlProgram.functions.keys())
    ops = sum(len(b.operations) for f in spec.mlProgram.functions.values() for b in f.block_specializations.values())
    if ops == 0:
        raise ConversionError("the converted program has no operations", hop=HOP)
    return {"spec_version": int(spec.specificationVersion), "inputs": ins, "outputs": outs, "functions": funcs,
            "operations": int(ops), "input_dtypes": [_spec_dtype(i) for i in spec.description.input],
            "output_dtypes": [_spec_dtype(o) for o in spec.description.output]}


def _user_input_values(ep) -> list:
    """The fake tensors torch.export recorded for the user inputs, in signature order."""
    users = set(ep.graph_signature.user_inputs)
    return [n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder" and n.name in users]


def _contiguous_program(ep, examples: list[np.ndarray] | None):
    """torch.export records each example input's strides in the program (and torch.export.save/load
    keeps them). coremltools 9 refuses any user input whose recorded dim order is not the contiguous
    one ("Core ML does not have general support for non-contiguous dim order", exir_utils.py), even
    though a Core ML input is a plain dense array and the graph's values do not depend on the input's
    memory layout. That happens whenever the example was a view: an HWC image permuted to CHW, a
    (T, C) feature matrix transposed to (C, T), a column of a token table. Re-tracing the program's
    own module with contiguous inputs of the same shapes and dtypes gives the same graph with
    contiguous layouts everywhere. Returns the program and what was changed (None when nothing)."""
    import torch

    vals = _user_input_values(ep)
    odd = {name: list(v.dim_order()) for name, v in zip(ep.graph_signature.user_inputs, vals)
           if isinstance(v, torch.Tensor) and tuple(v.dim_order()) != tuple(range(v.dim()))}
    if not odd:
        return ep, None
    args = []
    for k, v in enumerate(vals):
        shape = tuple(int(d) if isinstance(d, int) else 1 for d in v.shape)
        x = np.asarray(examples[k][0:1]) if examples is not None and k < len(examples) else None
        if x is not None and tuple(x.shape) == shape:  # the eval sample, when it fits, over zeros
            args.append(torch.from_numpy(np.ascontiguousarray(x)).to(v.dtype))
        else:
            args.append(torch.zeros(shape, dtype=v.dtype))
    try:
        contiguous = torch.export.export(ep.module(), tuple(args))
    except Exception as exc:  # torch.export raises many types (UserError, GuardOnDataDependent..., RuntimeError)
        raise ConversionError(f"inputs {sorted(odd)} were exported with a non-contiguous memory layout "
                              f"(dim order {odd}), which Core ML cannot take, and re-exporting the program with "
                              f"contiguous inputs failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
                              hop=HOP, hint="export the model with contiguous example inputs "
                              "(x.contiguous()) and save the .pt2 again") from exc
    check = _retrace_parity(ep, contiguous, args, examples, vals)
    if check.violations("fp32"):
        raise ConversionError("re-exporting the program with contiguous inputs changed its outputs: "
                              + "; ".join(check.violations("fp32")), hop=HOP,
                              hint="export the model with contiguous example inputs (x.contiguous()) and save "
                              "the .pt2 again")
    return contiguous, {"reason": "non-contiguous input dim order", "input_dim_order": odd,
                        "retrace_parity": check.to_dict()}


def _retrace_parity(original, retraced, args, examples, vals, limit: int = 8):
    """Both programs run in PyTorch on the same inputs (the eval samples when given): every output
    must agree, so the re-export is known to be the same model, on any host."""
    import torch

    batches = [list(args)]
    if examples is not None and len(examples) == len(vals):
        batches = [[torch.from_numpy(np.ascontiguousarray(x[i:i + 1])).to(v.dtype) for x, v in zip(examples, vals)]
                   for i in range(min(limit, len(examples[0])))]
        if any(tuple(a.shape) != tuple(b.shape) for a, b in zip(batches[0], args)):
            batches = [list(args)]
    ref, got = [], []
    with torch.no_grad():
        m0, m1 = original.module(), retraced.module()
        for xs in batches:
            for outs, m in ((ref, m0), (got, m1)):
                o = m(*xs)
                outs.append(np.concatenate([np.asarray(t.detach().float().numpy()).ravel()
                                            for t in (o if isinstance(o, (tuple, list)) else (o,))]))
    return compare(np.stack(ref), np.stack(got), "pytorch (as exported)")


def _convert_program(ct, ep, inputs, cfg: CoremlConfig):
    """Convert the ATen-level program; when coremltools lacks a lowering for a composite op
    (e.g. aten.gru), convert again after PyTorch's core-ATen decompositions, which spell it out in
    ops it has. Returns the model and which decomposition was used."""
    kwargs = dict(inputs=inputs, convert_to="mlprogram",
                  compute_precision=ct.precision.FLOAT32 if cfg.precision == "fp32" else ct.precision.FLOAT16,
                  minimum_deployment_target=getattr(ct.target, cfg.minimum_deployment_target),
                  skip_model_load=not can_predict())
    try:
        return ct.convert(_without_aliases(ep.run_decompositions({})), **kwargs), "aten"
    except NotImplementedError as exc:
        if "Unsupported fx node" not in str(exc):
            raise
        return ct.convert(_without_aliases(ep.run_decompositions()), **kwargs), "core-aten"


def _without_aliases(ep):
    """``aten.alias`` (a no-op view that survives every decomposition table, e.g. in transformers'
    BERT attention) has no coremltools lowering: each one is replaced by its input. The program is
    a fresh copy from run_decompositions, so the user's program is untouched."""
    import torch

    g = ep.graph_module.graph
    outputs = {a for n in g.nodes if n.op == "output" for a in n.all_input_nodes}
    changed = False
    for n in list(g.nodes):
        if n.op == "call_function" and n.target is torch.ops.aten.alias.default and n not in outputs:
            n.replace_all_uses_with(n.args[0])
            g.erase_node(n)
            changed = True
    if changed:
        ep.graph_module.recompile()
    return ep


def torch_to_coreml(source, out_path: str | Path, cfg: CoremlConfig | None = None, *,
                    parity_inputs: list[np.ndarray] | None = None) -> Artifact:
    cfg = cfg or CoremlConfig()
    if source.program is None:
        raise ConversionError("Core ML conversion starts from a PyTorch model (.pt2, .pth+--arch or nn.Module); "
                              "coremltools has no ONNX front end", hop=HOP,
                              hint="give edgekit the PyTorch model instead of the .onnx")
    ct = require("coremltools", "coreml", "Core ML conversion")
    out_path = Path(out_path)
    if out_path.suffix != ".mlpackage":
        raise ConversionError(f"{out_path.name}: an mlprogram is saved as a .mlpackage folder", hop=HOP,
                              hint="use --out model.mlpackage")
    start = time.perf_counter()
    ep, reexport = _contiguous_program(source.program, parity_inputs)
    # Core ML has no 64-bit integer tensors: coremltools maps int64 to int32 whatever is declared, so
    # declare int32 and say so (token ids and masks fit; the caller feeds int32 arrays)
    casts = {s.name: "int64->int32" for s in source.artifact.io.inputs if np.dtype(s.dtype) == np.int64}
    inputs = [ct.TensorType(name=s.name, shape=tuple(d if d is not None else 1 for d in s.shape),
                            dtype=np.int32 if s.name in casts else np.dtype(s.dtype).type)
              for s in source.artifact.io.inputs]
    work = Path(tempfile.mkdtemp(prefix=".edgekit-coreml-", dir=out_path.parent if out_path.parent.exists() else None))
    try:
        try:
            # coremltools draws tqdm progress bars on stderr: keep the CLI's output readable
            with quiet("coremltools"), contextlib.redirect_stderr(io.StringIO()):
                mlmodel, decomposition = _convert_program(ct, ep, inputs, cfg)
                if cfg.precision == "int8":
                    from coremltools.optimize.coreml import (
                        OpLinearQuantizerConfig,
                        OptimizationConfig,
                        linear_quantize_weights,
                    )

                    opt = OptimizationConfig(global_config=OpLinearQuantizerConfig(mode="linear_symmetric",
                                                                                 dtype="int8"))
                    mlmodel = linear_quantize_weights(mlmodel, config=opt)
        except Exception as exc:  # coremltools raises NotImplementedError/ValueError/RuntimeError per op
            msg = str(exc).splitlines()[0][:400] if str(exc) else ""
            missing_op = "Unsupported fx node" in msg or "not implemented" in msg.lower()
            raise ConversionError(f"coremltools failed: {type(exc).__name__}: {msg}", hop=HOP,
                                  hint=("an op without a Core ML lowering is named above; rewrite it in the model "
                                        "or keep this model on ONNX/TFLite") if missing_op else
                                  "coremltools refused the program for the reason above (not a missing op); keep "
                                  "this model on ONNX/TFLite or report it with that message") from exc
        seconds = time.perf_counter() - start
        staged = work / out_path.name
        mlmodel.save(str(staged))
        spec_info = validate_spec(staged, source.artifact.io)
        metrics: dict = {"spec": spec_info, "precision": cfg.precision, "convert_seconds": round(seconds, 3),
                         "decomposition": decomposition, "input_casts": casts, "reexport": reexport}
        if can_predict() and parity_inputs is not None:
            probe = [np.asarray(x[: cfg.parity_samples]) for x in parity_inputs]
            outs = []
            for i in range(len(probe[0])):
                res = mlmodel.predict({s.name: probe[k][i:i + 1].astype(np.int32 if s.name in casts else s.dtype)
                                       for k, s in enumerate(source.artifact.io.inputs)})
                outs.append(np.asarray(res[spec_info["outputs"][0]]))
            parity = compare(source.reference(probe), np.concatenate(outs), source.reference_name)
            metrics["parity"] = parity.to_dict()
            metrics["parity_violations"] = parity.violations("int8" if cfg.precision == "int8" else cfg.precision)
        else:
            metrics["parity"] = None
            metrics["parity_reason"] = MACOS_NOTE
        if out_path.exists():
            shutil.rmtree(out_path) if out_path.is_dir() else out_path.unlink()
        staged.replace(out_path)  # same filesystem: a rename, so no half-written package at out_path
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # the Core ML model's own I/O: spec names, and the dtypes it takes (int32 where PyTorch had int64)
    io_spec = IOSpec(inputs=tuple(TensorSpec(name=n, shape=s.shape, dtype=d or s.dtype, layout=s.layout)
                                  for n, d, s in zip(spec_info["inputs"], spec_info["input_dtypes"],
                                                     source.artifact.io.inputs)),
                     outputs=tuple(TensorSpec(name=n, shape=s.shape, dtype=d or s.dtype)
                                   for n, d, s in zip(spec_info["outputs"], spec_info["output_dtypes"],
                                                      source.artifact.io.outputs)))
    step = LineageStep(kind="convert", name=HOP, config={**cfg.model_dump(mode="json"), "converter": "coremltools",
                                                         "coremltools": ct.__version__}, metrics=metrics,
                       seconds=round(time.perf_counter() - start, 3))
    return source.artifact.derive(out_path, fmt=Format.COREML, io=io_spec, step=step,
                                  precision="int8" if cfg.precision == "int8" else cfg.precision)


__all__ = ["CoremlConfig", "torch_to_coreml", "validate_spec", "can_predict", "MACOS_NOTE", "HOP"]


def set_aside_coreml(variants: dict, target) -> tuple[dict, list[str]]:
    """Core ML variants cannot be measured by this host's agent. On a Core ML target (iPhone) that
    is the whole run: raise a clear error after conversion and validation. Elsewhere, keep the
    other variants and say which Core ML ones were converted but not measured."""

    coreml = {n: a for n, a in variants.items() if a.format == Format.COREML}
    if not coreml:
        return variants, []
    listing = ", ".join(f"{n} ({a.path.name}, {a.size_bytes / 1e6:.2f} MB, spec validated)" for n, a in coreml.items())
    if target.runtimes and target.runtimes[0] == "coreml":
        raise DeviceError(f"converted and validated the Core ML variants {listing}; measuring them on "
                          f"'{target.name}' needs a macOS host: {MACOS_NOTE}",
                          hint=f"the .mlpackage files are in {next(iter(coreml.values())).path.parent}; "
                          "profile them from a Mac (Xcode Instruments / coremltools on macOS)")
    rest = {n: a for n, a in variants.items() if n not in coreml}
    return rest, [f"Core ML variants not measured on '{target.name}': {listing}. {MACOS_NOTE}"]
