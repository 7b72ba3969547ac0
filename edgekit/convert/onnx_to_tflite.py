"""ONNX -> TFLite through onnx2tf: fp32, fp16, dynamic-range INT8, and full-integer INT8 calibrated
on the user's calibration set (int8 or float I/O), with parity against the ONNX model.

How it is done, and why (the hop's parts live in ``convert/tflite/``; this module runs them in order):
- onnx2tf builds a TensorFlow SavedModel and the fp32/fp16 .tflite files inside a private temp
  folder (it writes many files); only the chosen .tflite is moved, atomically, to ``out_path``.
- INT8 files are made with ``tf.lite.TFLiteConverter`` from that SavedModel and a representative dataset
  built from the user's calibration set (``tflite/int8_converter.py``).
- Offline (``tflite/onnx2tf_offline.py``): onnx2tf's sample-image download is replaced by a file built from
  the user's own data, so a conversion never reaches the network.
- What onnx2tf is given (``onnx2tf_prepare.py``, applied by ``_prepare_onnx``): the input sizes fixed (TFLite
  is static) and shapes re-inferred; when ONNX shape inference still leaves tensors without a static shape
  (paddle2onnx's Shape -> Cast -> Slice -> Concat -> Reshape), their constant subgraphs folded by onnxslim in
  this process (``simplify``; onnx2tf's own onnxsim step is switched off: it runs an ``onnxsim`` executable
  only when one is on PATH); node names TensorFlow rejects as scope names ('Softmax@0') rewritten;
  for full-integer INT8, padded MaxPools fed by an edge Pad (onnx2tf's -FLT_MAX padding would enter the
  calibrated range: MTCNN's ceil-mode pools).
- Errors (``onnx2tf_errors.py``): onnx2tf's failure is reported as the ONNX node it was converting (op
  type, inputs and their shapes) and the cause, without its colour codes or its advice about its own
  CLI flags.
- Layout (``tflite/layout.py``): onnx2tf makes NHWC graphs from NCHW models; each input's and output's
  permutation is found against ONNX Runtime and recorded in the artifact's io spec (``transpose``), so users
  keep feeding NCHW data. The fp16/int8 file's tensors are matched to the fp32 file's by name, signature or
  shape, never by position alone.
- Every host run of a .tflite goes through ``tflite/host_harness.py``: the agent's own LiteRT runner, after a
  child-process probe (a LiteRT abort becomes a ConversionError).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..artifact import Artifact, IOSpec, LineageStep
from ..errors import ConversionError, DataError, MissingExtraError
from ..formats import Format
from ..fsutil import atomic_path
from ..inputs.data import Dataset, check_fits
from ..inputs.source import ort_reference_all
from ..logs import quiet
from .onnx2tf_errors import log_tail, onnx2tf_failure, strip_ansi
from .onnx2tf_prepare import (
    edge_padded_max_pools,
    fixed_shapes,
    fold_constant_of_shape,
    layout_hints,
    shapeless_tensors,
    simplify,
    tf_node_names,
)
from .opcheck import model_ops, require_ops, require_static_shapes
from .parity import compare_outputs, parity_metrics
from .tflite.config import HOP, TfliteConfig, breakage_bar
from .tflite.host_harness import _first_samples, _require_builtin_only, run_tflite, run_tflite_all
from .tflite.int8_converter import _quantize
from .tflite.layout import _final_io, find_layout
from .tflite.onnx2tf_offline import SAMPLE_FILE, _sample_images, run_onnx2tf

_RNN_OPS = {"LSTM", "GRU", "RNN"}


def onnx_to_tflite(art: Artifact, out_path: str | Path, cfg: TfliteConfig | None = None, *,
                   calib: Dataset | None = None, parity_inputs: list[np.ndarray] | None = None,
                   chain_reference: Callable | None = None, chain_reference_name: str | None = None,
                   chain_reference_all: Callable | None = None) -> Artifact:
    """Convert an ONNX artifact to ``out_path`` (.tflite). ``parity_inputs`` (user layout, batch
    first) drive the layout search and the parity check against ONNX Runtime, on every output;
    ``chain_reference_all`` (every output of e.g. the PyTorch model; ``chain_reference``: its first
    output only) adds whole-chain parity to the lineage."""
    cfg = cfg or TfliteConfig()
    out_path = Path(out_path).resolve()  # onnx2tf runs in another working directory: no relative path survives
    model, shapes, calib, parity_inputs = _checked_inputs(art, cfg, calib, parity_inputs)
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
        prep = _prepare_onnx(model, art, cfg, shapes, src)
        kwargs = _onnx2tf_args(prep, src, work, cfg, art, ops)
        reused = run_onnx2tf(kwargs, work, sample, prep.model, prep.renamed, _failure_hint(cfg, shapes))
        fp32 = work / "tf" / "model_float32.tflite"
        onnx_ref = _onnx_reference(art)
        _require_builtin_only(fp32, ops)
        io32 = find_layout(fp32, art.io, onnx_ref, _first_samples(probe, 4))
        final, precision = _final_file(work, cfg, io32, art, calib)
        io = io32 if final == fp32 else _final_io(final, fp32, io32, art.io, probe)
        seconds = time.perf_counter() - start
        gots = run_tflite_all(final, io, probe)
        metrics = {**_parity(cfg, precision, art, onnx_ref, probe, gots, seconds), **_prepared_notes(prep, reused),
                   **_chain_parity(art, probe, gots, chain_reference, chain_reference_name, chain_reference_all),
                   **_calibration_notes(cfg, calib)}
        with atomic_path(out_path) as tmp:
            shutil.copyfile(final, tmp)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    import onnx2tf as _o2t  # heavy: TensorFlow (already imported by the run above)

    step = LineageStep(kind="convert", name=HOP, config={**cfg.model_dump(mode="json"), "converter": "onnx2tf",
                                                         "onnx2tf": getattr(_o2t, "__version__", "?")},
                       metrics=metrics, seconds=round(time.perf_counter() - start, 3))
    return art.derive(out_path, fmt=Format.TFLITE, io=io, step=step, precision=precision)


# --------------------------------------------------------------------------- the hop's steps, in order
def _checked_inputs(art: Artifact, cfg: TfliteConfig, calib: Dataset | None, parity_inputs: list[np.ndarray] | None
                    ) -> tuple[Any, dict[str, tuple[int, ...]], Dataset | None, list[np.ndarray]]:
    """(the ONNX model, the fixed input sizes, the calibration set fitted to the model, the parity inputs):
    everything wrong with the input refused before any conversion time."""
    import onnx  # heavy: onnx

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
    if cfg.needs_calibration:
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
    return model, shapes, calib, parity_inputs


@dataclass
class _Prepared:
    """The ONNX model onnx2tf is given, and what edgekit changed in it on the way (recorded in the lineage)."""

    model: Any  # onnx.ModelProto
    simplified: dict | None = None  # onnxslim's folding of shape computations (see onnx2tf_prepare.simplify)
    renamed: dict[str, str] = field(default_factory=dict)  # node names TensorFlow rejects, rewritten
    edge_pools: list[str] = field(default_factory=list)  # MaxPools that now read an edge-padded input
    hints: list[dict] = field(default_factory=list)  # the nodes whose layout onnx2tf is told


def _prepare_onnx(model: Any, art: Artifact, cfg: TfliteConfig, shapes: dict[str, tuple[int, ...]],
                  src: Path) -> _Prepared:
    """What onnx2tf is given, written to ``src``: ConstantOfShape weights folded, the input sizes fixed and
    the shapes re-inferred, constant shape computations folded when inference leaves tensors shapeless, node
    names TF accepts; plain_defaults: the file as given (with the sizes fixed when asked)."""
    import onnx  # heavy: onnx

    prepared = model if cfg.plain_defaults else (fold_constant_of_shape(model) or model)
    if shapes or (not cfg.plain_defaults and any(s.shape and s.shape[0] is None for s in art.io.inputs)):
        prepared = fixed_shapes(prepared, shapes)
    prep = _Prepared(model=prepared)
    if not cfg.plain_defaults:
        if cfg.simplify and shapeless_tensors(prep.model):
            slim, prep.simplified = simplify(prep.model)
            prep.model = slim or prep.model
            prep.simplified["applied"] = slim is not None
        named, prep.renamed = tf_node_names(prep.model)
        prep.model = named or prep.model
        if cfg.precision == "int8" and cfg.quantization == "full":
            padded, prep.edge_pools = edge_padded_max_pools(prep.model)
            prep.model = padded or prep.model
    if prep.model is model:
        shutil.copyfile(art.path, src)
    else:
        onnx.save(prep.model, str(src))
    return prep


def _onnx2tf_args(prep: _Prepared, src: Path, work: Path, cfg: TfliteConfig, art: Artifact,
                  ops: dict[str, list[str]]) -> dict[str, Any]:
    """onnx2tf's arguments for ``src``. With layout hints, the hinted model is saved over ``src`` (``prep``
    records it and the hints) and the hints file is written beside it."""
    import onnx  # heavy: onnx

    # not_use_onnxsim: onnx2tf would run an `onnxsim` executable found on PATH (three times, in a
    # subprocess) and go on silently without one; edgekit simplifies itself, the same everywhere
    kwargs: dict[str, Any] = dict(input_onnx_file_path=str(src), output_folder_path=str(work / "tf"),
                                  non_verbose=True, not_use_onnxsim=True)
    if not cfg.plain_defaults:
        kwargs.update(copy_onnx_input_output_names_to_tflite=True, output_signaturedefs=True)
    if cfg.layout_hints and not cfg.plain_defaults:
        named, prep.hints = layout_hints(onnx.load(str(src), load_external_data=False))
        if named is not None:
            onnx.save(named, str(src))
            prep.model = named
        if prep.hints:
            (work / "layout_hints.json").write_text(json.dumps({"format_version": 1, "operations": prep.hints}))
            kwargs["param_replacement_file"] = str(work / "layout_hints.json")
    if cfg.keep_input_layout:  # onnx2tf asserts on a named input of another rank
        kwargs["keep_ncw_or_nchw_or_ncdhw_input_names"] = [s.name for s in art.io.inputs
                                                           if len(s.shape) in (3, 4, 5)]
    if cfg.pseudo_ops:
        kwargs["replace_to_pseudo_operators"] = [o.lower() for o in cfg.pseudo_ops]  # onnx2tf matches lower case
    if _RNN_OPS & set(ops) and not cfg.plain_defaults:
        kwargs["enable_rnn_unroll"] = True  # a loop over time would need TF Flex ops on the device
    return kwargs


def _failure_hint(cfg: TfliteConfig, shapes: dict[str, tuple[int, ...]]) -> str:
    """What an onnx2tf failure suggests: edgekit's own options, and the sizes the model was fixed to."""
    origin = "the data's shapes" if cfg.input_shapes_from == "data" else "--input-shape"
    sizes = ", ".join(f"{k} {tuple(v)}" for k, v in shapes.items())
    sized = f" (input sizes from {origin}: {sizes})" if shapes else ""
    return ("onnx2tf's own command-line flags are not edgekit options; edgekit's are --input-shape NAME:1,3,H,W "
            "(other static sizes) and the route fallback (keep_input_layout, onnx2tf's defaults, litert-torch "
            "from a .pt2); else keep the model on ONNX Runtime (--to onnx) or change that node in the model"
            + sized)


def _onnx_reference(art: Artifact) -> Callable:
    """Every output of the ONNX model under onnxruntime: the parity reference."""
    try:
        return ort_reference_all(Path(art.path))
    except Exception as exc:  # onnxruntime's own errors (InvalidGraph, Fail...)
        raise ConversionError(f"onnxruntime cannot run {Path(art.path).name}, the parity reference: "
                              f"{str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__}", hop=HOP,
                              hint="check the model's opset and ops are supported by onnxruntime") from exc


def _final_file(work: Path, cfg: TfliteConfig, io32: IOSpec, art: Artifact, calib: Dataset | None
                ) -> tuple[Path, str]:
    """(the .tflite of the configured precision, its precision: ``mixed`` for full INT8 with float fallback)."""
    precision = cfg.precision
    if cfg.precision == "fp32":
        return work / "tf" / "model_float32.tflite", precision
    if cfg.precision == "fp16":
        return work / "tf" / "model_float16.tflite", precision
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
    return final, precision


def _parity(cfg: TfliteConfig, precision: str, art: Artifact, onnx_ref: Callable, probe: list[np.ndarray],
            gots: list[np.ndarray], seconds: float) -> dict[str, Any]:
    """Parity with ONNX Runtime on every output, against the bar the precision (or ``parity_bar``) sets."""
    names = [s.name for s in art.io.outputs]
    bar = breakage_bar(precision) if cfg.parity_bar == "breakage" else precision
    return {**parity_metrics(compare_outputs(onnx_ref(probe), gots, "onnx", names), bar),
            "route": "onnx2tf", "precision": cfg.label, "parity_tolerance": bar,
            "convert_seconds": round(seconds, 3)}


def _prepared_notes(prep: _Prepared, reused: bool) -> dict[str, Any]:
    """What the lineage records of how onnx2tf's input was made and whether its run was reused."""
    notes: dict[str, Any] = {}
    if reused:  # onnx2tf's output of an identical input, from an earlier build in this process
        notes["onnx2tf_reused"] = True
    if prep.simplified is not None:  # constant shape computations folded before onnx2tf (see simplify)
        notes["simplified"] = prep.simplified
    if prep.edge_pools:  # MaxPools that read an edge-padded input (onnx2tf_prepare.edge_padded_max_pools)
        notes["max_pools_edge_padded"] = prep.edge_pools
    if prep.hints:  # which nodes' layout edgekit told onnx2tf (a parity failure then points at them first)
        notes["layout_hints"] = [h["op_name"] for h in prep.hints]
    return notes


def _chain_parity(art: Artifact, probe: list[np.ndarray], gots: list[np.ndarray], chain_reference: Callable | None,
                  chain_reference_name: str | None, chain_reference_all: Callable | None) -> dict[str, Any]:
    """Whole-chain parity (e.g. against the PyTorch model), when the caller gave a reference."""
    if chain_reference_all is None and chain_reference is None:
        return {}
    names = [s.name for s in art.io.outputs]
    refs = chain_reference_all(probe) if chain_reference_all is not None else [chain_reference(probe)]
    chain = compare_outputs(list(refs), gots[:len(refs)], chain_reference_name or "reference", names[:len(refs)])
    out: dict[str, Any] = {"chain_parity": next(iter(chain.values())).to_dict()}
    if len(chain) > 1:
        out["chain_parity_outputs"] = {k: v.to_dict() for k, v in chain.items()}
    return out


def _calibration_notes(cfg: TfliteConfig, calib: Dataset | None) -> dict[str, Any]:
    """Which calibration set a full-integer INT8 file was calibrated on, and how many samples of it."""
    if not cfg.needs_calibration or calib is None:
        return {}
    return {"calibration_samples": int(min(cfg.calibration_samples, calib.n)), "calibration_data": str(calib.path)}


__all__ = ["TfliteConfig", "onnx_to_tflite", "run_tflite", "run_tflite_all", "find_layout", "HOP", "simplify",
           "shapeless_tensors", "onnx2tf_failure", "strip_ansi"]
