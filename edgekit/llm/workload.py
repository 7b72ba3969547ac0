"""The generation workload: what the device runs for a language model's file, and how its answer becomes the
report's row. It is the language model's side of the one device stage (``devices/session.py``'s
:class:`~edgekit.devices.session.Workload`): the session delivers, caches, locks and runs the same way for a
fixed graph and a generator; only the request and the reading of its answer differ.

The request (``request.generate_request``): prefill at the settings' prompt lengths, decode token by token from an
empty cache and from a filled one, the eval text's windows scored teacher-forced at the float model's tokens
(``quality.reference``), and greedy continuations of the prompts. The answer: the generation figures and the
quality against the float model, every statistic computed here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..agent.protocol import AgentRequest, AgentResult
from ..artifact import Artifact
from ..devices.session import DeviceSession, MeasureFailure, RunSettings
from ..measure.stats import ABBlocks, latency_stats
from ..measure.sustained import analyze
from ..report.model import Accuracy, Generation, LMQuality, RuntimeInfo, VariantResult
from .quality import Reference, quality
from .request import GenerateSettings, generate_request, generation_figures

# scoring every window and the greedy generations come after the timed decode, which the request's own limit covers
SCORING_TIMEOUT_MARGIN_S = 600.0


@dataclass
class GenerationWorkload:
    """A language model's files measured on one eval text: ``scoring`` and ``greedy`` are what the device scores
    besides the timings (None: timings only, as the release gate's A/B turns run)."""

    settings: GenerateSettings
    windows: np.ndarray  # the eval text's token windows [W, T]
    ref: Reference  # the float model's figures on those windows
    kv_bytes_per_token: int
    scoring: tuple[str, str | None, str | None] | None = None  # remote windows, ids and offsets
    greedy: list[list[int]] | None = None
    energy_sources: tuple[str, ...] = ()
    sustained_seconds: float | None = None
    # the positions of a file measured beside this run's that was built at another context (an ExecuTorch file's
    # static cache): the last release's in the release gate's A/B, by sha256
    contexts: dict[str, int] = field(default_factory=dict)
    kind: str = field(default="generation", init=False)

    def request(self, session: DeviceSession, name: str, art: Artifact, settings: RunSettings) -> AgentRequest:
        return generate_request(
            variant=name,
            art=art,
            model_remote=session.remote(art.path),
            measure=settings.measure,
            settings=self.settings,
            windows=self.windows,
            scoring=self.scoring,
            greedy=self.greedy,
            outputs_remote=session.results_path(name, art),
            energy_sources=settings.energy_sources or self.energy_sources,
            sustained_seconds=self.sustained_seconds,
            runtime_options=settings.runtime_options,
        )

    def timeout_s(self, req: AgentRequest) -> float | None:
        return req.timeout_s + SCORING_TIMEOUT_MARGIN_S

    def measure_ab(
        self,
        session: DeviceSession,
        a: Artifact,
        b: Artifact,
        settings: RunSettings,
        settings_b: RunSettings,
        blocks: int,
        progress: Callable[[str], None] | None,
    ) -> ABBlocks:
        """A generator's A/B: ``blocks`` pairs of turns (A B, B A, A B ...), each turn a short decode-only agent run
        (no scoring, the quickest prefill), so slow drift hits both sides alike (on this project's 2-core host a
        busy neighbour moved decode tokens/s by 15% within a minute). Each turn's figures are its per-token times;
        each side runs with its own settings (threads, runtime options)."""
        out = ABBlocks()
        for i in range(blocks):
            if progress:
                progress(f"A/B: round {i + 1} of {blocks} (decode only)")
            order = ("a", "b") if i % 2 == 0 else ("b", "a")
            times: dict[str, list[float]] = {}
            for key in order:
                art, st = (a, settings) if key == "a" else (b, settings_b)
                times[key] = self._decode_turn(session, art, st, f"ab{i}-{key}")
            out.a.append(times["a"])
            out.b.append(times["b"])
            out.order.extend(order)
        return out

    def _decode_turn(self, session: DeviceSession, art: Artifact, st: RunSettings, label: str) -> list[float]:
        """One decode-only agent run of ``art``: its per-token times (ms); a failure raises with the agent's words."""
        m = st.measure.model_copy(update={"min_seconds": max(0.1, st.measure.min_seconds / 4)})
        req = generate_request(
            variant=label,
            art=art,
            model_remote=session.remote(art.path),
            measure=m,
            settings=GenerateSettings(
                context=self.contexts.get(art.sha256, self.settings.context), decode_tokens=1, prefill_repeats=1
            ),
            windows=self.windows,
            scoring=None,
            greedy=None,
            outputs_remote=None,
            runtime_options=st.runtime_options,
        )
        res = session.run(req, RunSettings(measure=m, cached=False, timeout_s=req.timeout_s + SCORING_TIMEOUT_MARGIN_S))
        if isinstance(res, MeasureFailure):
            raise res.error()
        return [float(x) for x in res.doc["latency_ms"]["raw"]]

    def result(self, session: DeviceSession, name: str, art: Artifact, res: AgentResult) -> VariantResult:
        doc, outputs = res.doc, res.outputs
        named = dict(zip(doc.get("outputs") or [], outputs or []))
        q = quality(self.ref, named)
        gen = generation_figures(doc, self.kv_bytes_per_token)
        lat = doc["latency_ms"]
        return VariantResult(
            name=name,
            format=art.format.value,
            precision=art.precision,
            runtime=RuntimeInfo(**doc["runtime"]),
            size_bytes=art.size_bytes,
            sha256=art.sha256,
            artifact_path=str(art.path),
            lineage=art.lineage_dicts(),
            load_ms=doc.get("load_ms"),
            latency_ms={
                "warmup": lat["warmup"],
                "runs": lat["runs"],
                "raw": lat["raw"],
                **latency_stats(lat["raw"]).to_dict(),
            },
            peak_memory_mb=(doc.get("memory") or {}).get("peak_rss_mb"),
            memory=doc.get("memory") or {},
            energy_mj_per_inference=(doc.get("energy") or {}).get("energy_mj_per_inference"),
            energy_source=(doc.get("energy") or {}).get("source"),
            energy_reason=(doc.get("energy") or {}).get("reason"),
            energy=doc.get("energy") or {},
            sustained=analyze(doc.get("sustained")),
            accuracy=Accuracy(
                metric="perplexity",
                value=q["perplexity"],
                n=q["positions"],
                direction="lower",
                units="",
                against="labels",
            ),
            generation=Generation(**gen),
            quality=LMQuality(**q),
            device_state=doc.get("device_state") or {},
        )
