"""The microcontroller's INT8 ladder (issue #44 item 2): the full-integer INT8 TFLite file judged by TFLite Micro's
own accuracy, rung by rung, until one is inside the gate's accuracy tolerance.

The accuracy-aware pass (``passes/accuracy_aware/``) climbs onnxruntime's quantizer and scores each rung with
onnxruntime: its rungs (float fallback of sensitive nodes, QDQ encodings, QAT) have no meaning in a full-integer file
for TFLM's kernels, where every op must be INT8. The knobs a full-integer TFLite file has are TensorFlow converter's,
so these rungs are few and bounded:

 1. TensorFlow's default: per-channel weight scales, the first ``calibration_samples`` (200) calibration samples;
 2. every calibration sample (up to ``MAX_CALIBRATION``): wider activation ranges seen, fewer clipped outliers
    (tried only when the calibration set has more than the default);
 3. per-tensor weight scales: one scale per weight tensor (the ranges differ; a rare model gains).

Each rung is converted and measured (``micro/workload.measure_micro``: TFLM's outputs on the eval set) and judged by
its TFLM accuracy drop from the float model against the gate's tolerance. The first rung inside it ships; when none
is, the one with the least drop does (and the gate says it is over). The ladder is chosen on the eval set the gate
then judges: with at most three rungs the selection's optimism is small, and the record says so."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..convert.tflite.config import TfliteConfig
from ..errors import EdgekitError

if TYPE_CHECKING:
    from ..artifact import Artifact
    from ..micro.workload import MicroMeasurement

MAX_CALIBRATION = 1000  # rung 2's calibration samples at most (TensorFlow's calibration runs each one through)
JUDGED_BY = ("TFLite Micro's accuracy on the eval set: its point drop from the float model against the gate's "
             "tolerance (at most 3 rungs are chosen on the set the gate judges)")


@dataclass(frozen=True)
class Rung:
    name: str
    cfg: TfliteConfig
    why: str


def rungs(base: TfliteConfig, calib_n: int) -> list[Rung]:
    """The ladder for a calibration set of ``calib_n`` samples, from ``base`` (full-integer INT8)."""
    out = [Rung(f"per-channel, {min(calib_n, base.calibration_samples)} calibration samples", base,
                "TensorFlow's default full-integer INT8")]
    more = min(calib_n, MAX_CALIBRATION)
    if more > base.calibration_samples:
        out.append(Rung(f"per-channel, {more} calibration samples",
                        base.model_copy(update={"calibration_samples": more}),
                        "every calibration sample: wider activation ranges seen, fewer clipped outliers"))
    out.append(Rung(f"per-tensor, {min(calib_n, base.calibration_samples)} calibration samples",
                    base.model_copy(update={"per_channel": False}),
                    "one scale per weight tensor: different weight ranges (a rare model gains)"))
    return out


@dataclass
class Climb:
    art: Artifact  # the shipped rung's file
    m: MicroMeasurement  # its measurement
    rung: Rung
    record: dict[str, Any] = field(default_factory=dict)  # the report's micro.int8_ladder


def climb(ladder: list[Rung], build: Callable[[int, Rung], tuple[Artifact, MicroMeasurement]],
          drop: Callable[[MicroMeasurement], float | None], tolerance: float | None,
          progress: Callable[[str], None]) -> Climb:
    """Each rung built and measured until one's TFLM drop is inside ``tolerance`` (None: the first rung ships: no
    metric to judge by). The first rung's failure is the run's; a later rung's is recorded and skipped."""
    tried: list[tuple[Rung, Artifact, MicroMeasurement, float | None]] = []
    rows: list[dict[str, Any]] = []
    for i, rung in enumerate(ladder):
        progress(f"INT8 ladder rung {i + 1}/{len(ladder)}: {rung.name}")
        try:
            art, m = build(i, rung)
        except EdgekitError as exc:
            if not tried:
                raise
            rows.append({"rung": rung.name, "why": rung.why, "error": getattr(exc, "message", str(exc))})
            continue
        d = drop(m)
        inside = tolerance is None or d is None or d <= tolerance
        rows.append({"rung": rung.name, "why": rung.why, "calibration_samples": rung.cfg.calibration_samples,
                     "per_channel": rung.cfg.per_channel, "accuracy_drop": None if d is None else round(d, 6),
                     "inside_tolerance": inside, "arena_bytes": m.arena.bytes, "size_bytes": art.size_bytes})
        tried.append((rung, art, m, d))
        if inside:
            break
    best = next((t for t in tried if tolerance is None or t[3] is None or t[3] <= tolerance), None)
    if best is None:  # none inside: the least drop (the earliest on a tie)
        best = min(tried, key=lambda t: float("inf") if t[3] is None else t[3])
    rest = [r.name for r in ladder[len(rows):]]
    record = {"judged_by": JUDGED_BY, "tolerance": tolerance, "rungs": rows, "shipped": best[0].name,
              **({"not_tried": rest, "why_not_tried": "an earlier rung was inside the tolerance"} if rest else {})}
    return Climb(art=best[1], m=best[2], rung=best[0], record=record)
