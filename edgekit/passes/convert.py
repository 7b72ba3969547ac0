"""The recipe step that changes a variant's format:

    variants:
      - name: tflite-int8
        passes:
          - convert: {to: tflite, precision: int8, io: float}

It takes the fp32 ONNX model (or a PyTorch program for Core ML / litert-torch), runs the converter
chain with its parity check, and records the hop as a ``convert`` lineage step (so the gate names
the hop when its parity is out of tolerance).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..artifact import Artifact
from ..config import validate
from ..errors import ConversionError, PassError
from ..formats import Format
from .base import Pass, PassContext, PassOutput

_TFLITE_ONLY = ("quantization", "io", "calibration_samples", "allow_float_fallback", "keep_input_layout",
                "input_shapes", "pseudo_ops")


class ConvertConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    to: Literal["onnx", "tflite", "coreml"]
    precision: Literal["fp32", "fp16", "int8"] = "fp32"
    route: Literal["auto", "onnx2tf", "litert-torch"] = Field("auto", description="tflite: which converter; "
                                                              "auto tries onnx2tf, then litert-torch")
    # TFLite options (see convert/onnx_to_tflite.py: TfliteConfig)
    quantization: Literal["full", "dynamic"] = "full"
    io: Literal["float", "int8"] = "float"
    calibration_samples: int = Field(200, ge=1)
    allow_float_fallback: bool = False
    keep_input_layout: bool = False
    input_shapes: dict[str, list[int]] | None = None
    pseudo_ops: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _fits_target(self):
        if self.to != "tflite":
            set_ = [k for k in _TFLITE_ONLY if k in self.model_fields_set]
            if set_:
                raise ValueError(f"{', '.join(set_)} apply to to: tflite only")
        if self.to == "onnx" and self.precision != "fp32":
            raise ValueError("to: onnx makes the fp32 ONNX model; quantize it with a `quantize` step")
        return self

    def tflite(self):
        from ..convert.onnx_to_tflite import TfliteConfig

        return TfliteConfig(precision=self.precision, **{k: getattr(self, k) for k in _TFLITE_ONLY})


class Convert(Pass):
    name = "convert"
    Config = ConvertConfig
    input_formats = (Format.ONNX,)  # Core ML and litert-torch read the PyTorch program from ctx.extras["source"]

    def __call__(self, artifact: Artifact, config: dict | BaseModel | None, ctx: PassContext,
                 *, out_name: str | None = None) -> Artifact:
        # A conversion records its own `convert` lineage step (hop name + parity), not a `pass` step.
        cfg = config if isinstance(config, ConvertConfig) else validate(
            ConvertConfig, config or {}, "config of pass 'convert'",
            hint="e.g. convert: {to: tflite, precision: int8, io: float}")
        if artifact.format not in self.input_formats:
            raise PassError(f"convert takes the fp32 ONNX or PyTorch model, got {artifact.format.value}",
                            hint="put the convert step first in the variant's passes")
        ctx.workdir.mkdir(parents=True, exist_ok=True)
        stem = out_name or f"convert-{cfg.to}-{cfg.precision}-{artifact.sha256[:12]}"
        source = ctx.extras.get("source")
        parity = list(ctx.eval.xs) if ctx.eval is not None else None
        if cfg.to == "onnx":
            if artifact.format == Format.ONNX:
                return artifact
            from ..convert.torch_to_onnx import export_onnx

            return export_onnx(source, ctx.workdir / f"{stem}.onnx", parity or list(ctx.calib.xs))
        if cfg.to == "coreml":
            from ..convert.torch_to_coreml import CoremlConfig, torch_to_coreml

            if source is None or source.program is None:
                raise ConversionError("Core ML conversion needs the PyTorch model; this run started from ONNX",
                                      hop="torch->coreml", hint="give edgekit the .pt2 (or .pth with --arch)")
            return torch_to_coreml(source, ctx.workdir / f"{stem}.mlpackage", CoremlConfig(precision=cfg.precision),
                                   parity_inputs=parity)
        from ..convert.chain import convert_to_tflite

        if artifact.format != Format.ONNX:
            raise PassError("convert to tflite starts from the ONNX model", hint="the pipeline exports it first")
        return convert_to_tflite(artifact, ctx.workdir / f"{stem}.tflite", cfg.tflite(), source=source,
                                 calib=ctx.calib, parity_inputs=parity, route=cfg.route)

    def run(self, artifact: Artifact, config: Any, ctx: PassContext, stem: str) -> PassOutput:  # pragma: no cover
        raise NotImplementedError("Convert overrides __call__")


def has_convert_steps(recipe) -> bool:
    return any(step.name == "convert" for v in recipe.variants for step in v.passes)


def variants_for_target(recipe, target, has_calib: bool):
    """The recipe with the variants the target's preferred runtime needs, when the recipe has no
    convert steps of its own: LiteRT targets (rpi4, Android) get TFLite fp32 + INT8 (float I/O;
    full-integer with calibration data, else dynamic-range); Core ML targets get Core ML fp32/fp16/
    int8-weights. ONNX Runtime targets keep the recipe as it is."""
    from ..recipe import PassStep, VariantSpec

    if has_convert_steps(recipe) or not target.runtimes:
        return recipe
    first = target.runtimes[0]
    names = {v.name for v in recipe.variants} | {recipe.baseline}
    if first == "litert":
        int8 = {"to": "tflite", "precision": "int8", "io": "float"}
        if not has_calib:
            int8["quantization"] = "dynamic"
        new = [("tflite-fp32", {"to": "tflite", "precision": "fp32"}), ("tflite-int8", int8)]
    elif first == "coreml":
        new = [(f"coreml-{p}", {"to": "coreml", "precision": p}) for p in ("fp32", "fp16", "int8")]
    else:
        return recipe
    extra = [VariantSpec(name=n, passes=[PassStep(name="convert", config=c)]) for n, c in new if n not in names]
    return recipe.model_copy(update={"variants": [*recipe.variants, *extra]})
