"""INT8 with Intel Neural Compressor's tuning (``--backend inc``), PyTorch PT2E path, under the
same tolerance contract as the accuracy-aware onnxruntime pass: INC tries its INT8 config set in
order (``autotune`` with ``tolerable_loss`` = our tolerance as a fraction of the fp32 accuracy),
scoring each on the eval set; the first that meets the tolerance is exported to ONNX (QDQ) so the
device measures it like every other variant. When none does, PassError with the best one.

ONNX models are not supported by this backend: INC's ONNX package, onnx-neural-compressor 1.0,
declares ``numpy<2``, which conflicts with the rest of the stack (numpy 2.x); use the default
``--backend ort`` for ONNX models.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..convert.torch_to_onnx import export_onnx
from ..errors import DataError, MissingExtraError, PassError
from ..formats import Format
from ..inputs.source import from_program
from ..logs import quiet
from .accuracy_aware.config import tolerance_points
from .base import PassContext, PassOutput, TorchPass

ONNX_UNSUPPORTED = ("--backend inc takes PyTorch models (.pt2, or .pth with --arch) only: INC's ONNX package "
                    "onnx-neural-compressor 1.0 declares numpy<2, which conflicts with the rest of edgekit's "
                    "stack (numpy 2), so edgekit does not use it")


class IncQuantizeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_accuracy_drop: float = Field(1.0, ge=0, le=100, description="accuracy points vs fp32 (1 = one point)")
    relative: bool = Field(False, description="read max_accuracy_drop as percent of the fp32 accuracy")
    calibration_samples: int = Field(256, ge=1)
    max_trials: int = Field(20, ge=1, description="INC configurations tried at most")
    eval_samples: int | None = Field(None, ge=1)
    threads: int | None = Field(1, ge=1, description="torch threads (None: torch default)")


class IncQuantize(TorchPass):
    name = "quantize_inc"
    Config = IncQuantizeConfig

    def run_torch(self, artifact, config: IncQuantizeConfig, ctx: PassContext, stem: str) -> PassOutput:
        import torch

        from . import _torch as T  # heavy: torch

        try:
            with quiet("neural_compressor"):
                from neural_compressor.torch.quantization import StaticQuantConfig, TuningConfig, autotune
        except ImportError as exc:
            raise MissingExtraError("neural-compressor", "inc", "--backend inc") from exc
        if ctx.calib is None:
            raise DataError("INC static INT8 needs a calibration set", hint="pass --calib-data CALIB.npz")
        if ctx.eval is None or ctx.eval.y is None:
            raise DataError("INC tuning scores accuracy and needs an eval set with labels",
                            hint="pass --eval-data EVAL.npz with x and y")
        n = config.eval_samples or ctx.eval.n
        xs_eval = tuple(x[:n] for x in ctx.eval.xs)
        y = ctx.eval.y.reshape(ctx.eval.n, -1)[:n, 0]
        calib = tuple(x[: config.calibration_samples] for x in ctx.calib.xs)
        ep = T.load_program(artifact)
        model = ep.module()  # a torch.export graph: what INC's PT2E prepare() takes
        # what neural_compressor.torch.export.export() marks on the same ep.module() result
        model._exported = True
        model.dynamic_shapes = None
        example = tuple(torch.from_numpy(np.ascontiguousarray(x[:1])) for x in calib)

        def acc(m) -> float:
            return float((T.predict(m, xs_eval).argmax(1) == y).mean())

        trials: list[float] = []

        def eval_fn(m) -> float:
            a = acc(m)
            trials.append(a)
            return a

        def run_fn(m) -> None:
            with torch.no_grad():
                for i in range(len(calib[0])):
                    m(*[torch.from_numpy(np.ascontiguousarray(x[i:i + 1])) for x in calib])

        base_acc = acc(model) * 100
        tol = tolerance_points(config.max_accuracy_drop, config.relative, base_acc)
        # INC's own INT8 tuning space, spelled out (its get_config_set_for_tuning() returns one config
        # with list-valued fields, which autotune() in 3.10 cannot iterate)
        space = [StaticQuantConfig(act_sym=sym, act_algo=algo, w_granularity=gran)
                 for gran in ("per_channel", "per_tensor") for algo in ("minmax", "kl") for sym in (False, True)]
        tune = TuningConfig(config_set=space,
                            tolerable_loss=tol / base_acc if base_acc else 0.0, max_trials=config.max_trials)
        logging.getLogger("neural_compressor").setLevel(logging.ERROR)
        try:
            with quiet("neural_compressor"):
                q = autotune(model, tune, eval_fn=eval_fn, run_fn=run_fn, example_inputs=example)
        except ImportError:
            raise
        except Exception as exc:  # INC raises many kinds; the pass names the backend and the first line
            raise PassError(f"Intel Neural Compressor failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
                            hint="try --backend ort") from exc
        tried = [round(a * 100, 4) for a in trials[1:]]  # the first evaluation is INC's fp32 baseline
        if q is None:
            best = max(tried) if tried else None
            raise PassError(
                f"INC found no INT8 configuration within {tol:.2f} accuracy points of fp32 ({base_acc:.2f}%): "
                f"best of {len(tried)} tried drops {base_acc - best:.2f} points; no model was written"
                if best is not None else f"INC tried no configuration (fp32 {base_acc:.2f}%)",
                hint="raise --max-accuracy-drop, or use --backend ort (keeps sensitive ops in float)")
        final = acc(q) * 100
        if base_acc - final > tol:
            # INC 3.10's autotune also returns a model when it stops at max_trials without meeting
            # tolerable_loss: checked here, never shipped silently
            raise PassError(
                f"INC found no INT8 configuration within {tol:.2f} accuracy points of fp32 ({base_acc:.2f}%): "
                f"the best of {len(tried)} tried ({max(tried + [final]):.2f}%) drops "
                f"{base_acc - max(tried + [final]):.2f} points; no model was written",
                hint="raise --max-accuracy-drop, or use --backend ort (keeps sensitive ops in float)")
        out = ctx.workdir / f"{stem}.onnx"
        # INC's result is a PT2E graph with quantize/dequantize ops: exported as an ONNX QDQ model
        static = torch.export.export(q, example)

        tmp_src = from_program(static, artifact.path)
        onnx_art = export_onnx(tmp_src, out, list(xs_eval))
        parity = onnx_art.lineage[-1].metrics.get("parity")
        metrics: dict[str, Any] = {
            "backend": "neural-compressor (PT2E)", "fp32_accuracy": round(base_acc, 4), "accuracy": round(final, 4),
            "accuracy_drop": round(base_acc - final, 4), "tolerance_points": round(tol, 4), "trials": tried,
            "export_parity_vs_inc_torch": parity, "eval_data": str(ctx.eval.path), "eval_samples": n,
            "calibration_data": str(ctx.calib.path),
        }
        return PassOutput(path=out, precision="int8", metrics=metrics, fmt=Format.ONNX, io=onnx_art.io)
