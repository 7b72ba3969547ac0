"""INT8 post-training quantization with onnxruntime: static (QDQ or QOperator, per-channel or
per-tensor weights, U8S8 or S8S8, calibrated by minmax / percentile / entropy on the user's
calibration set) or dynamic (weights only, activations at run time).

Calibration is the expensive part of a static build and does not depend on the encoding: the
ranges onnxruntime computes (its ``TensorsData``) depend only on the model, the calibration
samples, the method (and its options) and which op types are calibrated -- not on the activation or
weight types, per-channel, QDQ/QOperator or ``nodes_to_exclude``. So they are computed once and kept
in edgekit's ``calibration`` cache (onnxruntime's own ``calibration_cache_path`` JSON, keyed by all
of those); every other setting of the same model reuses them (``EDGEKIT_NO_CACHE=1`` turns it off)."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..agent.host import ort_threads
from ..errors import DataError, PassError
from ..formats import Format
from ..fsutil import sha256_file
from ..inputs.source import ort_once
from ..inputs.stateful import feeds
from ..logs import quiet
from ..paths import cache_dir
from .base import Pass, PassContext, PassOutput

CalibrationMethodName = Literal["minmax", "entropy", "percentile"]


class OrtQuantizeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["static", "dynamic"] = "static"
    format: Literal["qdq", "qoperator"] = "qdq"
    per_channel: bool = True  # weights per output channel (False: one scale per tensor)
    # activation/weight types: uint8+int8 = "U8S8", int8+int8 = "S8S8" (onnxruntime's names)
    activation_type: Literal["int8", "uint8"] = "int8"
    weight_type: Literal["int8", "uint8"] = "int8"
    calibration_method: CalibrationMethodName = "minmax"
    calibration_percentile: float = Field(99.999, gt=0, le=100, description="percentile calibration's cut (CalibPercentile)")
    # histogram bins of entropy/percentile calibration; None: percentile 2048 (onnxruntime's default),
    # entropy 256 -- onnxruntime's entropy default of 128 bins equals its 128 quantized bins, which leaves one
    # candidate threshold, the full range: minmax under another name. Entropy's KL search costs O(bins^2) per
    # tensor (measured here on the zoo MobileNetV2: 256 bins 6 s, 512 bins 16 s, 2048 bins ~95 s).
    calibration_bins: int | None = Field(None, ge=129)
    calibration_samples: int = Field(256, ge=1, description="calibration samples used (first N)")
    calibration_cache: bool = Field(True, description="reuse calibration ranges across settings (see the module doc)")
    op_types: list[str] | None = None  # op_types_to_quantize; None = every op type onnxruntime can quantize
    nodes_to_exclude: list[str] = Field(default_factory=list)  # kept in float
    reduce_range: bool = False  # 7-bit weights: for x86 CPUs without VNNI (VPMADDUBSW saturation)
    preprocess: bool = True  # onnxruntime's quant_pre_process (shape inference + graph optimization)


def encoding_label(cfg: OrtQuantizeConfig) -> str:
    """``qdq-u8s8-per-tensor-minmax`` and the like (reports, lineage)."""
    if cfg.mode == "dynamic":
        return f"dynamic-{cfg.weight_type}"
    a = "u8" if cfg.activation_type == "uint8" else "s8"
    w = "u8" if cfg.weight_type == "uint8" else "s8"
    return (f"{cfg.format}-{a}{w}-{'per-channel' if cfg.per_channel else 'per-tensor'}-{cfg.calibration_method}"
            + ("-reduce-range" if cfg.reduce_range else ""))


class _Reader:
    """onnxruntime CalibrationDataReader over the user's calibration arrays, one sample a batch, in order;
    with a stream (edgekit/inputs/stateful.py) each feed also holds the constants and the state carried from
    the sample before (:func:`calibration_feeds`)."""

    def __init__(self, names: list[str], xs: tuple[np.ndarray, ...], dtypes: list[str], stream=None,
                 model: Path | None = None):
        self._it = calibration_feeds(names, xs, dtypes, stream, model)

    def get_next(self):
        return next(self._it, None)

    def rewind(self):  # pragma: no cover - not used by single-pass calibrators
        raise NotImplementedError


def calibration_feeds(names: list[str], xs: tuple[np.ndarray, ...], dtypes: list[str], stream=None,
                      model: Path | None = None):
    """Each calibration sample's feed (input name -> array), one sample at a time in the data's order.
    ``stream``: every model input is fed, the constants beside the data and a stateful model's state
    carried as in use: zeros first, then the state ``model`` (the float model) returned for the sample before
    (the calibrator cannot hand its own outputs back)."""
    if stream is None:
        for i in range(len(xs[0])):
            yield {n: np.ascontiguousarray(x[i:i + 1].astype(dt, copy=False)) for n, x, dt in zip(names, xs, dtypes)}
        return
    once = ort_once(model)[0] if stream.stateful else None
    for feed in feeds(once, list(xs), stream):
        yield {n: np.asarray(np.asarray(x).astype(dt, copy=False), order="C") for n, x, dt in zip(names, feed, dtypes)}


def _calibration_key(model: Path, xs: tuple[np.ndarray, ...], cfg: OrtQuantizeConfig, stream=None) -> str:
    from importlib.metadata import version


    h = hashlib.sha256()
    h.update(sha256_file(model).encode())
    for x in xs:
        a = np.ascontiguousarray(x)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(hashlib.sha256(a.tobytes()).digest())
    h.update(f"{cfg.calibration_method};{cfg.calibration_percentile};{cfg.calibration_bins};{sorted(cfg.op_types or [])};"
             f"ort={version('onnxruntime')}".encode())
    if stream is not None:  # constants and carried state change the ranges
        h.update(f"stream={stream.fingerprint()}".encode())
    return h.hexdigest()[:32]


def calibration_cache_path(model: Path, xs: tuple[np.ndarray, ...], cfg: OrtQuantizeConfig,
                           stream=None) -> Path | None:
    """Where the calibration ranges of ``model`` on ``xs`` by ``cfg``'s method live (None: cache off)."""
    if not cfg.calibration_cache or os.environ.get("EDGEKIT_NO_CACHE") == "1":
        return None

    return cache_dir("calibration") / f"{_calibration_key(model, xs, cfg, stream)}.json"


def calibrate(model: Path, reader, cfg: OrtQuantizeConfig, out: Path, workdir: Path) -> None:
    """onnxruntime's ``create_calibrator`` + ``collect_data`` + ``compute_data`` on ``model``, the ranges
    saved to ``out`` (a name only this call writes) for ``quantize_static(calibration_cache_path=...)``.
    Called directly (not through ``quantize_static``) because quantize_static does not pass the
    histogram size on, and its entropy default (128 bins for 128 quantized bins) is minmax."""
    import tempfile

    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator, save_tensors_data
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
              "percentile": CalibrationMethod.Percentile}[cfg.calibration_method]
    extra: dict = {}
    if cfg.calibration_method == "entropy":
        extra = {"num_bins": cfg.calibration_bins or 256, "num_quantized_bins": 128}
    elif cfg.calibration_method == "percentile":
        extra = {"num_bins": cfg.calibration_bins or 2048, "percentile": cfg.calibration_percentile}
    op_types = cfg.op_types or sorted(set(QDQRegistry) | set(QLinearOpsRegistry))
    with tempfile.TemporaryDirectory(prefix=".calib-", dir=workdir) as tmp:
        calibrator = create_calibrator(model, op_types, augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                                       calibrate_method=method, extra_options=extra)
        _size_session(calibrator)
        calibrator.collect_data(reader)
        save_tensors_data(calibrator.compute_data(), out)
        del calibrator


def _size_session(calibrator) -> None:
    """onnxruntime's calibrator opens its session with a thread per core, which on a busy host waits
    for cores other processes hold: reopen it with the host's threads (edgekit/host.py)."""
    import onnxruntime as ort


    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as onnxruntime's own
    so.intra_op_num_threads = ort_threads()
    so.log_severity_level = 3
    calibrator.infer_session = ort.InferenceSession(calibrator.augmented_model_path, sess_options=so,
                                                    providers=calibrator.execution_providers)


def stream_note(stream, n: int) -> dict:
    """How calibration fed a streaming model (the lineage's record)."""
    note: dict = {"constants": {k: v.tolist() for k, v in stream.constants.items()}}
    if stream.stateful:
        note["state"] = [f"{s.output} -> {s.input}" for s in stream.state]
        note["carried"] = (f"state carried across the {n} calibration samples in their order, from zeros, "
                           "each fed the float model's state after the sample before")
    return note


class OrtQuantize(Pass):
    name = "quantize"
    Config = OrtQuantizeConfig
    input_formats = (Format.ONNX,)

    def run(self, artifact, config: OrtQuantizeConfig, ctx: PassContext, stem: str) -> PassOutput:
        from onnxruntime.quantization import (
            CalibrationMethod,
            QuantFormat,
            QuantType,
            quantize_dynamic,
            quantize_static,
        )
        from onnxruntime.quantization.shape_inference import quant_pre_process

        qt = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
        out = ctx.workdir / f"{stem}.onnx"
        src = Path(artifact.path)
        pre = ctx.workdir / f".{stem}.pre.onnx"
        tmp = ctx.workdir / f".{stem}.partial.onnx"
        up = ctx.workdir / f".{stem}.opset13.onnx"
        cache_tmp: Path | None = None
        metrics: dict = {"encoding": encoding_label(config)}
        try:
            with quiet("root", "onnxruntime"):
                if config.preprocess:
                    quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
                    src = pre
                if config.per_channel:
                    src = _per_axis_opset(src, up, metrics)
                if config.mode == "dynamic":
                    quantize_dynamic(str(src), str(tmp), per_channel=config.per_channel,
                                     reduce_range=config.reduce_range, weight_type=qt[config.weight_type],
                                     op_types_to_quantize=config.op_types,
                                     nodes_to_exclude=config.nodes_to_exclude or None)
                else:
                    if ctx.calib is None:
                        raise DataError("static INT8 quantization needs a calibration set",
                                        hint="pass --calib-data CALIB.npz (or use mode: dynamic in the recipe)")
                    xs = tuple(x[: config.calibration_samples] for x in ctx.calib.xs)
                    stream = getattr(ctx.calib, "stream", None)  # constant/state inputs (edgekit/inputs/stateful.py)
                    reader = _Reader([i.name for i in artifact.io.inputs], xs, [i.dtype for i in artifact.io.inputs],
                                     stream, Path(artifact.path))
                    cache = calibration_cache_path(src, xs, config, stream)
                    reused = cache is not None and cache.is_file()
                    started = time.perf_counter()
                    ranges = cache if reused else (ctx.workdir / f".{stem}.calibration.json" if cache is None else
                                                   cache.with_name(f".{cache.stem}.{os.getpid()}.{time.monotonic_ns()}.json"))
                    if not reused:
                        cache_tmp = ranges
                        calibrate(src, reader, config, ranges, ctx.workdir)
                        if cache is not None:
                            ranges.replace(cache)
                            ranges = cache
                    calib_seconds = time.perf_counter() - started
                    quantize_static(
                        str(src), str(tmp), None,
                        quant_format=QuantFormat.QDQ if config.format == "qdq" else QuantFormat.QOperator,
                        per_channel=config.per_channel, reduce_range=config.reduce_range,
                        activation_type=qt[config.activation_type], weight_type=qt[config.weight_type],
                        calibrate_method={"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                                          "percentile": CalibrationMethod.Percentile}[config.calibration_method],
                        op_types_to_quantize=config.op_types,
                        nodes_to_exclude=config.nodes_to_exclude or None,
                        calibration_cache_path=ranges,
                    )
                    metrics["calibration_samples"] = int(len(xs[0]))
                    metrics["calibration_data"] = str(ctx.calib.path)
                    metrics["calibration"] = {"method": config.calibration_method, "reused": reused,
                                              "seconds": round(calib_seconds, 3),
                                              **({"stream": stream_note(stream, len(xs[0]))} if stream else {})}
            _loads_in_onnxruntime(tmp, config)
            tmp.replace(out)
        except (DataError, PassError):
            raise
        except Exception as exc:  # onnxruntime.quantization raises plain Exceptions of many kinds
            raise PassError(f"onnxruntime quantization ({config.mode}, {encoding_label(config)}) failed: "
                            f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}",
                            hint="exclude the failing node with nodes_to_exclude, try another calibration_method, "
                            "or mode: dynamic") from exc
        finally:
            tmp.unlink(missing_ok=True)
            pre.unlink(missing_ok=True)
            up.unlink(missing_ok=True)
            if cache_tmp is not None:
                cache_tmp.unlink(missing_ok=True)
        return PassOutput(path=out, precision="int8", metrics=metrics)


PER_AXIS_OPSET = 13  # DequantizeLinear/QuantizeLinear take `axis` (per-channel scales) from opset 13


def _per_axis_opset(src: Path, up: Path, metrics: dict) -> Path:
    """Per-channel weights need a per-axis DequantizeLinear, which ONNX has from opset 13; onnxruntime's
    quantizer writes one into an older model anyway (only logging a warning), and the file then fails to load
    ("Unrecognized attribute: axis for operator DequantizeLinear", seen on PP-OCR's opset-11 classifier). So
    an older model is converted to opset 13 first (onnx's version converter; recorded in the metrics)."""
    import onnx
    from onnx import version_converter

    model = onnx.load(str(src))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), PER_AXIS_OPSET)
    if opset >= PER_AXIS_OPSET:
        return src
    try:
        onnx.save(version_converter.convert_version(model, PER_AXIS_OPSET), str(up))
    except Exception as exc:  # the converter raises plain errors naming the op it cannot adapt
        raise PassError(f"per-channel INT8 needs opset {PER_AXIS_OPSET} (per-axis DequantizeLinear) and this model is "
                        f"opset {opset}; onnx's version converter could not upgrade it: "
                        f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}",
                        hint="quantize with per-tensor weights (--per-tensor, or per_channel: false in the recipe), "
                        f"or export the model at opset {PER_AXIS_OPSET} or later") from exc
    metrics["opset_upgraded"] = {"from": opset, "to": PER_AXIS_OPSET,
                                 "why": "per-channel weights need a per-axis DequantizeLinear"}
    return up


def _loads_in_onnxruntime(path: Path, config: OrtQuantizeConfig) -> None:
    """The written file is one onnxruntime loads: its quantizer can write graphs onnxruntime then refuses
    (a schema the model's opset lacks), and such a file must fail here, naming the cause, not on the device."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's load errors derive from Exception
        raise PassError(f"onnxruntime quantization ({config.mode}, {encoding_label(config)}) wrote a model onnxruntime "
                        f"cannot load: {str(exc).splitlines()[0][:400]}",
                        hint="exclude the node it names with nodes_to_exclude, or try per-tensor weights or the "
                        "other format (qdq/qoperator); no file was written") from exc
