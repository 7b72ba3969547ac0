"""ONNX -> TFLite through onnx2tf: fp32, fp16, dynamic-range INT8, and full-integer INT8 calibrated
on the user's calibration set (int8 or float I/O), with parity against the ONNX model.

How it is done, and why:
- onnx2tf builds a TensorFlow SavedModel and the fp32/fp16 .tflite files inside a private temp
  folder (it writes many files); only the chosen .tflite is moved, atomically, to ``out_path``.
- INT8 files are made here with ``tf.lite.TFLiteConverter`` from that SavedModel and a
  representative dataset built from the user's calibration set (builtin INT8 kernels only, so the
  result runs on a plain LiteRT interpreter; onnx2tf's own INT8 path adds TF "Flex" ops and falls
  back to downloaded sample images).
- Offline: onnx2tf 1.28 fetches a sample-image .npy from the internet while converting models
  with 4-D 3-channel inputs. edgekit writes that file (built from the user's own data) into the
  conversion's working folder, where onnx2tf looks first, and swaps onnx2tf's download function for
  a local loader during the call, so a conversion never reaches the network.
- What onnx2tf is given (``onnx2tf_prepare.py``): the input sizes fixed (TFLite is static) and shapes
  re-inferred; when ONNX shape inference still leaves tensors without a static shape (paddle2onnx's
  Shape -> Cast -> Slice -> Concat -> Reshape), their constant subgraphs folded by onnxslim in this
  process (``simplify``; onnx2tf's own onnxsim step is switched off: it runs an ``onnxsim`` executable
  only when one is on PATH); node names TensorFlow rejects as scope names ('Softmax@0') rewritten;
  for full-integer INT8, padded MaxPools fed by an edge Pad (onnx2tf's -FLT_MAX padding would enter the
  calibrated range: MTCNN's ceil-mode pools).
- Errors (``onnx2tf_errors.py``): onnx2tf's failure is reported as the ONNX node it was converting (op
  type, inputs and their shapes) and the cause, without its colour codes or its advice about its own
  CLI flags.
- Layout: onnx2tf makes NHWC graphs from NCHW models. Which permutation each input and output got
  is found by running the fp32 graph against ONNX Runtime on a few eval samples and is recorded in
  the artifact's io spec (``transpose``); the agent applies it, so users keep feeding NCHW data.
  The fp16/int8 file's tensors are matched to the fp32 file's by name, signature or shape (outputs
  that share a shape: by their values), never by position alone.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..artifact import Artifact, IOSpec, LineageStep, TensorSpec
from ..data import Dataset, check_fits
from ..errors import ConversionError, DataError, MissingExtraError
from ..formats import Format
from ..fsutil import atomic_path
from ..logs import quiet
from . import onnx2tf_runs
from .onnx2tf_errors import describe_node, failing_node, log_tail, onnx2tf_failure, strip_ansi
from .onnx2tf_prepare import (edge_padded_max_pools, fixed_shapes, fold_constant_of_shape, layout_hints,
                               shapeless_tensors, simplify, tf_node_names)
from .opcheck import model_ops, require_ops, require_static_shapes
from .parity import compare, compare_outputs, parity_metrics

HOP = "onnx->tflite"
SAMPLE_FILE = "calibration_image_sample_data_20x128x128x3_float32.npy"  # what onnx2tf looks for in the cwd
_CWD_LOCK = threading.Lock()  # onnx2tf reads the sample file from the process-wide cwd
_RNN_OPS = {"LSTM", "GRU", "RNN"}


class TfliteConfig(BaseModel):
    """Options of the ONNX -> TFLite hop (the recipe's ``convert: {to: tflite, ...}`` step)."""

    model_config = ConfigDict(extra="forbid")

    precision: Literal["fp32", "fp16", "int8"] = "fp32"
    quantization: Literal["full", "dynamic"] = Field(
        "full", description="int8 only: full-integer (calibrated activations) or dynamic-range (weights only)")
    io: Literal["float", "int8"] = Field("float", description="full-integer int8: type of the model's inputs/outputs")
    calibration_samples: int = Field(200, ge=1, description="calibration samples used (first N)")
    allow_float_fallback: bool = Field(False, description="full int8: keep ops without an INT8 kernel in float "
                                       "(precision becomes 'mixed') instead of failing")
    keep_input_layout: bool = Field(False, description="keep NCHW/NCW inputs as they are (onnx2tf inserts "
                                    "transposes inside the graph); a layout-fixing option")
    input_shapes: dict[str, list[int]] | None = Field(None, description="fixed sizes for dynamic inputs")
    input_shapes_from: Literal["user", "data"] = Field(
        "user", description="where input_shapes came from: the user (--input-shape, the recipe) or the eval/"
        "calibration data's shapes, which fix a dynamic model's sizes when none are given (TFLite is static)")
    pseudo_ops: list[str] = Field(default_factory=list, description="ONNX ops onnx2tf rebuilds from builtin "
                                  "ops (its replace_to_pseudo_operators), e.g. Erf (exact GELU) which would "
                                  "otherwise need a TF Flex op; a fixing option the route fallback tries")
    parity_samples: int = Field(64, ge=1, description="eval samples the parity check runs")
    plain_defaults: bool = Field(False, description="call onnx2tf with nothing but its input and output paths "
                                 "(its own defaults, the ONNX file as given): the route that makes edgekit never "
                                 "cover less than onnx2tf itself; edgekit still finds the layout and checks parity")
    simplify: bool = Field(True, description="when ONNX shape inference leaves tensors without a static shape "
                           "(shape computations such as Shape -> Cast -> Slice -> Concat -> Reshape), fold them "
                           "into constants with onnxslim (no op fusion) before onnx2tf, which picks layouts "
                           "from shapes; recorded in the lineage as 'simplified'")
    layout_hints: bool = Field(True, description="tell onnx2tf (its param_replacement_file) the layout of 4-D "
                               "tensors whose C, H and W are equal and that feed a padded Conv, which its "
                               "shape-based layout guessing gets wrong (see layout_hints)")
    parity_bar: Literal["precision", "breakage"] = Field(
        "precision", description="int8 and fp16: 'precision' holds the file to its precision's parity tolerances "
        "(edgekit convert, which has no metric); 'breakage' only to the gross-breakage bar "
        "(parity.TOLERANCES['int8-breakage'] / ['breakage']), leaving its quality to the metric that the search's "
        "host check and the gate judge next (PP-OCR's detector: INT8 cosine 0.930, mask IoU 0.77 points below "
        "fp32; its recognizer: INT8 cosine 0.947, 50 points; fp16 max abs error 0.94 on its CTC probabilities at "
        "cosine 0.9989). fp32 keeps the fp32 bar: a float file has no precision to lose")

    @model_validator(mode="after")
    def _consistent(self):
        if self.io == "int8" and not (self.precision == "int8" and self.quantization == "full"):
            raise ValueError("io: int8 needs precision: int8 with quantization: full (only a fully "
                             "quantized model has integer inputs and outputs)")
        return self

    @property
    def needs_calibration(self) -> bool:
        """Full-integer INT8 calibrates activation ranges on representative inputs."""
        return self.precision == "int8" and self.quantization == "full"

    @property
    def label(self) -> str:
        if self.precision != "int8":
            return self.precision
        if self.quantization == "dynamic":
            return "int8-dynamic"
        return f"int8-{self.io}io"


# --------------------------------------------------------------------------- helpers
@contextlib.contextmanager
def _in_dir(path: Path) -> Iterator[None]:
    with _CWD_LOCK:
        old = os.getcwd()
        os.chdir(path)
        try:
            yield
        finally:
            os.chdir(old)


def _sample_images(xs: list[np.ndarray] | None) -> np.ndarray:
    """The 20x?x?x3 NHWC float32 array onnx2tf wants, from the user's first input when it is an
    image batch (NCHW, 3 channels), else deterministic noise. onnx2tf resizes it to the input size."""
    if xs:
        x = np.asarray(xs[0], dtype=np.float32)
        if x.ndim == 4 and x.shape[1] == 3:
            x = x.transpose(0, 2, 3, 1)
        if x.ndim == 4 and x.shape[-1] == 3:
            reps = int(np.ceil(20 / len(x)))
            return np.ascontiguousarray(np.concatenate([x] * reps)[:20])
    return np.random.default_rng(0).standard_normal((20, 128, 128, 3)).astype(np.float32)


@contextlib.contextmanager
def _offline_onnx2tf(sample_path: Path) -> Iterator[None]:
    """Replace onnx2tf's sample-data download by a loader of our local file for the call."""
    import onnx2tf.onnx2tf as o2t_main
    import onnx2tf.utils.common_functions as o2t_common

    def local_sample() -> np.ndarray:
        return np.load(sample_path, allow_pickle=False)

    saved = [(m, getattr(m, "download_test_image_data", None)) for m in (o2t_main, o2t_common)]
    for m, _ in saved:
        m.download_test_image_data = local_sample
    try:
        yield
    finally:
        for m, fn in saved:
            if fn is not None:
                m.download_test_image_data = fn


def _agent():
    """The device agent module, loaded once in this process (``agent/inprocess.py``): parity on the
    host runs the very code the device runs (LiteRTRunner, tensors.prepare, tensors.restore_output)."""
    from ..agent.inprocess import load_agent

    return load_agent()


# XNNPACK (applied by default) can refuse a graph at prepare ("Node number 3 (TfLiteXNNPackDelegate) failed to
# prepare", seen on full-integer INT8 files); the agent then runs it on LiteRT's built-in kernels and says so
# (LiteRTRunner), so the probe does the same: such a file is not a crash
_PROBE = """
import sys
import numpy as np
from ai_edge_litert import interpreter as lite
def run(**kw):
    it = lite.Interpreter(model_path=sys.argv[1], num_threads=1, **kw)
    it.allocate_tensors()
    for d in it.get_input_details():
        it.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
    it.invoke()
try:
    run()
except Exception as exc:
    low = str(exc).lower()
    if not ("xnnpack" in low and ("prepare" in low or "delegate" in low)):
        raise
    run(experimental_op_resolver_type=lite.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
print("ok")
"""
_probed: dict[tuple[str, int], str | None] = {}


def probe_litert(path: Path) -> None:
    """Load and run the .tflite once in a child process first: a LiteRT kernel that aborts (seen:
    "free(): double free" loading a full-integer detector) would otherwise kill edgekit itself, and
    it would crash the device's interpreter just the same. Raises ConversionError naming the crash."""
    import subprocess
    import sys

    st = Path(path).stat()
    key = (str(Path(path).resolve()), st.st_mtime_ns)
    if key not in _probed:
        try:
            res = subprocess.run([sys.executable, "-c", _PROBE, str(path)], capture_output=True, text=True,
                                 timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
            ok = res.returncode == 0 and res.stdout.strip().endswith("ok")
            why = None if ok else (f"exit {res.returncode}" + (f" (signal {-res.returncode})" if res.returncode < 0 else "")
                                   + ": " + log_tail("\n".join(ln for ln in res.stderr.splitlines()
                                                            if not ln.startswith("INFO:")), 3)[-300:])
        except subprocess.TimeoutExpired:
            why = "no answer within 300 s"
        _probed[key] = why
    why = _probed[key]
    if why is not None:
        raise ConversionError(f"the LiteRT interpreter crashes loading or running the converted model ({why})",
                              hop=HOP, hint="a LiteRT kernel bug for this graph at this precision: the device's "
                              "interpreter would crash the same way; try precision: fp16 or quantization: dynamic")


def _litert_runner(path: Path, threads: int = 1, input_specs=None):
    agent = _agent()
    probe_litert(path)
    try:
        return agent.runners.LiteRTRunner(str(path), threads, input_specs=input_specs)
    except agent.AgentFailure as exc:
        raise ConversionError(exc.message, hop=HOP,
                              hint="a model that needs TensorFlow Flex ops cannot run on a device's LiteRT "
                              "interpreter; see the ops named above") from exc


def run_tflite_all(path: Path, io: IOSpec, xs: list[np.ndarray], threads: int = 1) -> list[np.ndarray]:
    """Every output of a .tflite model on ``xs`` (user layout and dtype), in ``io.outputs`` order
    (matched to the interpreter's outputs by tensor name), fed with the agent's own code in chunks of
    the graph's static batch size (usually 1)."""
    from ..source import model_batch, run_batched

    agent = _agent()
    ins = [s.model_dump(mode="json") for s in io.inputs]
    outs = [s.model_dump(mode="json") for s in io.outputs]
    runner = _litert_runner(path, threads, ins)
    names = [d["name"] for d in runner.outputs]
    order = [names.index(s["name"]) if s["name"] in names else k for k, s in enumerate(outs)]
    batch = model_batch([tuple(int(v) for v in d["shape"]) for d in runner.inputs]) or 1

    def once(feed: list[np.ndarray]) -> list[np.ndarray]:
        prepared = [agent.tensors.prepare(x, s) for x, s in zip(feed, ins)]
        try:
            got = runner.run(prepared)
        except Exception as exc:  # the interpreter raises RuntimeError/ValueError naming the kernel and node
            msg = str(exc).strip().replace("\n", " ")[:400]
            quantized = any(str(d.get("dtype", "")).startswith(("int8", "uint8", "int16")) for d in runner.inputs) \
                or "quant" in msg.lower()
            if "mismatch" in msg.lower() or "shape" in msg.lower():
                hint = ("the interpreter's input shape does not match the data fed to it: check the input layout "
                        "(NCHW vs NHWC) and the static shapes the model was converted with (--input-shape)")
            elif quantized:
                hint = "a quantized kernel cannot handle this input range; try precision: fp16 or quantization: dynamic"
            else:
                hint = "run the .tflite on LiteRT alone to reproduce it; report the failing op with its converter route"
            raise ConversionError(f"the converted model fails on the LiteRT interpreter: {msg}", hop=HOP,
                                  hint=hint) from exc
        res = []
        for spec, j in zip(outs, order):
            y = got[j] if j < len(got) else got[-1]
            res.append(agent.tensors.restore_output(y, spec))
        return res

    return run_batched(once, list(xs), batch)


def run_tflite(path: Path, io: IOSpec, xs: list[np.ndarray], threads: int = 1) -> np.ndarray:
    """First output of a .tflite model on ``xs`` (user layout and dtype), exactly as the agent feeds it."""
    return run_tflite_all(path, io, xs, threads)[0]


def _perm_candidates(user: tuple, runtime: tuple) -> list[tuple[int, ...] | None]:
    """Permutations p with runtime.shape[k] == user.shape[p[k]]: identity, channels-last, channels-first."""
    r = len(user)
    if r != len(runtime):
        return []
    cands: list[tuple[int, ...]] = [tuple(range(r))]
    if r >= 3:
        cands += [(0, *range(2, r), 1), (0, r - 1, *range(1, r - 1))]
    ok = []
    for p in dict.fromkeys(cands):
        if all(user[p[k]] is None or runtime[k] is None or user[p[k]] == runtime[k] for k in range(r)):
            ok.append(None if p == tuple(range(r)) else p)
    return ok


def _details_specs(details, onnx_specs, perms) -> tuple[TensorSpec, ...]:
    out = []
    for det, src, perm in zip(details, onnx_specs, perms):
        dt = np.dtype(det["dtype"]).name
        scale, zp = (det.get("quantization") or (0.0, 0))[:2]
        q = dt in ("int8", "uint8", "int16") and scale
        out.append(TensorSpec(name=det["name"], shape=src.shape, dtype=dt, layout=src.layout,
                              transpose=perm, scale=float(scale) if q else None, zero_point=int(zp) if q else None))
    return tuple(out)


def _tflite_details(path: Path):
    r = _litert_runner(path, 1)
    return r.inputs, r.outputs


def _norm_name(name: str) -> str:
    """A tensor name as onnx2tf may have rewritten it: without the signature prefix, the ':0' suffix
    and with ':' and '/' made '_'."""
    import re

    n = re.sub(r":\d+$", "", name)
    n = n.removeprefix("serving_default_")
    return n.replace(":", "_").replace("/", "_").replace(".", "_")


def _by_name(details, onnx_specs):
    """Interpreter tensors in the ONNX model's order when every name can be matched, else None."""
    by_name = {d["name"]: d for d in details}
    if all(s.name in by_name for s in onnx_specs):
        return [by_name[s.name] for s in onnx_specs]
    norm = {_norm_name(d["name"]): d for d in details}
    if len(norm) == len(details) and all(_norm_name(s.name) in norm for s in onnx_specs):
        return [norm[_norm_name(s.name)] for s in onnx_specs]
    return None


def _match(details, onnx_specs, kind: str):
    """Interpreter tensors in the ONNX model's order: by name when onnx2tf kept the names, else by
    shape when each ONNX tensor fits exactly one (up to a layout permutation), else in the
    interpreter's order."""
    if len(details) != len(onnx_specs):
        raise ConversionError(f"the TFLite model has {len(details)} {kind}s, the ONNX model {len(onnx_specs)}", hop=HOP)
    named = _by_name(details, onnx_specs)
    if named:
        return named
    fits = [[d for d in details if _perm_candidates(tuple(s.shape), _shape_of(d))] for s in onnx_specs]
    if all(len(f) == 1 for f in fits) and len({int(f[0]["index"]) for f in fits}) == len(fits):
        return [f[0] for f in fits]
    return list(details)


def _restored(y: np.ndarray, perm) -> np.ndarray:
    if perm is None:
        return y
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return np.transpose(y, inv)


def _err(ref: np.ndarray, got: np.ndarray) -> float:
    if ref.size != got.size:  # same size, other shape (a squeezed axis): compare() reshapes, as parity does
        return float("inf")
    return compare(ref, got, "probe").max_abs_err


def find_layout(fp32_path: Path, onnx_io: IOSpec, onnx_ref: Callable, probe: list[np.ndarray]) -> IOSpec:
    """The io spec of the fp32 .tflite with the permutations that make it agree with ONNX on
    ``probe``, every output in the ONNX model's order. ``onnx_ref`` returns every ONNX output (a
    list) or, from older callers, only the first. When onnx2tf did not keep the output names, each
    ONNX output is matched to the TFLite output (and permutation) that reproduces it."""
    din, dout = _tflite_details(fp32_path)
    din = _match(din, onnx_io.inputs, "input")
    if len(dout) != len(onnx_io.outputs):
        raise ConversionError(f"the TFLite model has {len(dout)} outputs, the ONNX model {len(onnx_io.outputs)}",
                              hop=HOP)
    named = _by_name(dout, onnx_io.outputs)
    in_c = [_perm_candidates(s.shape, tuple(d["shape"])) for s, d in zip(onnx_io.inputs, din)]
    for s, d, c in zip(onnx_io.inputs, din, in_c):
        if not c:
            raise ConversionError(f"TFLite input {d['name']} has shape {tuple(d['shape'])}, which no layout "
                                  f"permutation maps to the ONNX input {s.name} {s.shape}", hop=HOP,
                                  hint="try keep_input_layout: true, or fix the input sizes with --input-shape")
    refs = onnx_ref(probe)
    refs = list(refs) if isinstance(refs, (list, tuple)) else [refs]
    raw_specs = tuple(TensorSpec(name=d["name"], shape=tuple(int(v) for v in d["shape"]),
                                 dtype=np.dtype(d["dtype"]).name) for d in dout)
    best = None
    for in_p in itertools.product(*in_c):
        io_in = _details_specs(din, onnx_io.inputs, in_p)
        try:
            raw = run_tflite_all(fp32_path, IOSpec(inputs=io_in, outputs=raw_specs), probe)
        except ConversionError:  # a wrong permutation can make shapes not fit: just not this candidate
            continue
        chosen, errs, used = [], [], set()
        for k, (spec, ref) in enumerate(zip(onnx_io.outputs, refs if len(refs) == len(onnx_io.outputs) else
                                             [*refs, *[None] * (len(onnx_io.outputs) - len(refs))])):
            cands = [dout.index(named[k])] if named else [j for j in range(len(dout)) if j not in used]
            pick = None
            for j in cands:
                for perm in _perm_candidates(spec.shape, tuple(dout[j]["shape"])) or [None]:
                    e = 0.0 if ref is None else _err(np.asarray(ref), _restored(raw[j], perm))
                    if pick is None or e < pick[0]:
                        pick = (e, j, perm)
            if pick is None:
                break
            used.add(pick[1])
            chosen.append(pick)
            errs.append(pick[0])
        if len(chosen) != len(onnx_io.outputs):
            continue
        total = max(errs) if errs else 0.0
        if best is None or total < best[0]:
            outs = _details_specs([dout[j] for _, j, _ in chosen], onnx_io.outputs, [p for _, _, p in chosen])
            best = (total, IOSpec(inputs=io_in, outputs=outs))
    if best is None or not np.isfinite(best[0]):
        raise ConversionError("no input/output layout of the TFLite model reproduces the ONNX outputs' shapes",
                              hop=HOP, hint="try keep_input_layout: true")
    return best[1]


def _signature_indices(path: Path) -> tuple[dict[str, int], dict[str, int]]:
    """The .tflite's first signature as ({input key: tensor index}, {output key: tensor index}); empty
    without one (onnx2tf's own files have none; TFLiteConverter's from a SavedModel have one, keyed
    by the SavedModel's names: the ONNX input names, and output_0, output_1... in the ONNX output order)."""
    try:
        try:
            from ai_edge_litert.interpreter import Interpreter
        except ImportError:
            from tensorflow.lite import Interpreter  # type: ignore[no-redef]
        it = Interpreter(model_path=str(path))
        sigs = it.get_signature_list()
        if not sigs:
            return {}, {}
        runner = it.get_signature_runner(next(iter(sigs)))
        return ({k: int(v["index"]) for k, v in runner.get_input_details().items()},
                {k: int(v["index"]) for k, v in runner.get_output_details().items()})
    except Exception:  # no signature API in this runtime: match by the other means
        return {}, {}


def _shape_of(d) -> tuple[int, ...]:
    return tuple(int(v) for v in d["shape"])


def _align(dets, f32, specs32, onnx_specs, sig: dict[str, int], kind: str) -> list:
    """``dets`` (the interpreter tensors of a file made from the same graph as the fp32 one) in the
    order of ``specs32`` (the fp32 file's tensors, in the ONNX model's order), each matched by its
    tensor name, else by the file's signature key (the ONNX name, or ``output_K``: the K-th ONNX
    output), else by its normalized name, else by its shape when only one tensor has it; never by
    position alone. None stands for a tensor none of these tell apart (shared shapes, no names)."""
    by_name = {d["name"]: d for d in dets}
    by_index = {int(d["index"]): d for d in dets}
    norm = {}
    for d in dets:
        norm.setdefault(_norm_name(d["name"]), []).append(d)
    f32_shape = {d["name"]: _shape_of(d) for d in f32}
    keys = {}
    for key, idx in sig.items():
        keys.setdefault(_norm_name(key), []).append(idx)
    picked: list = [None] * len(specs32)
    used: set[int] = set()

    def take(k: int, d) -> bool:
        if d is None or int(d["index"]) in used:
            return False
        want = f32_shape.get(specs32[k].name)
        if want is not None and _shape_of(d) != want:  # same graph, same shapes: a mismatch is a wrong match
            return False
        picked[k] = d
        used.add(int(d["index"]))
        return True

    steps = [
        lambda k: by_name.get(specs32[k].name),
        lambda k: (by_index.get(keys[_norm_name(onnx_specs[k].name)][0])
                   if len(keys.get(_norm_name(onnx_specs[k].name), [])) == 1 else None),
        lambda k: (by_index.get(sig[f"output_{k}"]) if kind == "output" and f"output_{k}" in sig
                   and not any(_norm_name(s.name) in keys for s in onnx_specs) else None),
        lambda k: (norm[_norm_name(onnx_specs[k].name)][0] if len(norm.get(_norm_name(onnx_specs[k].name), [])) == 1
                   else None),
    ]
    for step in steps:
        for k in range(len(specs32)):
            if picked[k] is None:
                try:
                    take(k, step(k))
                except (KeyError, IndexError):
                    pass
    for k in range(len(specs32)):  # by shape: the one remaining tensor with the fp32 tensor's shape
        if picked[k] is None:
            want = f32_shape.get(specs32[k].name)
            same = [d for d in dets if int(d["index"]) not in used and _shape_of(d) == want]
            if len(same) == 1:
                take(k, same[0])
    return picked


def _final_io(final: Path, fp32: Path, io32: IOSpec, onnx_io: IOSpec,
              probe: list[np.ndarray] | None = None) -> IOSpec:
    """The io spec of the fp16/int8 file made from the same graph as the fp32 one, every tensor
    matched to the fp32 file's (see _align) and given its permutation. Outputs that share a shape and
    no name are told apart by their values on ``probe`` (the fp32 file's outputs); inputs by their
    order only when nothing else can tell them apart (the SavedModel keeps the ONNX input order)."""
    din, dout = _tflite_details(final)
    fin, fout = _tflite_details(fp32)
    if len(din) != len(fin) or len(dout) != len(fout):
        raise ConversionError(f"the {final.name} graph has other inputs/outputs than the fp32 graph", hop=HOP)
    sig_in, sig_out = _signature_indices(final)
    ins = _align(din, fin, io32.inputs, onnx_io.inputs, sig_in, "input")
    if any(d is None for d in ins):
        left = [d for d in din if all(d is not p for p in ins)]
        ins = [d if d is not None else left.pop(0) for d in ins]
    outs = _align(dout, fout, io32.outputs, onnx_io.outputs, sig_out, "output")
    if any(d is None for d in outs):
        outs = _by_values(final, fp32, io32, ins, outs, dout, probe)
    return IOSpec(inputs=_details_specs(ins, onnx_io.inputs, [s.transpose for s in io32.inputs]),
                  outputs=_details_specs(outs, onnx_io.outputs, [s.transpose for s in io32.outputs]))


def _raw_spec(d) -> TensorSpec:
    dt = np.dtype(d["dtype"]).name
    scale, zp = (d.get("quantization") or (0.0, 0))[:2]
    q = dt in ("int8", "uint8", "int16") and scale
    return TensorSpec(name=d["name"], shape=_shape_of(d), dtype=dt, scale=float(scale) if q else None,
                      zero_point=int(zp) if q else None)


def _by_values(final: Path, fp32: Path, io32: IOSpec, ins: list, outs: list, dout, probe) -> list:
    """The unmatched outputs of ``final`` matched to the fp32 file's by their values on ``probe``:
    each to the remaining same-shape tensor closest to the fp32 output."""
    missing = [s.name for s, d in zip(io32.outputs, outs) if d is None]
    if not probe:
        raise ConversionError(f"cannot tell which output of {final.name} is {', '.join(missing)}: they share a "
                              "shape and the file names none of them", hop=HOP)
    x = _first_samples(probe, 2)
    # the fp32 outputs in the TFLite layout (no permutation undone), in the ONNX order
    ref = run_tflite_all(fp32, IOSpec(inputs=io32.inputs, outputs=tuple(
        TensorSpec(name=s.name, shape=s.shape, dtype=s.dtype) for s in io32.outputs)), x)
    in_specs = _details_specs(ins, io32.inputs, [s.transpose for s in io32.inputs])
    cand = [d for d in dout if all(d is not p for p in outs)]
    got = run_tflite_all(final, IOSpec(inputs=in_specs, outputs=tuple(_raw_spec(d) for d in cand)), x)
    outs = list(outs)
    for k, d in enumerate(outs):
        if d is not None:
            continue
        best = None
        for j, c in enumerate(cand):
            if c is None or got[j].shape != ref[k].shape:
                continue
            e = _err(np.asarray(ref[k]), got[j])
            if best is None or e < best[0]:
                best = (e, j)
        if best is None:
            raise ConversionError(f"no output of {final.name} has the shape of {io32.outputs[k].name}", hop=HOP)
        outs[k] = cand[best[1]]
        cand[best[1]] = None
    return outs


# ONNX ops whose usual TF lowering is a Flex op, and the onnx2tf pseudo-op replacement that avoids it
PSEUDO_OP_FIXES = {"Erf": "Erf", "Gelu": "GeLU", "Asin": "Asin", "Acos": "Acos", "Atan": "Atan"}


def _require_builtin_only(path: Path, ops: dict[str, list[str]]) -> None:
    """Fail, naming the TF op and the ONNX nodes behind it, when the graph needs TF Flex ops that a
    device's plain LiteRT interpreter cannot run."""
    import re

    try:
        _tflite_details(path)
    except ConversionError as exc:
        flex = sorted(set(re.findall(r"Flex(\w+)", exc.message)))
        if not flex:
            raise
        nodes = {f: ops.get(f) or ops.get(f.capitalize()) or [] for f in flex}
        named = "; ".join(f"{f}" + (f" (ONNX {f} at {', '.join(repr(n) for n in v[:5])})" if v else "")
                          for f, v in nodes.items())
        fix = [PSEUDO_OP_FIXES[o] for o in ops if o in PSEUDO_OP_FIXES]
        raise ConversionError(
            f"the converted graph needs TensorFlow Flex ops, which a device's LiteRT interpreter cannot run: {named}",
            hop=HOP, hint=(f"pseudo_ops: {fix} rebuilds them from builtin ops (the route fallback tries it)" if fix
                           else "replace that op in the PyTorch model, or keep the model on ONNX Runtime")) from exc


def _signature_keys(saved_model: Path) -> list[str]:
    import tensorflow as tf

    loaded = tf.saved_model.load(str(saved_model))
    sig = loaded.signatures["serving_default"]
    return list(sig.structured_input_signature[1].keys())


def _quantize(saved_model: Path, cfg: TfliteConfig, io: IOSpec, onnx_names: list[str], calib: Dataset | None) -> bytes:
    import tensorflow as tf

    conv = tf.lite.TFLiteConverter.from_saved_model(str(saved_model))
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    if cfg.quantization == "full":
        keys = _signature_keys(saved_model)
        if len(keys) != len(io.inputs):
            raise ConversionError(f"the SavedModel takes {len(keys)} inputs, the model {len(io.inputs)}", hop=HOP)
        order = []
        for i, name in enumerate(onnx_names):  # onnx2tf keeps input names, minus ':' and '/'
            cands = [name, name.replace(":", "_").replace("/", "_"), name.replace(":", "__").replace("/", "_")]
            order.append(next((c for c in cands if c in keys), keys[i]))
        from ..source import model_batch

        xs = [x[: cfg.calibration_samples] for x in calib.xs]  # type: ignore[union-attr]
        batch = model_batch([s.shape for s in io.inputs]) or 1  # the graph's static batch size

        def representative():
            n = len(xs[0])
            for i in range(0, n, batch):
                idx = i + np.arange(batch) % min(batch, n - i)  # the last batch padded with its own samples
                sample = {}
                for key, x, spec in zip(order, xs, io.inputs):
                    v = np.asarray(x[idx], dtype=np.float32)
                    sample[key] = np.transpose(v, spec.transpose) if spec.transpose else v
                yield sample

        conv.representative_dataset = representative
        ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        if cfg.allow_float_fallback:
            ops.append(tf.lite.OpsSet.TFLITE_BUILTINS)
        conv.target_spec.supported_ops = ops
        if cfg.io == "int8":
            conv.inference_input_type = tf.int8
            conv.inference_output_type = tf.int8
    return conv.convert()


def _first_samples(xs: list[np.ndarray], k: int) -> list[np.ndarray]:
    """The first ``k`` samples of each input; inputs without a common sample axis stay whole."""
    from ..source import shares_samples

    return [np.asarray(x[:k]) for x in xs] if shares_samples(xs) else [np.asarray(x) for x in xs]


# --------------------------------------------------------------------------- the hop
def breakage_bar(precision: str) -> str:
    """The parity bar of a reduced-precision file judged by its metric next: INT8 (full or mixed) and fp16 face
    gross breakage only; fp32 keeps its own bar."""
    return {"int8": "int8-breakage", "mixed": "int8-breakage", "fp16": "breakage"}.get(precision, precision)


def onnx_to_tflite(art: Artifact, out_path: str | Path, cfg: TfliteConfig | None = None, *,
                   calib: Dataset | None = None, parity_inputs: list[np.ndarray] | None = None,
                   chain_reference: Callable | None = None, chain_reference_name: str | None = None,
                   chain_reference_all: Callable | None = None) -> Artifact:
    """Convert an ONNX artifact to ``out_path`` (.tflite). ``parity_inputs`` (user layout, batch
    first) drive the layout search and the parity check against ONNX Runtime, on every output;
    ``chain_reference_all`` (every output of e.g. the PyTorch model; ``chain_reference``: its first
    output only) adds whole-chain parity to the lineage."""
    import importlib.util

    import onnx

    from ..source import ort_reference_all

    cfg = cfg or TfliteConfig()
    out_path = Path(out_path).resolve()  # onnx2tf runs in another working directory: no relative path survives
    if importlib.util.find_spec("onnx2tf") is None or importlib.util.find_spec("tensorflow") is None:
        raise MissingExtraError("onnx2tf", "tflite", "ONNX -> TFLite conversion")
    if art.format != Format.ONNX:
        raise ConversionError(f"takes an ONNX model, got {art.format.value}", hop=HOP)
    try:
        model = onnx.load(str(art.path), load_external_data=False)
    except Exception as exc:  # DecodeError, OSError: the file is not an ONNX model
        raise ConversionError(f"{art.path} is not a readable ONNX model: {type(exc).__name__}: {str(exc)[:200]}",
                              hop=HOP, hint="re-export the model, or check the file was copied completely") from exc
    require_ops(model, HOP)
    shapes = {k: tuple(v) for k, v in (cfg.input_shapes or {}).items()}
    require_static_shapes(model, HOP, shapes)
    needs_calib = cfg.precision == "int8" and cfg.quantization == "full"
    if needs_calib:
        if calib is None:
            raise DataError("full-integer INT8 needs a calibration set",
                            hint="pass --calib-data CALIB.npz (x as the model takes it), or use "
                            "quantization: dynamic (weights only)")
        calib = check_fits(calib, art.io, "calib") or calib
    if parity_inputs is None:
        if calib is None:
            raise DataError("the ONNX -> TFLite hop needs sample inputs to find the layout and check parity",
                            hint="pass --calib-data or --eval-data")
        parity_inputs = list(calib.xs)
    probe = _first_samples(parity_inputs, cfg.parity_samples)
    ops = model_ops(model)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    start = time.perf_counter()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".edgekit-tflite-", dir=out_path.parent)).resolve()
    try:
        sample = work / SAMPLE_FILE
        np.save(sample, _sample_images(list(calib.xs) if calib is not None else probe))
        src = work / "model.onnx"
        # what onnx2tf is given: ConstantOfShape weights folded, the input sizes fixed and the shapes
        # re-inferred, constant shape computations folded when inference leaves tensors shapeless, node
        # names TF accepts; plain_defaults: the file as given (with the sizes fixed when asked)
        prepared = model if cfg.plain_defaults else (fold_constant_of_shape(model) or model)
        if shapes or (not cfg.plain_defaults and any(s.shape and s.shape[0] is None for s in art.io.inputs)):
            prepared = fixed_shapes(prepared, shapes)
        simplified: dict | None = None
        renamed: dict[str, str] = {}
        edge_pools: list[str] = []
        if not cfg.plain_defaults:
            if cfg.simplify and shapeless_tensors(prepared):
                slim, simplified = simplify(prepared)
                prepared = slim or prepared
                simplified["applied"] = slim is not None
            named, renamed = tf_node_names(prepared)
            prepared = named or prepared
            if cfg.precision == "int8" and cfg.quantization == "full":
                padded, edge_pools = edge_padded_max_pools(prepared)
                prepared = padded or prepared
        if prepared is model:
            shutil.copyfile(art.path, src)
        else:
            onnx.save(prepared, str(src))
        # not_use_onnxsim: onnx2tf would run an `onnxsim` executable found on PATH (three times, in a
        # subprocess) and go on silently without one; edgekit simplifies itself, the same everywhere
        kwargs = dict(input_onnx_file_path=str(src), output_folder_path=str(work / "tf"), non_verbose=True,
                      not_use_onnxsim=True)
        if not cfg.plain_defaults:
            kwargs.update(copy_onnx_input_output_names_to_tflite=True, output_signaturedefs=True)
        hints: list[dict] = []
        if cfg.layout_hints and not cfg.plain_defaults:
            named, hints = layout_hints(onnx.load(str(src), load_external_data=False))
            if named is not None:
                onnx.save(named, str(src))
                prepared = named
            if hints:
                import json

                (work / "layout_hints.json").write_text(json.dumps({"format_version": 1, "operations": hints}))
                kwargs["param_replacement_file"] = str(work / "layout_hints.json")
        if cfg.keep_input_layout:  # onnx2tf asserts on a named input of another rank
            kwargs["keep_ncw_or_nchw_or_ncdhw_input_names"] = [s.name for s in art.io.inputs
                                                               if len(s.shape) in (3, 4, 5)]
        if cfg.pseudo_ops:
            kwargs["replace_to_pseudo_operators"] = [o.lower() for o in cfg.pseudo_ops]  # onnx2tf matches lower case
        if _RNN_OPS & set(ops) and not cfg.plain_defaults:
            kwargs["enable_rnn_unroll"] = True  # a loop over time would need TF Flex ops on the device
        origin = "the data's shapes" if cfg.input_shapes_from == "data" else "--input-shape"
        sizes = ", ".join(f"{k} {tuple(v)}" for k, v in shapes.items())
        sized = f" (input sizes from {origin}: {sizes})" if shapes else ""
        hint = ("onnx2tf's own command-line flags are not edgekit options; edgekit's are --input-shape NAME:1,3,H,W "
                "(other static sizes) and the route fallback (keep_input_layout, onnx2tf's defaults, litert-torch "
                "from a .pt2); else keep the model on ONNX Runtime (--to onnx) or change that node in the model"
                + sized)
        with quiet("onnx2tf", "tensorflow", "absl"):
            import onnx2tf

        run_key = onnx2tf_runs.key(src, kwargs, sample, getattr(onnx2tf, "__version__", "?"))
        reused = onnx2tf_runs.restore(run_key, work / "tf")  # another candidate of this search ran it already
        if not reused:
            with _in_dir(work), quiet("onnx2tf", "tensorflow", "absl") as buf, _offline_onnx2tf(sample):
                try:
                    onnx2tf.convert(**kwargs)
                except SystemExit as exc:  # onnx2tf reports errors and calls sys.exit(1)
                    node = describe_node(prepared, failing_node(exc, buf.getvalue()), renamed)
                    raise ConversionError(f"onnx2tf stopped{f' at {node}' if node else ''}: "
                                          f"{log_tail(buf.getvalue()) or f'exit status {exc.code}'}", hop=HOP,
                                          hint=hint) from None
                except Exception as exc:  # converter internals raise anything; name the node and the cause
                    raise ConversionError(onnx2tf_failure(exc, buf.getvalue(), prepared, renamed), hop=HOP,
                                          hint=hint) from exc
            if not (work / "tf" / "model_float32.tflite").is_file():
                raise ConversionError(f"onnx2tf wrote no .tflite ({log_tail(buf.getvalue())})", hop=HOP)
            onnx2tf_runs.keep(run_key, work / "tf")
        fp32 = work / "tf" / "model_float32.tflite"
        try:
            onnx_ref = ort_reference_all(Path(art.path))
        except Exception as exc:  # onnxruntime's own errors (InvalidGraph, Fail...)
            raise ConversionError(f"onnxruntime cannot run {Path(art.path).name}, the parity reference: "
                                  f"{str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__}", hop=HOP,
                                  hint="check the model's opset and ops are supported by onnxruntime") from exc
        _require_builtin_only(fp32, ops)
        io32 = find_layout(fp32, art.io, onnx_ref, _first_samples(probe, 4))
        precision = cfg.precision
        if cfg.precision == "fp32":
            final = fp32
        elif cfg.precision == "fp16":
            final = work / "tf" / "model_float16.tflite"
        else:
            final = work / "int8.tflite"
            try:
                with quiet("tensorflow", "absl"):
                    final.write_bytes(_quantize(work / "tf", cfg, io32, [i.name for i in art.io.inputs], calib))
            except ConversionError:
                raise
            except Exception as exc:  # the TFLite converter raises ConverterError and others
                raise ConversionError(
                    f"INT8 quantization failed: {type(exc).__name__}: {log_tail(str(exc), 3)}", hop=HOP,
                    hint="an op without an INT8 kernel: set allow_float_fallback: true, or use "
                    "quantization: dynamic, or precision: fp16") from exc
            if cfg.quantization == "full" and cfg.allow_float_fallback:
                precision = "mixed"
        io = io32 if final == fp32 else _final_io(final, fp32, io32, art.io, probe)
        seconds = time.perf_counter() - start
        gots = run_tflite_all(final, io, probe)
        names = [s.name for s in art.io.outputs]
        bar = breakage_bar(precision) if cfg.parity_bar == "breakage" else precision
        metrics: dict = {**parity_metrics(compare_outputs(onnx_ref(probe), gots, "onnx", names), bar),
                         "route": "onnx2tf", "precision": cfg.label, "parity_tolerance": bar,
                         "convert_seconds": round(seconds, 3)}
        if reused:  # onnx2tf's output of an identical input, from an earlier build in this process
            metrics["onnx2tf_reused"] = True
        if simplified is not None:  # constant shape computations folded before onnx2tf (see simplify)
            metrics["simplified"] = simplified
        if edge_pools:  # MaxPools that read an edge-padded input (onnx2tf_prepare.edge_padded_max_pools)
            metrics["max_pools_edge_padded"] = edge_pools
        if hints:  # which nodes' layout edgekit told onnx2tf (a parity failure then points at them first)
            metrics["layout_hints"] = [h["op_name"] for h in hints]
        if chain_reference_all is not None or chain_reference is not None:
            refs = chain_reference_all(probe) if chain_reference_all is not None else [chain_reference(probe)]
            chain = compare_outputs(list(refs), gots[:len(refs)], chain_reference_name or "reference", names[:len(refs)])
            metrics["chain_parity"] = next(iter(chain.values())).to_dict()
            if len(chain) > 1:
                metrics["chain_parity_outputs"] = {k: v.to_dict() for k, v in chain.items()}
        if needs_calib:
            metrics["calibration_samples"] = int(min(cfg.calibration_samples, calib.n))  # type: ignore[union-attr]
            metrics["calibration_data"] = str(calib.path)  # type: ignore[union-attr]
        with atomic_path(out_path) as tmp:
            shutil.copyfile(final, tmp)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    import onnx2tf as _o2t

    step = LineageStep(kind="convert", name=HOP, config={**cfg.model_dump(mode="json"), "converter": "onnx2tf",
                                                         "onnx2tf": getattr(_o2t, "__version__", "?")},
                       metrics=metrics, seconds=round(time.perf_counter() - start, 3))
    return art.derive(out_path, fmt=Format.TFLITE, io=io, step=step, precision=precision)


__all__ = ["TfliteConfig", "onnx_to_tflite", "run_tflite", "run_tflite_all", "find_layout", "HOP", "simplify",
           "shapeless_tensors", "onnx2tf_failure", "strip_ansi"]
