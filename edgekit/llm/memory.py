"""What a language model needs in memory: its weights, its KV cache (bytes per token from the config), and
what the runtime adds; which context fits the target's memory. A context that cannot fit is refused before
any build (exit 2, named)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import BadInputError
from .source import LMSource

CACHE_BYTES = 4  # fp32 key/value cache (every export here keeps the cache in float32)
RUNTIME_OVERHEAD_MB = 150.0  # Python, numpy and a runtime's own arenas, measured as the load delta of a tiny model
HEADROOM = 0.8  # of the target's memory: the OS and the application need the rest


@dataclass(frozen=True)
class MemoryPlan:
    kv_bytes_per_token: int
    weights_mb: float  # float32 weights (an int8 file: about a quarter of the linear layers)
    context: int
    kv_cache_mb: float  # at the full context
    need_mb: float  # weights + cache + runtime overhead
    target_mb: float
    fits_context: int  # the longest context that fits beside the weights and the runtime

    def describe(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def kv_bytes_per_token(src: LMSource) -> int:
    """Keys and values of every layer for one position: 2 x layers x kv heads x head size x bytes."""
    return 2 * src.layers * src.kv_heads * src.head_dim * CACHE_BYTES


def memory_plan(src: LMSource, context: int, target_memory_mb: float) -> MemoryPlan:
    per_tok = kv_bytes_per_token(src)
    weights_mb = src.parameters * 4 / 2**20
    budget = target_memory_mb * HEADROOM
    fits = int(max(0.0, budget - weights_mb - RUNTIME_OVERHEAD_MB) * 2**20 // per_tok)
    kv_mb = per_tok * context / 2**20
    return MemoryPlan(
        kv_bytes_per_token=per_tok,
        weights_mb=weights_mb,
        context=context,
        kv_cache_mb=kv_mb,
        need_mb=weights_mb + kv_mb + RUNTIME_OVERHEAD_MB,
        target_mb=float(target_memory_mb),
        fits_context=min(fits, src.context),
    )


def check_fits(plan: MemoryPlan, target_name: str) -> None:
    """Refuse a context whose cache, beside the weights and the runtime, exceeds the target's memory."""
    if plan.context > plan.fits_context:
        raise BadInputError(
            f"a context of {plan.context} tokens does not fit target {target_name}: weights {plan.weights_mb:.0f} MB + "
            f"KV cache {plan.kv_cache_mb:.0f} MB ({plan.kv_bytes_per_token} bytes/token) + runtime "
            f"~{RUNTIME_OVERHEAD_MB:.0f} MB = {plan.need_mb:.0f} MB, "
            f"over {HEADROOM:.0%} of its {plan.target_mb:.0f} MB",
            hint=(
                f"use --context {plan.fits_context} or less (the longest that fits), or a target with more memory"
                if plan.fits_context >= 16
                else "the weights and the runtime alone leave no room for a cache on "
                "this target: use a smaller model, a quantized source, or a target with more memory"
            ),
        )
