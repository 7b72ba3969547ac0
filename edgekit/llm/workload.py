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

import numpy as np

from ..agent.protocol import AgentRequest, AgentResult
from ..artifact import Artifact
from ..devices.session import DeviceSession, RunSettings
from ..measure.stats import latency_stats
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
