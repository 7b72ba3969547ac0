"""What the user hands edgekit: a torch.export program (.pt2), an ONNX file, an nn.Module with
example inputs (Python API), or a pickled state dict loaded only with ``weights_only=True``
beside an architecture given as ``module:Class``. Anything else is refused with the reason.

The result is a :class:`Source`: the starting Artifact plus a reference callable that gives the
float outputs every later hop is compared against.
"""

from __future__ import annotations

import importlib
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .artifact import Artifact, IOSpec, LineageStep, TensorSpec
from .errors import ModelLoadError
from .formats import Format, detect_format


@dataclass
class Source:
    artifact: Artifact  # format torch (.pt2) or onnx
    reference: Callable[[list[np.ndarray]], np.ndarray]  # first output, float32, batch in = batch out
    reference_name: str  # "pytorch" or "onnx (source)"
    program: Any = None  # torch.export.ExportedProgram when the source is PyTorch


def _torch_dtype_name(dt) -> str:
    return str(dt).replace("torch.", "")


def _io_from_program(ep) -> IOSpec:
    import torch

    sig = ep.graph_signature
    user_inputs = list(sig.user_inputs)
    nodes = {n.name: n for n in ep.graph.nodes}
    inputs = []
    for name in user_inputs:
        val = nodes[name].meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise ModelLoadError(f"model input {name!r} is not a tensor; edgekit takes tensor inputs only")
        shape = tuple(int(d) if isinstance(d, int) else None for d in val.shape)
        inputs.append(TensorSpec(name=name, shape=shape, dtype=_torch_dtype_name(val.dtype),
                                 layout="NCHW" if len(shape) == 4 else None))
    outputs = []
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    for i, arg in enumerate(out_node.args[0]):
        val = getattr(arg, "meta", {}).get("val")
        if isinstance(val, torch.Tensor):
            outputs.append(TensorSpec(name=f"output_{i}", shape=tuple(int(d) if isinstance(d, int) else None for d in val.shape),
                                      dtype=_torch_dtype_name(val.dtype)))
    return IOSpec(inputs=tuple(inputs), outputs=tuple(outputs))


def _program_reference(ep) -> Callable[[list[np.ndarray]], np.ndarray]:
    import torch

    module = ep.module()

    def run(xs: list[np.ndarray]) -> np.ndarray:
        outs = []
        n = len(xs[0])
        with torch.no_grad():
            for i in range(n):  # the exported program has a static batch of 1
                args = [torch.from_numpy(np.ascontiguousarray(x[i:i + 1])) for x in xs]
                out = module(*args)
                if isinstance(out, (tuple, list)):
                    out = out[0]
                outs.append(out.detach().float().numpy())
        return np.concatenate(outs, axis=0)

    return run


def from_program(ep, path: Path, lineage_name: str = "torch.export") -> Source:
    io = _io_from_program(ep)
    art = Artifact.from_file(path, Format.TORCH, io, lineage=[LineageStep(kind="source", name=lineage_name,
                                                                          config={"path": str(path)})])
    return Source(artifact=art, reference=_program_reference(ep), reference_name="pytorch", program=ep)


def load_pt2(path: Path) -> Source:
    import torch

    try:
        ep = torch.export.load(str(path))
    except (zipfile.BadZipFile, RuntimeError, ValueError, KeyError, EOFError, OSError) as exc:
        raise ModelLoadError(
            f"{path} is not a readable torch.export program ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})",
            hint="save it with torch.export.save(torch.export.export(model.eval(), example_inputs), 'model.pt2')",
        ) from exc
    return from_program(ep, path)


def onnx_io(model) -> IOSpec:
    from onnx import helper

    init_names = {i.name for i in model.graph.initializer}

    def spec(v) -> TensorSpec:
        t = v.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
        dtype = str(helper.tensor_dtype_to_np_dtype(t.elem_type))
        return TensorSpec(name=v.name, shape=shape, dtype=dtype, layout="NCHW" if len(shape) == 4 else None)

    return IOSpec(inputs=tuple(spec(v) for v in model.graph.input if v.name not in init_names),
                  outputs=tuple(spec(v) for v in model.graph.output))


def ort_reference(path: Path, threads: int = 1) -> Callable[[list[np.ndarray]], np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
    ins = sess.get_inputs()
    static_batch = any(isinstance(i.shape[0], int) for i in ins if i.shape)

    def run(xs: list[np.ndarray]) -> np.ndarray:
        feeds = [np.ascontiguousarray(x.astype(np.dtype(_ort_np(i.type)), copy=False)) for x, i in zip(xs, ins)]
        if not static_batch:
            return sess.run(None, {i.name: f for i, f in zip(ins, feeds)})[0].astype(np.float32)
        outs = [sess.run(None, {i.name: f[k:k + 1] for i, f in zip(ins, feeds)})[0] for k in range(len(feeds[0]))]
        return np.concatenate(outs, axis=0).astype(np.float32)

    return run


def _ort_np(ort_type: str) -> str:
    return {"tensor(float)": "float32", "tensor(double)": "float64", "tensor(int64)": "int64",
            "tensor(int32)": "int32", "tensor(int8)": "int8", "tensor(uint8)": "uint8",
            "tensor(float16)": "float16", "tensor(bool)": "bool"}.get(ort_type, "float32")


def load_onnx(path: Path) -> Source:
    import onnx

    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as exc:  # onnx raises DecodeError, ValidationError, OSError...: all mean "unusable file"
        raise ModelLoadError(
            f"{path} is not a valid ONNX model ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})",
            hint="re-export it (torch.onnx.export) or check the file was copied completely",
        ) from exc
    try:
        ref = ort_reference(path)
    except Exception as exc:
        raise ModelLoadError(f"onnxruntime cannot load {path}: {str(exc).splitlines()[0][:300]}",
                             hint="check the opset and ops are supported by onnxruntime") from exc
    art = Artifact.from_file(path, Format.ONNX, onnx_io(model),
                             lineage=[LineageStep(kind="source", name="onnx", config={"path": str(path)})])
    return Source(artifact=art, reference=ref, reference_name="onnx (source)")


def load_tflite(path: Path) -> Source:
    """A .tflite to profile as it is: its own I/O is the user's data layout, its host run the reference."""
    from .errors import require

    interp_mod = require("ai_edge_litert.interpreter", "tflite", "loading a .tflite model")
    try:
        interp = interp_mod.Interpreter(model_path=str(path))
        interp.allocate_tensors()
    except Exception as exc:  # LiteRT raises ValueError/RuntimeError for a bad flatbuffer
        raise ModelLoadError(f"{path} is not a loadable TFLite model: {str(exc).splitlines()[0][:200]}",
                             hint="check the file was copied completely, or re-convert it") from exc

    def spec(d) -> TensorSpec:
        scale, zp = (d.get("quantization") or (0.0, 0))[:2]
        return TensorSpec(name=d["name"], shape=tuple(int(x) for x in d["shape"]), dtype=str(np.dtype(d["dtype"])),
                          scale=float(scale) if scale else None, zero_point=int(zp) if scale else None)

    io = IOSpec(inputs=tuple(spec(d) for d in interp.get_input_details()),
                outputs=tuple(spec(d) for d in interp.get_output_details()))
    ins, outs = interp.get_input_details(), interp.get_output_details()

    def run(xs: list[np.ndarray]) -> np.ndarray:
        res = []
        for k in range(len(xs[0])):
            for d, x in zip(ins, xs):
                v = x[k:k + 1]
                if d["quantization"][0]:
                    sc, z = d["quantization"][:2]
                    info = np.iinfo(d["dtype"])
                    v = np.clip(np.round(v / sc + z), info.min, info.max)
                interp.set_tensor(d["index"], np.ascontiguousarray(v.astype(d["dtype"])))
            interp.invoke()
            y = interp.get_tensor(outs[0]["index"])
            if outs[0]["quantization"][0]:
                sc, z = outs[0]["quantization"][:2]
                y = (y.astype(np.float32) - z) * sc
            res.append(y.astype(np.float32))
        return np.concatenate(res, axis=0)

    kinds = {str(np.dtype(t["dtype"])) for t in interp.get_tensor_details()}
    precision = "int8" if kinds & {"int8", "uint8"} else ("fp16" if "float16" in kinds else "fp32")
    art = Artifact.from_file(path, Format.TFLITE, io, precision=precision,
                             lineage=[LineageStep(kind="source", name="tflite", config={"path": str(path)})])
    return Source(artifact=art, reference=run, reference_name="tflite (source, host LiteRT)")


def import_object(spec: str) -> Any:
    """Import ``module:attr`` (the module may be a dotted path or a .py file path)."""
    if ":" not in spec:
        raise ModelLoadError(f"architecture {spec!r} is not in the form module:Class",
                             hint="e.g. --arch mypkg.models:DigitsCNN or --arch path/to/models.py:DigitsCNN")
    mod_name, attr = spec.rsplit(":", 1)
    try:
        if mod_name.endswith(".py"):
            p = Path(mod_name).resolve()
            spec_ = importlib.util.spec_from_file_location(p.stem, p)
            if spec_ is None or spec_.loader is None:
                raise ImportError(f"cannot import {p}")
            module = importlib.util.module_from_spec(spec_)
            sys.modules[p.stem] = module
            spec_.loader.exec_module(module)
        else:
            module = importlib.import_module(mod_name)
    except Exception as exc:
        raise ModelLoadError(f"cannot import {mod_name!r} for architecture {spec!r}: {exc}",
                             hint="check the module is on PYTHONPATH (or give a .py path) and imports cleanly") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise ModelLoadError(f"module {mod_name!r} has no {attr!r}") from exc


def load_state_dict_model(path: Path, arch: str, example_inputs: tuple, workdir: Path) -> Source:
    import torch

    cls = import_object(arch)
    try:
        model = cls()
    except TypeError as exc:
        raise ModelLoadError(f"{arch} cannot be built without arguments ({exc})",
                             hint="point --arch at a factory function that takes no arguments") from exc
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError/RuntimeError for anything not a plain state dict
        raise ModelLoadError(
            f"{path} cannot be loaded with torch.load(weights_only=True): {str(exc).splitlines()[0][:200]}",
            hint="edgekit only loads plain state dicts (torch.save(model.state_dict(), path)); "
            "arbitrary pickles can run code and are refused",
        ) from exc
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ModelLoadError(f"{path} holds a {type(state).__name__}, not a state dict")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ModelLoadError(f"{path} does not match architecture {arch}: {str(exc).splitlines()[0][:300]}") from exc
    return from_module(model, example_inputs, workdir, lineage_name=f"state_dict+{arch}")


def from_module(model, example_inputs: tuple, workdir: Path, lineage_name: str = "nn.Module") -> Source:
    import torch

    model = model.eval()
    args = tuple(torch.as_tensor(np.asarray(x)) if not isinstance(x, torch.Tensor) else x for x in example_inputs)
    try:
        ep = torch.export.export(model, args)
    except Exception as exc:
        raise ModelLoadError(f"torch.export could not capture the model: {str(exc).splitlines()[0][:300]}",
                             hint="see https://pytorch.org/docs/stable/export.html for what torch.export supports") from exc
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "model.pt2"
    torch.export.save(ep, str(path))
    return from_program(ep, path, lineage_name)


def load_source(model: Any, *, example_inputs: tuple | None = None, arch: str | None = None,
                workdir: Path) -> Source:
    """Load whatever the user gave as the model; see the module docstring."""
    try:
        import torch

        is_module = isinstance(model, torch.nn.Module)
    except ImportError:
        is_module = False
    if is_module:
        if example_inputs is None:
            raise ModelLoadError("an nn.Module needs example_inputs (a tuple of tensors with batch size 1)")
        return from_module(model, example_inputs, workdir)
    path = Path(model)
    if not path.exists():
        raise ModelLoadError(f"model file {path} not found", hint="check the path")
    if path.suffix.lower() in (".pt", ".pth"):
        if not arch:
            raise ModelLoadError(
                f"{path.name} is a pickled checkpoint: edgekit loads it only with torch.load(weights_only=True) "
                "together with its architecture",
                hint="pass --arch module:Class, or save a torch.export program (.pt2) instead",
            )
        if example_inputs is None:
            raise ModelLoadError("a state dict needs an example input shape to export the model",
                                 hint="give --eval-data (its first sample is used) or --input-shape 1,3,224,224")
        return load_state_dict_model(path, arch, example_inputs, workdir)
    fmt = detect_format(path)
    if fmt == Format.TORCH:
        return load_pt2(path)
    if fmt == Format.ONNX:
        return load_onnx(path)
    if fmt == Format.TFLITE:
        return load_tflite(path)
    raise ModelLoadError(f"{path.name}: edgekit starts from PyTorch, ONNX or (to profile as is) TFLite, not {fmt.value}",
                         hint="give the .pt2 or .onnx the model was converted from")
