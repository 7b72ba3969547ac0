"""The ONNX -> TFLite hop's options (``TfliteConfig``: the recipe's ``convert: {to: tflite, ...}`` step) and
the parity bar a reduced-precision file is held to."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

HOP = "onnx->tflite"


class TfliteConfig(BaseModel):
    """Options of the ONNX -> TFLite hop (the recipe's ``convert: {to: tflite, ...}`` step)."""

    model_config = ConfigDict(extra="forbid")

    precision: Literal["fp32", "fp16", "int8"] = "fp32"
    quantization: Literal["full", "dynamic"] = Field(
        "full", description="int8 only: full-integer (calibrated activations) or dynamic-range (weights only)")
    io: Literal["float", "int8"] = Field("float", description="full-integer int8: type of the model's inputs/outputs")
    calibration_samples: int = Field(200, ge=1, description="calibration samples used (first N)")
    per_channel: bool = Field(True, description="full int8: one weight scale per output channel (TensorFlow's "
                              "default); False: one per weight tensor (a rung of the microcontroller's INT8 ladder)")
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
    def _consistent(self) -> TfliteConfig:
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


def breakage_bar(precision: str) -> str:
    """The parity bar of a reduced-precision file judged by its metric next: INT8 (full or mixed) and fp16 face
    gross breakage only; fp32 keeps its own bar."""
    return {"int8": "int8-breakage", "mixed": "int8-breakage", "fp16": "breakage"}.get(precision, precision)
