"""OpenVINO INT8 inside an accuracy tolerance: NNCF's accuracy control (``nncf.quantize_with_accuracy_control``)
on an OpenVINO IR, the rung of the recovery ladder for OpenVINO variants.

NNCF quantizes the fp32 IR on the calibration set, scores it with edgekit's own metric on the eval set
(the deploy's metric plan, top-1 without one: the same ``Scorer`` targets the ONNX ladder uses), and when
the drop is above ``max_accuracy_drop`` it ranks the quantized layers by their contribution to the drop and
returns them to float one group at a time until the model is inside it. The result is then scored again
here, through the agent's OpenVINORunner: a model outside the tolerance is never written (PassError naming
what NNCF reached). The lineage has both scores, the plain INT8 model's first, and how many quantizers
NNCF removed.

    variants:
      - name: openvino-int8-ac
        passes:
          - convert: {to: openvino, precision: fp32}
          - quantize_nncf: {max_accuracy_drop: 1.0}
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..convert.onnx_to_openvino import RT_KEY, _nncf_dataset, no_telemetry, run_ir_all
from ..errors import DataError, PassError
from ..formats import Format
from ..fsutil import publish_files
from ..inputs.source import model_batch
from ..logs import quiet
from .accuracy_aware.ladder import Scorer
from .base import Pass, PassContext, PassOutput


class NncfConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_accuracy_drop: float = Field(1.0, ge=0, description="in the metric's units (top-1: points)")
    preset: Literal["performance", "mixed"] = "performance"
    calibration_samples: int = Field(300, ge=1)
    max_num_iterations: int = Field(20, ge=1, description="NNCF's limit on layer groups returned to float")


def _fake_quantizers(model) -> int:
    return sum(op.get_type_name() == "FakeQuantize" for op in model.get_ops())


class QuantizeNncf(Pass):
    name = "quantize_nncf"
    Config = NncfConfig
    input_formats = (Format.OPENVINO,)

    def run(self, artifact, config: NncfConfig, ctx: PassContext, stem: str) -> PassOutput:
        if ctx.calib is None:
            raise DataError("quantize_nncf calibrates on your data and none was given", hint="pass --calib-data")
        if ctx.eval is None:
            raise DataError("quantize_nncf scores each candidate on the eval set and none was given",
                            hint="pass --eval-data with labels")
        plan = ctx.metric_plan
        if plan is None and ctx.eval.y is None:
            raise DataError("quantize_nncf needs labels (y) in the eval set, or a metric plan",
                            hint="add y=labels to the .npz")
        if artifact.precision != "fp32":
            raise PassError(f"quantize_nncf starts from the fp32 IR, got a {artifact.precision} one",
                            hint="convert: {to: openvino, precision: fp32} before it")

        no_telemetry()
        import nncf
        import openvino as ov


        xs = list(ctx.eval.xs)
        scorer = Scorer(xs, ctx.eval.y, plan)
        io = artifact.io
        names = [s.name for s in io.inputs]
        batch = model_batch([s.shape for s in io.inputs])
        calib, used = _nncf_dataset(list(ctx.calib.xs), names, batch, config.calibration_samples)
        size = batch or min(len(xs[0]), 256)
        val_items = [{n: np.ascontiguousarray(x[k:k + size]) for n, x in zip(names, xs)}
                     for k in range(0, len(xs[0]) - len(xs[0]) % size if batch else len(xs[0]), size)]
        n_val = len(val_items) * size if batch else len(xs[0])

        def goodness(outs: list[np.ndarray]) -> float:
            picked = [outs[i][:n_val] for i in scorer.idx]
            targets = scorer.targets[:n_val] if scorer.targets is not None else None
            return scorer.sign * float(scorer.metric.evaluate(picked, targets).value)

        def validate(compiled, items) -> float:
            outs = [[] for _ in compiled.outputs]
            req = compiled.create_infer_request()
            for item in items:
                res = req.infer(item)
                for i, o in enumerate(compiled.outputs):
                    outs[i].append(np.asarray(res[o]))
            return goodness([np.concatenate(o) for o in outs])

        core = ov.Core()
        model = core.read_model(str(artifact.path))
        fp32_fq = _fake_quantizers(model)
        with quiet("nncf", "openvino"):
            plain = nncf.quantize(model.clone(), calib, preset=getattr(nncf.QuantizationPreset, config.preset.upper()),
                                  subset_size=used, fast_bias_correction=True)
            plain_score = validate(core.compile_model(plain, "CPU", {"INFERENCE_NUM_THREADS": 1}), val_items)
            try:
                controlled = nncf.quantize_with_accuracy_control(
                    model, calib, nncf.Dataset(val_items), validation_fn=validate,
                    max_drop=float(config.max_accuracy_drop), drop_type=nncf.DropType.ABSOLUTE,
                    preset=getattr(nncf.QuantizationPreset, config.preset.upper()), subset_size=used,
                    advanced_accuracy_restorer_parameters=nncf.AdvancedAccuracyRestorerParameters(
                        max_num_iterations=config.max_num_iterations))
            except Exception as exc:
                raise PassError(f"NNCF accuracy control failed: {type(exc).__name__}: {str(exc).strip()[:300]}") \
                    from exc
        controlled.set_rt_info("auto", RT_KEY)
        out = ctx.workdir / f"{stem}.xml"
        tmp = Path(tempfile.mkdtemp(prefix=f".{stem}.", dir=ctx.workdir))
        try:
            tmp_xml = tmp / out.name
            ov.save_model(controlled, str(tmp_xml), compress_to_fp16=False)
            ref_goodness = goodness(run_ir_all(artifact.path, io, xs)[0])
            got, ran_at = run_ir_all(tmp_xml, io, xs)
            final = goodness(got)
            drop = (ref_goodness - final)
            if drop > config.max_accuracy_drop + 1e-9:
                raise PassError(f"NNCF accuracy control reached {scorer.value(final):.4g} {scorer.metric.label()}, "
                                f"{drop:.3g} below fp32's {scorer.value(ref_goodness):.4g}: outside the tolerance "
                                f"{config.max_accuracy_drop:g}; no model was written",
                                hint="raise max_accuracy_drop, or keep this model at fp32/auto")
            publish_files([(tmp_xml, out), (tmp_xml.with_suffix(".bin"), out.with_suffix(".bin"))])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        fq = _fake_quantizers(controlled)
        plain_fq = _fake_quantizers(plain)
        metrics = {"metric": scorer.metric.label(), "fp32": scorer.value(ref_goodness),
                   "plain_int8": scorer.value(plain_score), "accuracy": scorer.value(final),
                   "accuracy_drop": round(drop, 6), "plain_int8_drop": round(ref_goodness - plain_score, 6),
                   "quantizers": fq, "plain_quantizers": plain_fq, "quantizers_removed": plain_fq - fq,
                   "rung": "int8" if plain_fq == fq else "mixed", "inference_precision": ran_at,
                   "calibration_samples": used, "validation_samples": n_val, "fp32_quantizers": fp32_fq,
                   "nncf": nncf.__version__}
        return PassOutput(path=out, precision="int8" if plain_fq == fq else "mixed", metrics=metrics)


__all__ = ["NncfConfig", "QuantizeNncf"]
