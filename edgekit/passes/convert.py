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
from ..convert.hops import convert_to, hop_config
from ..errors import PassError
from ..formats import FORMATS, Format, all_options, all_precisions, convert_targets, format_spec, spec_for_runtime
from ..inputs.recipe import PassStep, Recipe, VariantSpec
from ..inputs.targets import TargetSpec
from .base import Pass, PassContext, PassOutput

_TFLITE_ONLY = format_spec(Format.TFLITE).options  # kept for importers; every row names its own options


class ConvertConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    to: Literal[convert_targets()]  # type: ignore[valid-type]  (the registry's conversion targets)
    precision: Literal[all_precisions()] = "fp32"  # type: ignore[valid-type]
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
    parity_bar: Literal["precision", "breakage"] = "precision"  # the search's INT8 and fp16, OpenVINO auto: "breakage"

    @model_validator(mode="after")
    def _fits_target(self):
        row = format_spec(self.to)
        set_ = [k for k in all_options() if k in self.model_fields_set and k not in row.options]
        if set_:
            owners = [s.format.value for s in FORMATS if any(k in s.options for k in set_)]
            raise ValueError(f"{', '.join(set_)} apply to to: {' | '.join(owners)} only")
        if self.precision not in row.precisions:
            raise ValueError(f"to: {self.to} makes the {' / '.join(row.precisions)} {row.label} model"
                             + (f"; {row.precision_hint}" if row.precision_hint else ""))
        return self

    def options(self) -> dict:
        """The options of this step's target format (its row's ``options``)."""
        return {k: getattr(self, k) for k in format_spec(self.to).options}

    def tflite(self):
        return hop_config(Format.TFLITE, self.precision, self.options())


class Convert(Pass):
    name = "convert"
    Config = ConvertConfig
    input_formats = (Format.ONNX,)  # Core ML and litert-torch read the PyTorch program from ctx.source

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
        row = format_spec(cfg.to)
        stem = out_name or f"convert-{cfg.to}-{cfg.precision}-{artifact.sha256[:12]}"
        parity = list(ctx.eval.xs) if ctx.eval is not None else None
        return convert_to(artifact, row.format, ctx.workdir / f"{stem}{row.suffix}", source=ctx.source,
                          precision=cfg.precision, options=cfg.options(), calib=ctx.calib, parity_inputs=parity,
                          route=cfg.route, workdir=ctx.workdir)

    def run(self, artifact: Artifact, config: Any, ctx: PassContext, stem: str) -> PassOutput:  # pragma: no cover
        raise NotImplementedError("Convert overrides __call__")


def has_convert_steps(recipe) -> bool:
    return any(step.name == "convert" for v in recipe.variants for step in v.passes)


def variants_for_target(recipe: Recipe, target: TargetSpec, has_calib: bool) -> Recipe:
    """The recipe with the variants the target's preferred runtime needs (its registry row's
    ``default_variants``), when the recipe has no convert steps of its own: LiteRT targets (rpi4,
    Android) get TFLite fp32 + INT8 (float I/O; full-integer with calibration data, else
    dynamic-range); Core ML targets get Core ML fp32/fp16/int8-weights. ONNX Runtime targets keep
    the recipe as it is."""

    if has_convert_steps(recipe) or not target.runtimes:
        return recipe
    row = spec_for_runtime(target.runtimes[0])
    if row is None or not row.default_variants:
        return recipe
    names = {v.name for v in recipe.variants} | {recipe.baseline}
    extra = []
    for cand in row.default_variants:
        passes = [list(p) for p in cand.passes]
        if cand.needs_calib and not has_calib:
            if cand.without_calib is None:
                continue
            passes[-1][1] = {**passes[-1][1], **cand.without_calib}
        if cand.name not in names:
            extra.append(VariantSpec(name=cand.name, passes=[PassStep(name=n, config=dict(c)) for n, c in passes]))
    if not extra:
        return recipe
    return recipe.model_copy(update={"variants": [*recipe.variants, *extra]})
