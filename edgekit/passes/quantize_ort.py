"""INT8 post-training quantization with onnxruntime: static (QDQ, per-channel by default,
calibrated on the user's calibration set) or dynamic (weights only, activations at run time)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..errors import DataError, PassError
from ..formats import Format
from ..logs import quiet
from .base import Pass, PassContext, PassOutput


class OrtQuantizeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["static", "dynamic"] = "static"
    format: Literal["qdq", "qoperator"] = "qdq"
    per_channel: bool = True
    activation_type: Literal["int8", "uint8"] = "int8"
    weight_type: Literal["int8", "uint8"] = "int8"
    calibration_method: Literal["minmax", "entropy", "percentile"] = "minmax"
    calibration_samples: int = Field(256, ge=1, description="calibration samples used (first N)")
    op_types: list[str] | None = None  # None = every op type onnxruntime can quantize
    nodes_to_exclude: list[str] = Field(default_factory=list)  # kept in float
    reduce_range: bool = False
    preprocess: bool = True  # onnxruntime's quant_pre_process (shape inference + graph optimization)


class _Reader:
    """onnxruntime CalibrationDataReader over the user's calibration arrays, one sample a batch."""

    def __init__(self, names: list[str], xs: tuple[np.ndarray, ...], dtypes: list[str]):
        self._it = iter([{n: np.ascontiguousarray(x[i:i + 1].astype(dt, copy=False))
                          for n, x, dt in zip(names, xs, dtypes)} for i in range(len(xs[0]))])

    def get_next(self):
        return next(self._it, None)

    def rewind(self):  # pragma: no cover - not used by single-pass calibrators
        raise NotImplementedError


class OrtQuantize(Pass):
    name = "quantize"
    Config = OrtQuantizeConfig
    input_formats = (Format.ONNX,)

    def run(self, artifact, config: OrtQuantizeConfig, ctx: PassContext, stem: str) -> PassOutput:
        from onnxruntime.quantization import (CalibrationMethod, QuantFormat, QuantType, quantize_dynamic,
                                              quantize_static)
        from onnxruntime.quantization.shape_inference import quant_pre_process

        qt = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
        out = ctx.workdir / f"{stem}.onnx"
        src = Path(artifact.path)
        pre = ctx.workdir / f".{stem}.pre.onnx"
        tmp = ctx.workdir / f".{stem}.partial.onnx"
        metrics: dict = {}
        try:
            with quiet("root", "onnxruntime"):
                if config.preprocess:
                    quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
                    src = pre
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
                    reader = _Reader([i.name for i in artifact.io.inputs], xs, [i.dtype for i in artifact.io.inputs])
                    quantize_static(
                        str(src), str(tmp), reader,
                        quant_format=QuantFormat.QDQ if config.format == "qdq" else QuantFormat.QOperator,
                        per_channel=config.per_channel, reduce_range=config.reduce_range,
                        activation_type=qt[config.activation_type], weight_type=qt[config.weight_type],
                        calibrate_method={"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                                          "percentile": CalibrationMethod.Percentile}[config.calibration_method],
                        op_types_to_quantize=config.op_types,
                        nodes_to_exclude=config.nodes_to_exclude or None,
                    )
                    metrics["calibration_samples"] = int(len(xs[0]))
                    metrics["calibration_data"] = str(ctx.calib.path)
            tmp.replace(out)
        except (DataError, PassError):
            raise
        except Exception as exc:  # onnxruntime.quantization raises plain Exceptions of many kinds
            raise PassError(f"onnxruntime quantization ({config.mode}) failed: {type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:300] if str(exc) else ''}",
                            hint="exclude the failing node with nodes_to_exclude, or try mode: dynamic") from exc
        finally:
            tmp.unlink(missing_ok=True)
            pre.unlink(missing_ok=True)
        return PassOutput(path=out, precision="int8", metrics=metrics)

