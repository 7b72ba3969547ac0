"""An onnxruntime runner on a host whose load grows while it runs, registered in the device agent through its
plug-in point (``EDGEKIT_AGENT_PLUGINS=this file``, read by the local agent subprocess).

Every run of a model is followed by a busy wait of ``BASE_S * exp(RATE * t)``, ``t`` the seconds since the agent
process loaded this file: the same file takes longer the later it runs, as on a shared host whose neighbour
starts working (+10% every 50 ms block of an A/B run). Two identical files timed one after another then read as
different speeds, and so do A B, A B, ... blocks (B always 10% later); in alternating rounds (A B, B A, ...) the
rounds' ratios cancel and the files read as the same. This file runs inside the agent, not in pytest."""

from __future__ import annotations

import math
import time
from typing import Any

from edgekit_agent.runners import OnnxRunner, register

BASE_S = 100e-6
RATE = 2.0  # the planted load's growth: e^(2t), +10% per 50 ms
START = time.perf_counter()


@register
class DriftingOnnxRunner(OnnxRunner):
    name = "onnxruntime"

    def run(self, feeds: Any) -> Any:
        out = super().run(feeds)
        now = time.perf_counter()
        end = now + BASE_S * math.exp(RATE * (now - START))
        while time.perf_counter() < end:
            pass
        return out
