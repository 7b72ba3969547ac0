"""The generation request a language-model variant is measured with, and its answer as the report's figures.

Defaults (``GenerateSettings``), and why: prefill at three prompt lengths (about 1/16, 1/4 and 1/2 of the
context) shows how time to first token grows with the prompt; decode is timed token by token from an empty
cache through the target's own warm-up and run counts (``measure.warmup`` / ``measure.runs`` tokens, at least
``min_seconds``), and again for ``decode_tokens`` steps after a prompt that fills the cache to near the
context, where attention over the cache costs most."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..agent.protocol import (
    AgentRequest,
    EnergyRequest,
    GenerateRequest,
    GreedyRequest,
    ScoreRequest,
    SustainedRequest,
)
from ..artifact import Artifact
from ..formats import format_spec
from ..inputs.targets import MeasureDefaults
from ..measure.stats import latency_stats


@dataclass(frozen=True)
class GenerateSettings:
    context: int
    decode_tokens: int = 32  # the decode from a filled cache
    prefill_repeats: int = 5
    greedy_tokens: int = 32

    def prompt_lengths(self) -> list[int]:
        c = self.context
        return sorted({max(2, c // 16), max(2, c // 4), max(2, c // 2)})

    @property
    def filled_at(self) -> int:
        return max(1, self.context - self.decode_tokens - 1)


def prompt_ids(windows: np.ndarray, n: int) -> list[int]:
    """``n`` tokens of the eval text (cycled when it holds fewer): prompts are its first tokens."""
    flat = [int(v) for v in windows.ravel()]
    return (flat * math.ceil(n / len(flat)))[:n]


def generate_request(
    *,
    variant: str,
    art: Artifact,
    model_remote: str,
    measure: MeasureDefaults,
    settings: GenerateSettings,
    windows: np.ndarray,
    scoring: tuple[str, str | None, str | None] | None,
    greedy: list[list[int]] | None,
    outputs_remote: str | None,
    energy_sources: tuple[str, ...] = (),
    sustained_seconds: float | None = None,
    runtime_options: dict[str, Any] | None = None,
) -> AgentRequest:
    """``sustained_seconds``: decode for that long (the timing loop's sustained mode, one token a step) to see
    tokens/s under heat and clocks over time. ``runtime_options`` add to (and override) the file's own."""
    need = max(max(settings.prompt_lengths()), settings.filled_at)
    gen = GenerateRequest(
        context=settings.context,
        prompt_ids=prompt_ids(windows, need),
        prompt_lengths=settings.prompt_lengths(),
        prefill_repeats=settings.prefill_repeats,
        filled_at=settings.filled_at,
        decode_tokens=settings.decode_tokens,
        score=ScoreRequest(windows=scoring[0], ids=scoring[1], offsets=scoring[2]) if scoring else None,
        greedy=GreedyRequest(prompts=greedy, new_tokens=settings.greedy_tokens) if greedy else None,
    )
    return AgentRequest(
        variant=variant,
        model=model_remote,
        model_sha256=art.sha256,
        format=art.format.value,
        runtime=str(format_spec(art.format).runtime),
        threads=measure.threads,
        warmup=measure.warmup,
        runs=measure.runs,
        min_seconds=measure.min_seconds,
        max_runs=measure.max_runs,
        inputs=[],
        outputs=[],
        outputs_path=outputs_remote,
        generate=gen,
        energy=EnergyRequest(sources=list(energy_sources)),
        max_seconds=max(120.0, sustained_seconds or 0.0),
        sustained=SustainedRequest.for_seconds(sustained_seconds) if sustained_seconds else None,
        runtime_options={**art.runtime_options, **(runtime_options or {})} or None,
    )


def _median(xs: list[float]) -> float:
    return float(np.median(xs))


def tokens_per_s_ci(raw_ms: list[float], seed: int = 0, resamples: int = 1000) -> tuple[float, float]:
    """95% CI of decode tokens/s (1000 / mean ms a token) by bootstrap over the timed tokens."""
    x = np.asarray(raw_ms, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)
    lo, hi = np.percentile(1000.0 / means, [2.5, 97.5])
    return float(lo), float(hi)


def generation_figures(doc: dict[str, Any], kv_bytes_per_token: int) -> dict[str, Any]:
    """The agent's raw generation timings as the report's figures (every statistic computed here)."""
    gen = doc["generation"]
    raw = list(doc["latency_ms"]["raw"])
    st = latency_stats(raw)
    filled = gen["decode_filled"]["ms"]
    prefill = [
        {
            "tokens": p["tokens"],
            "ttft_ms": _median(p["ms"]),
            "ms": p["ms"],
            "tokens_per_s": p["tokens"] / _median(p["ms"]) * 1000.0,
        }
        for p in gen["prefill"]
    ]
    mem = doc.get("memory") or {}
    kv_runtime = mem.get("kv_cache_mb")
    tokens = mem.get("kv_cache_tokens")
    return {
        "context": gen["context"],
        "ttft_cold_ms": gen["ttft_cold_ms"],  # the first prefill right after loading, at the shortest prompt
        "ttft_ms": prefill[0]["ttft_ms"],  # warm, at the shortest prompt
        "prefill": prefill,
        "decode_tokens_per_s": 1000.0 / float(np.mean(raw)),
        "decode_tokens_per_s_ci95": list(tokens_per_s_ci(raw)),
        "inter_token_ms": {"p50": st.p50, "p95": float(np.percentile(raw, 95)), "mean": st.mean, "n": len(raw)},
        "decode_filled": {
            "start": gen["decode_filled"]["start"],
            "tokens": len(filled),
            "tokens_per_s": 1000.0 / float(np.mean(filled)) if filled else None,
            "inter_token_p50_ms": float(np.median(filled)) if filled else None,
        },
        "peak_rss_mb": mem.get("peak_rss_mb"),
        "kv_cache_mb": kv_runtime
        if kv_runtime is not None
        else (kv_bytes_per_token * tokens / 2**20 if tokens else None),
        "kv_cache_source": "runtime" if kv_runtime is not None else f"config ({mem.get('kv_cache_source')})",
        "kv_cache_tokens": tokens,
        "energy_mj_per_token": (doc.get("energy") or {}).get("energy_mj_per_inference"),
    }
