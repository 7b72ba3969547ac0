"""The order and the budget of a language model's builds (issue #45 items 1 and 2): build what can win first,
and never start what cannot win or cannot finish.

- **Order**: the float baseline first (the reference every file is judged against, and the ONNX files' base),
  then the cheap rows (exports and quantizations: seconds to a few minutes) by predicted decode rate, fastest
  first, then the slow ones (``LMCandidate.slow``: ExecuTorch's XNNPACK lowering, over 20 minutes for a 135M
  model on a busy 2-core host) by the same prediction (``predict.py``).
- **Can it win?** Before a slow row, the best built file by prediction is measured on the device (``probe``,
  once), which makes it the leader when it is inside the KLD tolerance. A slow row starts only when its
  optimistic prediction (its figure times its spread) beats the leader's measured decode; otherwise it is named
  ``not built: ... cannot beat ...``. Each probe's effective bandwidth is kept for the device
  (``efficiency.py``), so later predictions use this device's figures.
- **The budget** (``--time-budget``, ``DEFAULT_BUDGET_S``) covers preparation, every build, the device and the
  scoring: a row starts only when its predicted build time fits in what is left after the measurement of the
  files built so far and its own (``MEASURE_S``); a build that checks the deadline (the int4 ladder between
  rungs) stops at it. A row not built is named ``not built: out of time budget ...`` with its prediction and
  the leader's figure; the files built so far are measured and the best ships.

The build-time priors (``BUILD_S_PER_MPARAM``, seconds a million parameters on one busy core) are the issue's
figures (the 8da4w lowering of a 135M model: over 20 minutes on a 2-core AVX2 host with other work) and the
benchmark's (docs/benchmarks/language-models.md: a 1418 s ``--search`` deploy of a 125M model)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..artifact import Artifact
from ..report.model import VariantResult
from ..timeline import Clock
from . import build_times, efficiency
from .candidates import BASELINE, LMCandidate
from .predict import ENCODINGS, Prediction, Weights, bytes_per_token, predict

DEFAULT_BUDGET_S = 900.0  # the short search of a ~100M model on 2 cores: prepare ~1 min, 7 cheap rows, measurement
SEARCH_BUDGET_S = 1800.0  # --search: every row, ExecuTorch's lowerings included where they can win
# seconds a million parameters to build a row (export, quantization, the int4 ladder's host checks, lowering)
BUILD_S_PER_MPARAM = {"slow": 9.0, "ort-fp32": 0.6, "ort-int8": 0.3, "gguf": 0.25, "int4": 1.0, "other": 0.6}
MEASURE_S = (15.0, 0.35)  # a file's measurement and scoring on the device: fixed seconds + seconds a M params
TUNING = 1.3  # the thread settings measured after the race (threads.py): about a third more
MAX_PROBES = 2

Probe = Callable[[str, Artifact], "tuple[VariantResult, dict[str, Any]] | None"]


def build_seconds(c: LMCandidate, params: int) -> float:
    """Row ``c``'s predicted build time on ``params`` parameters: this host's kept builds (``build_times``), else
    the prior."""
    kept = build_times.predicted_seconds(c.name, params)
    if kept is not None:
        return kept
    if c.name in BUILD_S_PER_MPARAM:
        rate = BUILD_S_PER_MPARAM[c.name]
    elif c.slow:
        rate = BUILD_S_PER_MPARAM["slow"]
    elif c.runtime == "llama.cpp":
        rate = BUILD_S_PER_MPARAM["gguf"]
    elif c.precision in ("int4", "8da4w"):
        rate = BUILD_S_PER_MPARAM["int4"]
    else:
        rate = BUILD_S_PER_MPARAM["other"]
    return 1.0 + rate * params / 1e6


@dataclass
class Leader:
    name: str
    decode: float  # measured tok/s


@dataclass
class Race:
    weights: Weights
    params: int
    clock: Clock
    target: str
    max_kld: float
    progress: Callable[[str], None]
    probe: Probe | None = None
    leader: Leader | None = None
    measure_s: float | None = None  # one file's measurement, once a probe has timed it
    device: str | None = None  # the device's fingerprint (efficiency.device_key), once probed
    threads: int | None = None  # the threads the probe measured at: the history's figures at the same
    probed: list[str] = field(default_factory=list)
    # rows the user named (--lm-variants): built whatever the prediction says (the time budget still holds)
    named: frozenset[str] = frozenset()

    def history(self) -> dict[str, tuple[float, float]]:
        return efficiency.history(self.device, self.threads)

    def predict(self, name: str) -> Prediction:
        lead = (self.leader.name, self.leader.decode) if self.leader else None
        return predict(self.weights, name, history=self.history(), leader=lead)

    def order(self, chosen: list[LMCandidate]) -> list[LMCandidate]:
        """The baseline, then the cheap rows, then the slow ones; each group fastest predicted first."""
        rate = {c.name: self.predict(c.name).tokens_per_s for c in chosen}
        return sorted(chosen, key=lambda c: (c.name != BASELINE, c.slow, -rate[c.name]))

    def one_measure_s(self) -> float:
        return self.measure_s if self.measure_s is not None else MEASURE_S[0] + MEASURE_S[1] * self.params / 1e6

    def left_for(self, n_files: int) -> float:
        """Seconds of the budget left for building once ``n_files`` files are measured (inf: no budget)."""
        return self.clock.remaining() - TUNING * n_files * self.one_measure_s()

    def describe_budget(self) -> str:
        if self.clock.budget_s is None:
            return f"{self.clock.now():.0f} s spent, no time budget"
        return f"{max(0.0, self.clock.remaining()):.0f} s of the {self.clock.budget_s:g} s budget left"

    def against_leader(self, p: Prediction) -> str:
        if self.leader is None:
            return ""
        side = "below" if p.optimistic < self.leader.decode else "above"
        return f", {side} the leader {self.leader.name}'s measured {self.leader.decode:.1f} tok/s"

    def why_not(self, c: LMCandidate, built: dict[str, Artifact]) -> str | None:
        """Why row ``c`` is not started (None: build it); a slow row first has the leader measured."""
        if c.slow and c.name not in self.named and self.leader is None:
            self._find_leader(built)
        p = self.predict(c.name)
        est = build_seconds(c, self.params)
        left = self.left_for(len(built) + 1)
        if est > left:
            return (
                f"not built: out of time budget ({self.describe_budget()}, {max(0.0, left):.0f} s of it for "
                f"building after the measurements; its build predicted {est:.0f} s), predicted decode "
                f"{p.tokens_per_s:.1f} tok/s" + self.against_leader(p)
            )
        if c.slow and c.name not in self.named and self.leader is not None and p.optimistic < self.leader.decode:
            return (
                f"not built: predicted decode {p.tokens_per_s:.1f} tok/s (at most {p.optimistic:.1f} with its "
                f"uncertainty) cannot beat the leader {self.leader.name}'s measured {self.leader.decode:.1f} tok/s; "
                f"its build predicted {est:.0f} s ({p.basis})"
            )
        return None

    def _find_leader(self, built: dict[str, Artifact]) -> None:
        """Measure the best built files by prediction (at most ``MAX_PROBES``) until one is inside the KLD
        tolerance: the leader."""
        if self.probe is None:
            return
        ranked = sorted((n for n in built if n not in self.probed), key=lambda n: -self.predict(n).tokens_per_s)[
            : MAX_PROBES - len(self.probed)
        ]
        for name in ranked:
            self.probed.append(name)
            self.progress(
                f"measuring {name} now, the likeliest leader, before any slow build ({self.describe_budget()})"
            )
            t = time.perf_counter()
            got = self.probe(name, built[name])
            self.measure_s = time.perf_counter() - t
            if got is None:
                continue
            v, doc = got
            decode = v.generation.decode_tokens_per_s if v.generation else None
            if not decode:
                continue
            self.device, self.threads = efficiency.device_key(self.target, doc), v.runtime.threads
            gbps = decode * bytes_per_token(self.weights, name) / 1e9
            efficiency.record(self.device, name, v.runtime.version, gbps, v.device_state, v.runtime.threads)
            kld = v.quality.kld_mean if v.quality is not None else None
            if kld is None or kld <= self.max_kld:
                self.leader = Leader(name, float(decode))
                self.progress(f"the leader: {name} at {decode:.1f} tok/s measured")
                return

    def predicted(self, name: str) -> dict[str, Any]:
        """The prediction a built file's lineage carries (made before its measurement)."""
        return self.predict(name).to_dict()


def record_measured(results: list[VariantResult], doc: dict[str, Any], target: str, weights: Weights) -> int:
    """Keep each measured file's effective bandwidth for the device (``efficiency.py``; quiet runs only): what
    makes the next run's predictions this device's own. Thread-setting rows (``FILE@tN``) and files of rows
    edgekit does not build (a release's) are left out. Returns how many were kept."""
    key = efficiency.device_key(target, doc)
    kept = 0
    for v in results:
        decode = v.generation.decode_tokens_per_s if v.generation is not None else None
        if "@" in v.name or v.name not in ENCODINGS or not decode:
            continue
        gbps = decode * bytes_per_token(weights, v.name) / 1e9
        kept += efficiency.record(key, v.name, v.runtime.version, gbps, v.device_state, v.runtime.threads)
    return kept


__all__ = ["DEFAULT_BUDGET_S", "SEARCH_BUDGET_S", "Race", "build_seconds", "record_measured"]
