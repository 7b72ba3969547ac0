"""A language model's files: the decode rate each was predicted at before its build (edgekit/llm/predict.py and
race.py write it into the file's lineage as ``predicted_decode``) beside the rate measured on the device, and how
close the predictions came. report.md and report.html show the same rows, so a prediction's error is visible
run after run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .model import Report


@dataclass(frozen=True)
class PredictionRow:
    variant: str
    predicted: float | None
    low: float | None
    high: float | None
    measured: float
    ratio: float | None  # measured / predicted
    mb_per_token: float
    basis: str


def prediction_rows(r: Report) -> list[PredictionRow]:
    rows = []
    for v in r.variants:
        pred: Any = next(
            (s.metrics["predicted_decode"] for s in reversed(v.lineage) if "predicted_decode" in s.metrics), None
        )
        measured = v.generation.decode_tokens_per_s if v.generation is not None else None
        if "@" in v.name or not isinstance(pred, dict) or not measured:
            continue
        value = pred.get("decode_tokens_per_s")
        low, high = (list(pred.get("range") or []) + [None, None])[:2]
        rows.append(
            PredictionRow(
                v.name,
                value,
                low,
                high,
                float(measured),
                float(measured) / value if value else None,
                (pred.get("bytes_per_token") or 0) / 1e6,
                str(pred.get("basis")),
            )
        )
    return rows


def how_close(rows: list[PredictionRow]) -> str:
    """The median error of the predictions made before measurement, and how many landed within 20%."""
    errors = sorted(abs(x.ratio - 1.0) for x in rows if x.ratio is not None and x.basis != "measured")
    if not errors:
        return "no file predicted"
    return f"median error {errors[len(errors) // 2]:.0%}, {sum(e <= 0.2 for e in errors)} of {len(errors)} within 20%"


HEAD = ["variant", "predicted tok/s (range)", "measured tok/s", "measured / predicted", "MB a token", "basis"]
INTRO = (
    "Bytes a decode step reads over each row's effective bandwidth (this device's history, else the benchmark's "
    "table), calibrated on the leader once it was measured"
)

__all__ = ["HEAD", "INTRO", "PredictionRow", "how_close", "prediction_rows"]
