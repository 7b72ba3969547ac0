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

from ..artifact import Artifact, IOSpec, LineageStep, TensorSpec
from ..errors import DataError, ModelLoadError, require
from ..formats import Format, detect_format, format_spec


@dataclass
class Source:
    artifact: Artifact  # format torch (.pt2) or onnx
    reference: Callable[[list[np.ndarray]], np.ndarray]  # first output, float32, batch in = batch out
    reference_name: str  # "pytorch" or "onnx (source)"
    program: Any = None  # torch.export.ExportedProgram when the source is PyTorch
    # every output, in the model's order: float outputs as float32, integer/bool outputs keep their dtype
    reference_all: Callable[[list[np.ndarray]], list[np.ndarray]] | None = None
    # one run on a whole feed (every model input, in order) -> every output: what a stateful model's
    # reference runs sample by sample (edgekit/inputs/stateful.py); None when the source cannot give it
    run_once: Callable[[list[np.ndarray]], list[np.ndarray]] | None = None

    def __post_init__(self):
        if self.reference_all is None:  # a Source built by hand with only the first output
            first = self.reference
            self.reference_all = lambda xs: [first(xs)]


DEFAULT_CHUNK = 64  # samples per run when the model's batch axis is dynamic


def _as_output(y) -> np.ndarray:
    y = np.asarray(y)
    return y.astype(np.float32, copy=False) if y.dtype.kind == "f" else y


def model_batch(shapes) -> int | None:
    """The static batch size the model takes (first axis of its inputs), None when it is dynamic.
    ``shapes`` are the inputs' shapes, None for a dynamic axis."""
    firsts = {s[0] for s in shapes if s}
    firsts.discard(None)
    return int(min(firsts)) if firsts else None


def shares_samples(xs) -> bool:
    """Whether the arrays share a first (sample) axis; a model whose inputs do not (a matrix product
    of a 2x3 and a 3x4 input) takes them whole, in one run."""
    return len({len(x) if np.ndim(x) else None for x in xs}) <= 1


def unbatched(shapes) -> bool:
    """Static first axes that differ between inputs: the model has no common batch axis."""
    return len({s[0] for s in shapes if s and s[0] is not None}) > 1


def run_batched(fn: Callable[[list[np.ndarray]], list[np.ndarray]], xs: list[np.ndarray], batch: int | None,
                chunk: int = DEFAULT_CHUNK) -> list[np.ndarray]:
    """Run ``fn`` over ``xs`` (samples on the first axis) in chunks of exactly ``batch`` samples when
    the model's batch is static (the last chunk padded by repeating its samples, the padding trimmed
    from the outputs), or in chunks of ``chunk`` when it is dynamic. Returns every output, the chunks
    joined on the first axis (an output whose first axis is not the batch is stacked per chunk)."""
    n = len(xs[0]) if xs else 0
    if n == 0 or not shares_samples(xs):  # inputs without a common sample axis are one run as they are
        return [np.asarray(y) for y in fn(list(xs))]
    size = batch or chunk
    parts: list[list[np.ndarray]] = []
    for k in range(0, n, size):
        m = min(size, n - k)
        if batch and m < batch:
            idx = k + (np.arange(batch) % m)  # pad with this chunk's own samples
            feed = [np.ascontiguousarray(x[idx]) for x in xs]
        else:
            feed = [np.ascontiguousarray(x[k:k + m]) for x in xs]
        outs = [np.asarray(y) for y in fn(feed)]
        parts.append([y[:m] if (batch and y.ndim and y.shape[0] == batch) else y for y in outs])
    if len(parts) == 1:
        return parts[0]
    joined = []
    for j in range(len(parts[0])):
        ys = [p[j] for p in parts]
        per_sample = all(y.ndim and y.shape[0] == (min(size, n - i * size)) for i, y in enumerate(ys))
        joined.append(np.concatenate(ys, axis=0) if per_sample else np.stack(ys))
    return joined


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


def _program_once(ep) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    import torch

    module = ep.module()

    def once(feed: list[np.ndarray]) -> list[np.ndarray]:
        with torch.no_grad():
            out = module(*[torch.from_numpy(np.asarray(x, order="C")) for x in feed])
        outs = out if isinstance(out, (tuple, list)) else [out]
        return [_as_output(o.detach().numpy()) for o in outs if isinstance(o, torch.Tensor)]

    return once


def _first(run_all: Callable[[list[np.ndarray]], list[np.ndarray]]) -> Callable[[list[np.ndarray]], np.ndarray]:
    return lambda xs: np.asarray(run_all(xs)[0]).astype(np.float32)


def from_program(ep, path: Path, lineage_name: str = "torch.export") -> Source:
    io = _io_from_program(ep)
    art = Artifact.from_file(path, Format.TORCH, io, lineage=[LineageStep(kind="source", name=lineage_name,
                                                                          config={"path": str(path)})])
    once, batch = _program_once(ep), model_batch([s.shape for s in io.inputs])
    ref_all = lambda xs: run_batched(once, list(xs), batch)  # noqa: E731
    return Source(artifact=art, reference=_first(ref_all), reference_name="pytorch", program=ep, reference_all=ref_all,
                  run_once=once)


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
        shape = tuple(onnx_dim(d) for d in t.shape.dim)
        dtype = str(helper.tensor_dtype_to_np_dtype(t.elem_type))
        return TensorSpec(name=v.name, shape=shape, dtype=dtype, layout="NCHW" if len(shape) == 4 else None)

    return IOSpec(inputs=tuple(spec(v) for v in model.graph.input if v.name not in init_names),
                  outputs=tuple(spec(v) for v in model.graph.output))


def ort_reference_all(path: Path, threads: int = 1, *, optimized: bool = True
                      ) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    """Every output of an ONNX model on onnxruntime, fed in chunks of its static batch size.
    ``optimized=False`` runs the graph as written (no fusion): a QDQ model then computes exactly what its
    Quantize/DequantizeLinear nodes say, the same on every CPU, where the fused integer kernels differ by
    ISA (x86 u8s8 without VNNI saturates pairs of products at int16)."""
    once, batch = ort_once(path, threads, optimized=optimized)
    return lambda xs: run_batched(once, list(xs), batch)


def ort_once(path: Path, threads: int = 1, *, optimized: bool = True
             ) -> tuple[Callable[[list[np.ndarray]], list[np.ndarray]], int | None]:
    """One onnxruntime run of an ONNX model on a whole feed (every input, in order) -> every output, and
    the model's static batch (None: dynamic)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    if not optimized:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    try:
        sess = ort.InferenceSession(str(Path(path).resolve()), sess_options=so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime dropped kernels of the oldest opsets: try the model upgraded
        upgraded = _upgraded_opset(Path(path))
        if upgraded is None:
            raise
        try:
            sess = ort.InferenceSession(upgraded, sess_options=so, providers=["CPUExecutionProvider"])
        except Exception:  # the upgrade did not help: the original error is the one to report
            raise exc from None
    ins = sess.get_inputs()
    batch = model_batch([tuple(d if isinstance(d, int) else None for d in i.shape) for i in ins])

    def once(feed: list[np.ndarray]) -> list[np.ndarray]:
        if len(feed) < len(ins):
            raise _unfed(Path(path), [i.name for i in ins], len(feed))
        feeds = {i.name: np.asarray(x.astype(np.dtype(_ort_np(i.type)), copy=False), order="C")  # 0-d stays 0-d
                 for x, i in zip(feed, ins)}
        return [_as_output(y) for y in sess.run(None, feeds)]

    return once, batch


def _unfed(path: Path, names: list[str], fed: int):
    return DataError(f"{path.name} takes {len(names)} inputs ({', '.join(names)}) and this host-side run fed "
                     f"{fed}: inputs {', '.join(names[fed:])} are fed (--const/--state) only where edgekit carries them "
                     "(the reference outputs, the eval pass on the device and the host filter, static INT8 "
                     "calibration), not in this step",
                     hint="a streaming model's state or constants: see docs/guides/streams.md")


REFERENCE_OPSET = 13


def _upgraded_opset(path: Path) -> bytes | None:
    """The model converted to opset 13 by onnx's own version converter (a semantics-preserving
    rewrite), for models older than onnxruntime still runs (e.g. opset 6 Gemm/AveragePool); None
    when it is not older or cannot be converted."""
    import onnx
    from onnx import version_converter

    try:
        model = onnx.load(str(path))
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
        if opset is None or opset >= REFERENCE_OPSET:
            return None
        model.ir_version = max(model.ir_version, 7)  # initializers need not be graph inputs from IR 4 on
        return version_converter.convert_version(model, REFERENCE_OPSET).SerializeToString()
    except Exception:  # the converter raises for ops it cannot upgrade: no upgraded reference
        return None


def ort_reference(path: Path, threads: int = 1, *, optimized: bool = True) -> Callable[[list[np.ndarray]], np.ndarray]:
    """The first output of an ONNX model on onnxruntime, as float32 (``optimized``: see ort_reference_all)."""
    return _first(ort_reference_all(path, threads, optimized=optimized))


def _ort_np(ort_type: str) -> str:
    return {"tensor(float)": "float32", "tensor(double)": "float64", "tensor(int64)": "int64",
            "tensor(int32)": "int32", "tensor(int8)": "int8", "tensor(uint8)": "uint8",
            "tensor(float16)": "float16", "tensor(bool)": "bool"}.get(ort_type, "float32")


def load_onnx(path: Path) -> Source:
    import onnx

    try:
        model = onnx.load(str(path))
    except Exception as exc:  # onnx raises DecodeError, OSError...: all mean "unusable file"
        raise ModelLoadError(
            f"{path} is not a valid ONNX model ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})",
            hint="re-export it (torch.onnx.export) or check the file was copied completely",
        ) from exc
    if not model.graph.node and not model.graph.output:
        raise ModelLoadError(f"{path} holds no ONNX graph (an empty or foreign protobuf file)",
                             hint="re-export it (torch.onnx.export) or check the file was copied completely")
    checker_error = None
    try:
        onnx.checker.check_model(model)
    except Exception as exc:  # the checker is stricter than the runtimes (e.g. old IR versions): ask onnxruntime
        checker_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    try:
        once, batch = ort_once(path)
    except Exception as exc:  # onnxruntime's InvalidGraph, NotImplemented, Fail...
        what = f" (onnx.checker: {checker_error})" if checker_error else ""
        raise ModelLoadError(f"onnxruntime cannot load {path}: {str(exc).splitlines()[0][:300] if str(exc) else ''}{what}",
                             hint="check the file is a complete ONNX model whose opset and ops onnxruntime "
                             "supports (re-export it with a newer opset)") from exc
    config = {"path": str(path)}
    if checker_error:
        config["checker_warning"] = checker_error  # it runs on onnxruntime, which is the reference
    art = Artifact.from_file(path, Format.ONNX, onnx_io(model),
                             lineage=[LineageStep(kind="source", name="onnx", config=config)])
    ref_all = lambda xs: run_batched(once, list(xs), batch)  # noqa: E731
    return Source(artifact=art, reference=_first(ref_all), reference_name="onnx (source)", reference_all=ref_all,
                  run_once=once)


def load_tflite(path: Path) -> Source:
    """A .tflite to profile as it is: its own I/O is the user's data layout, its host run the reference."""

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

    def once(feed: list[np.ndarray]) -> list[np.ndarray]:
        for d, v in zip(ins, feed):
            if d["quantization"][0]:
                sc, z = d["quantization"][:2]
                info = np.iinfo(d["dtype"])
                v = np.clip(np.round(v / sc + z), info.min, info.max)
            interp.set_tensor(d["index"], np.ascontiguousarray(v.astype(d["dtype"])))
        interp.invoke()
        res = []
        for o in outs:
            y = interp.get_tensor(o["index"])
            if o["quantization"][0]:
                sc, z = o["quantization"][:2]
                y = (y.astype(np.float32) - z) * sc
            res.append(_as_output(y))
        return res

    batch = model_batch([tuple(int(x) for x in d["shape"]) for d in ins]) or 1

    def run_all(xs: list[np.ndarray]) -> list[np.ndarray]:
        return run_batched(once, list(xs), batch)

    kinds = {str(np.dtype(t["dtype"])) for t in interp.get_tensor_details()}
    precision = "int8" if kinds & {"int8", "uint8"} else ("fp16" if "float16" in kinds else "fp32")
    art = Artifact.from_file(path, Format.TFLITE, io, precision=precision,
                             lineage=[LineageStep(kind="source", name="tflite", config={"path": str(path)})])
    return Source(artifact=art, reference=_first(run_all), reference_name="tflite (source, host LiteRT)",
                  reference_all=run_all)


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
    loader = format_spec(fmt).source_loader  # the format registry names the loader of each format
    if loader is not None:
        mod, _, name = loader.partition(":")
        return getattr(importlib.import_module(mod), name)(path)
    raise ModelLoadError(f"{path.name}: edgekit starts from PyTorch, ONNX or (to profile as is) TFLite, not {fmt.value}",
                         hint="give the .pt2 or .onnx the model was converted from")


SYNTHETIC_SAMPLES = 8  # at least this many synthetic samples (a whole number of the model's static batches)


def onnx_dim(d) -> int | None:
    """An ONNX dimension's fixed size, None when it is symbolic, unset, or written as -1/0 (exporters
    such as paddle2onnx mark a dynamic axis with dim_value -1)."""
    return int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else None


def synthetic_inputs(io: IOSpec, *, input_shapes: dict[str, tuple[int, ...] | list[int]] | None = None,
                     samples: int = SYNTHETIC_SAMPLES, seed: int = 0) -> list[np.ndarray]:
    """Seeded stand-in inputs for a model whose input sizes are all known (from the model, or from
    ``input_shapes``): float inputs standard normal, integer inputs 0 or 1, bool inputs False/True.
    They prove the conversion reproduces the model's arithmetic; they say nothing about accuracy."""

    shapes = []
    for spec in io.inputs:
        shape = tuple(input_shapes[spec.name]) if input_shapes and spec.name in input_shapes else tuple(spec.shape)
        if not shape:
            raise DataError(f"model input {spec.name!r} is a scalar (rank 0); edgekit feeds inputs with a batch axis",
                            hint=f"a constant input: deploy takes --const {spec.name}=VALUE; else export the model "
                            "with a batch axis on every input")
        if any(d is None for d in shape[1:]):
            raise DataError(f"model input {spec.name!r} has dynamic sizes {tuple('?' if d is None else d for d in shape)}; "
                            "sample inputs cannot be made up for it",
                            hint=f"fix the sizes with --input-shape {spec.name}:1,... or pass --eval-data EVAL.npz")
        shapes.append(shape)
    whole = unbatched(shapes)  # no common batch axis: one run with the inputs' exact shapes
    batch = model_batch(shapes) or 1
    n = batch * int(np.ceil(samples / batch))
    rng = np.random.default_rng(seed)
    xs = []
    for spec, shape in zip(io.inputs, shapes):
        dt = np.dtype(spec.dtype)
        size = tuple(shape) if whole else (n, *shape[1:])
        if dt.kind == "f":
            xs.append(rng.standard_normal(size).astype(dt))
        elif dt.kind == "b":
            xs.append(rng.integers(0, 2, size).astype(bool))
        elif dt.kind in "iu":
            xs.append(rng.integers(0, 2, size).astype(dt))
        else:
            raise DataError(f"model input {spec.name!r} has dtype {dt}; edgekit cannot make sample inputs for it",
                            hint="pass --eval-data EVAL.npz with real inputs")
    return xs
