"""Which metric scores the eval pass: the recipe's ``metric:`` section (or --metric/--output), what the user
brings, checked on load like the rest of the recipe. The metrics themselves are ``metrics/``'s."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class MetricSpec(BaseModel):
    """Which metric scores the eval pass (the recipe's ``metric:`` section, or --metric/--output)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("top1", description="a built-in name (see known_metrics()) or module:function / file.py:function")
    outputs: list[str] | None = Field(None, description="names (or 0-based indices) of the outputs the metric "
                                      "reads; default: the first output (detection: the first two)")
    postprocess: str | None = Field(None, description="detection: module:function turning the raw outputs into "
                                    "per-image (boxes cxcywh, scores, classes)")
    options: dict[str, Any] = Field(default_factory=dict, description="metric options, e.g. {k: 5}, "
                                    "{ignore_index: 255}, {threshold: 0.5}")
