"""The accuracy-aware pass's config (``AccuracyAwareConfig``, with the QAT rung's ``QatRung``), the per-device
encoding tables (``ENCODINGS``, fastest first) and the encodings a run tries (``encodings_for``). The bottom of the
package: it imports none of its siblings."""

from __future__ import annotations

import platform
from typing import Literal

from pydantic import Field

from ...agent.host import cpu_flags
from ..quantize_ort import CalibrationMethodName, OrtQuantizeConfig, encoding_label
from ..quantize_qat import QatSettings


class QatRung(QatSettings):
    """The QAT rung's settings (``qat:`` in the pass config; the fine-tune's own fields are
    ``quantize_qat.QatSettings``)."""

    enabled: bool = Field(True, description="with train data, fine-tune under simulated INT8 when PTQ misses")
    above_float_fraction: float = Field(0.25, ge=0, le=1, description="also try QAT when mixed precision meets the "
                                        "tolerance only by keeping more than this fraction of the quantizable ops in "
                                        "float (1: only when PTQ fails); the QAT model wins with fewer float ops")


Device = Literal["host", "x86-vnni", "x86-avx2", "arm64"]

# Encodings per device kind, fastest first: (format, activation_type, weight_type, per_channel, reduce_range).
ENCODINGS: dict[str, tuple[tuple[str, str, str, bool, bool], ...]] = {
    # measured here (Intel Xeon with AVX-512 VNNI, onnxruntime 1.32, 1 thread, the zoo's MobileNetV2 at 64x64,
    # median thread CPU time; benchmarks/int8_ladder.py): U8S8 QDQ or QOperator, per-tensor or per-channel,
    # 1.03-1.13x fp32; S8S8 QDQ 0.53-0.65x (slower than fp32); S8S8 QOperator 0.20x. On the zoo's LeViT
    # QOperator U8S8 beat QDQ U8S8 (0.70x vs 0.61x; INT8 slower than fp32 there), hence the host speed probe.
    # QOperator U8S8 per-tensor comes first: in benchmarks/compression_table.py (agent p50, 1 thread) it was
    # never slower than QDQ U8S8 per-tensor and faster on three of four models (the perf-style MobileNetV2
    # 0.388 vs 0.400 ms, LeViT 0.222 vs 0.246, Wav2Vec2 1.48 vs 1.55; the zoo MobileNetV2 a tie), so it wins
    # the probe's ties (PROBE_TIE).
    "x86-vnni": (("qoperator", "uint8", "int8", False, False), ("qdq", "uint8", "int8", False, False),
                 ("qdq", "uint8", "int8", True, False)),
    # not measured here: onnxruntime's quantization guide -- U8S8 on AVX2/AVX-512 without VNNI can saturate
    # (VPMADDUBSW), 7-bit weights (reduce_range) avoid it
    "x86-avx2": (("qdq", "uint8", "int8", False, True), ("qdq", "uint8", "int8", True, True)),
    # not measured here: onnxruntime's guide -- S8S8 QDQ per-channel is the recommended default on ARM64
    "arm64": (("qdq", "int8", "int8", True, False), ("qdq", "uint8", "int8", True, False)),
}
ENCODING_SOURCES = {
    "x86-vnni": "measured here (Intel Xeon, AVX-512 VNNI, onnxruntime 1.32; benchmarks/int8_ladder.py)",
    "x86-avx2": "onnxruntime quantization guide (U8S8 saturation without VNNI; reduce_range); not measured here",
    "arm64": "onnxruntime quantization guide (S8S8 QDQ recommended); not measured here",
}
# the speed probe's tie band: encodings within it of the fastest keep the device table's order (its
# first entry was measured faster on the device where the probe's host timing cannot tell them apart)
PROBE_TIE = 0.03
_PINNABLE = ("format", "activation_type", "weight_type", "per_channel", "reduce_range")


class AccuracyAwareConfig(OrtQuantizeConfig):
    max_accuracy_drop: float = Field(1.0, ge=0, le=100, description="accuracy points vs fp32 (1 = one point)")
    relative: bool = Field(False, description="read max_accuracy_drop as percent of the fp32 accuracy")
    device: Device = Field("host", description="whose encoding table to start from (host: read this CPU's flags)")
    calibration_methods: list[CalibrationMethodName] = Field(
        default_factory=lambda: ["minmax", "percentile", "entropy"],
        description="the calibration rung, in order (calibration_method set explicitly: only that one)")
    max_float_ops: int | None = Field(None, ge=0, description="give up rather than keep more ops than this in float")
    max_trials: int = Field(60, ge=1, description="quantize+evaluate budget of the search")
    eval_samples: int | None = Field(None, ge=1, description="score on the first N eval samples (default all)")
    screen_samples: int = Field(256, ge=1, description="eval samples the mixed-precision search scores on "
                                "before confirming on all of them")
    sensitivity_samples: int = Field(32, ge=1, description="eval samples the layer sensitivity is measured on")
    speed_probe: bool = Field(True, description="device 'host': order the encodings by their measured speed on "
                              "this CPU (full INT8 builds, thread CPU time, ~1 s) instead of the table's order")
    qat: QatRung = Field(default_factory=QatRung, description="the quantization-aware fine-tuning rung (needs train "
                         "data and the PyTorch model)")


def tolerance_points(max_drop: float, relative: bool, base_accuracy: float) -> float:
    """The tolerance in accuracy points (``relative`` reads ``max_drop`` as percent of the baseline)."""
    return max_drop * base_accuracy / 100.0 if relative else max_drop


def host_device() -> str:
    """This CPU's row of ``ENCODINGS`` (x86 with VNNI, x86 without, or arm64)."""
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "arm64"
    return "x86-vnni" if cpu_flags() & {"avx512_vnni", "avx_vnni"} else "x86-avx2"


def encodings_for(config: AccuracyAwareConfig) -> tuple[str, list[OrtQuantizeConfig]]:
    """(device kind, the encodings to try fastest first), explicitly set fields pinned."""
    device = host_device() if config.device == "host" else config.device
    base = OrtQuantizeConfig(**config.model_dump(include=set(OrtQuantizeConfig.model_fields)))
    if config.mode == "dynamic":  # weights only: no calibration, no activation encoding to choose
        return device, [base.model_copy(update={"preprocess": False})]
    pinned = {k: getattr(config, k) for k in _PINNABLE if k in config.model_fields_set}
    out: list[OrtQuantizeConfig] = []
    for fmt, act, w, pc, rr in ENCODINGS[device]:
        upd = {"format": fmt, "activation_type": act, "weight_type": w, "per_channel": pc, "reduce_range": rr,
               **pinned, "mode": "static", "preprocess": False}
        cfg = base.model_copy(update=upd)
        if all(encoding_label(cfg) != encoding_label(o) for o in out):
            out.append(cfg)
    return device, out
