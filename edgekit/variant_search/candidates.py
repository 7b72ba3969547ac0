"""The candidate variants a target can run, as recipe variants (name + passes).

ONNX Runtime INT8 encodings differ a lot in speed by CPU (VNNI or not, QDQ fusion or not), so the
search tries the common ones rather than trusting one default:
  - ort-int8-default  : what `quantize_static` does with no arguments (QDQ, S8S8, per-tensor)
  - ort-int8-qdq-s8s8 : QDQ, S8S8, per-channel weights (onnxruntime's recommended CPU setting)
  - ort-int8-qdq-u8s8 : QDQ, U8 activations, S8 per-channel weights
  - ort-int8-qop-u8s8 : operator-fused QLinear ops, U8 activations, S8 weights
  - ort-int8-dynamic  : weights only, activations quantized at run time
LiteRT candidates come from the `convert` pass when it is installed: fp32, fp16, full-integer INT8
with float I/O, and dynamic-range INT8.
"""

from __future__ import annotations

from ..passes.registry import known_passes
from ..recipe import PassStep, VariantSpec
from ..targets import TargetSpec


def _q(**cfg) -> PassStep:
    return PassStep(name="quantize", config=cfg)


ORT_CANDIDATES: list[tuple[str, list[PassStep], bool]] = [  # (name, passes, needs calibration data)
    ("ort-int8-default", [_q(mode="static", format="qdq", per_channel=False)], True),
    ("ort-int8-qdq-s8s8", [_q(mode="static", format="qdq", per_channel=True)], True),
    ("ort-int8-qdq-u8s8", [_q(mode="static", format="qdq", per_channel=True, activation_type="uint8")], True),
    ("ort-int8-qop-u8s8", [_q(mode="static", format="qoperator", per_channel=True, activation_type="uint8")], True),
    ("ort-int8-dynamic", [_q(mode="dynamic")], False),
]

TFLITE_CANDIDATES: list[tuple[str, dict, bool]] = [
    ("tflite-fp32", {"to": "tflite", "precision": "fp32"}, False),
    ("tflite-fp16", {"to": "tflite", "precision": "fp16"}, False),
    ("tflite-int8", {"to": "tflite", "precision": "int8", "io": "float"}, True),
    ("tflite-dynamic", {"to": "tflite", "precision": "int8", "quantization": "dynamic"}, False),
]


def candidate_variants(target: TargetSpec, *, has_calib: bool) -> tuple[list[VariantSpec], list[tuple[str, str]]]:
    """Candidates for ``target`` (the fp32 ONNX baseline is always measured besides these), and the
    candidates skipped with the reason."""
    out: list[VariantSpec] = []
    skipped: list[tuple[str, str]] = []
    for runtime in target.runtimes:
        if runtime == "onnxruntime":
            for name, passes, needs_calib in ORT_CANDIDATES:
                if needs_calib and not has_calib:
                    skipped.append((name, "needs --calib-data"))
                    continue
                out.append(VariantSpec(name=name, passes=passes))
        elif runtime == "litert":
            if "convert" not in known_passes():
                skipped += [(n, "the TFLite converter is not installed in this edgekit") for n, _, _ in TFLITE_CANDIDATES]
                continue
            for name, cfg, needs_calib in TFLITE_CANDIDATES:
                if needs_calib and not has_calib:
                    skipped.append((name, "needs --calib-data"))
                    continue
                out.append(VariantSpec(name=name, passes=[PassStep(name="convert", config=cfg)]))
        else:
            skipped.append((runtime, f"profiling {runtime} needs its own host (e.g. Core ML needs macOS)"))
    return out, skipped
