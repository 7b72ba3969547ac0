"""A file's decode speed predicted before it is built (issue #45 item 2).

A decode step reads every weight of the decoder once (the embedding is a row gather: one row is read, not the
table) and the KV cache up to the current position, so bytes read per token over the device's memory bandwidth
bound the decode rate. Each runtime's kernels reach a share of that bound (its efficiency), which is measured,
not guessed: an *effective bandwidth* per row (measured decode tok/s x the row's bytes per token), from

1. this device's own history (``efficiency.py``: kept per device fingerprint, row and runtime version, quiet
   measurements only), else
2. ``PRIOR_GBPS``: the effective bandwidths of docs/benchmarks/language-models.md's "Every runtime" table
   (Llama 125M, AMD EPYC, one thread, edgekit 698e42d), each row's decode tok/s times its bytes per token
   on that model by ``bytes_per_token`` below.

Once a file is measured on the device, the others are calibrated on it (the ratio of effective bandwidths
carries over between devices better than the absolute figure): ``predicted(c) = measured(leader) *
bytes(leader) / bytes(c) * gbps(c) / gbps(leader)``. A prediction carries its uncertainty as a factor
(``spread``): ``PRIOR_SPREAD`` from the priors (one host's table; the Xeon rows of the same page put
MatMulNBits and q4_k_m level where the EPYC has q4_k_m 1.4x ahead), narrower from this device's history."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .layer_plan import OUTPUT_NAMES, linear_layers


@dataclass(frozen=True)
class Encoding:
    """Bytes read a weight in the decoder's linear layers (``body``), in the output layer (``head``), a row of
    the embedding (``embed``, a weight), and an element of the KV cache (``kv``)."""

    body: float
    head: float
    embed: float
    kv: float


_FP32 = Encoding(4.0, 4.0, 4.0, 4.0)
_INT8 = Encoding(1.0, 1.0, 4.0, 4.0)  # one scale a row or tensor; the embedding stays float
# MatMulNBits: 4 bits and an fp16 scale a block; the head int8 in the same blocks (layer_plan's default head)
_NBITS32 = Encoding(0.5 + 2 / 32, 1.0 + 2 / 32, 4.0, 4.0)
_NBITS128 = Encoding(0.5 + 2 / 128, 1.0 + 2 / 128, 4.0, 4.0)
# GGUF blocks: Q8_0 34 B / 32, Q4_0 18 B / 32, Q6_K 210 B / 256 (llama-quantize's output layer for the 4-bit
# types), Q4_K_M ~4.85 bits (Q4_K with some Q6_K); llama.cpp's KV cache is f16
_Q8_0 = 34 / 32
_Q6_K = 210 / 256
ENCODINGS: dict[str, Encoding] = {
    "ort-fp32": _FP32,
    "et-fp32": _FP32,
    "ort-int8": _INT8,
    "et-8da8w": _INT8,
    "et-int8": _INT8,
    "ort-int4": _NBITS32,
    "ort-int4-b128": _NBITS128,
    "et-8da4w": Encoding(0.5 + 2 / 32, 1.0, 4.0, 4.0),
    "et-8da4w-g64": Encoding(0.5 + 2 / 64, 1.0, 4.0, 4.0),
    "et-8da4w-g128": Encoding(0.5 + 2 / 128, 1.0, 4.0, 4.0),
    "gguf-q8_0": Encoding(_Q8_0, _Q8_0, _Q8_0, 2.0),
    "gguf-q4_0": Encoding(18 / 32, _Q6_K, 18 / 32, 2.0),
    "gguf-q4_k_m": Encoding(4.85 / 8, _Q6_K, 4.5 / 8, 2.0),
}
# GB/s: decode tok/s of the benchmark table x bytes_per_token(its Llama 125M, row, positions=DECODE_POSITIONS)
PRIOR_GBPS: dict[str, float] = {
    "ort-fp32": 18.85,
    "ort-int8": 12.84,
    "ort-int4": 9.65,
    "ort-int4-b128": 8.60,
    "et-fp32": 15.80,
    "et-8da8w": 7.56,
    "et-8da4w": 5.11,
    "et-8da4w-g64": 4.85,
    "et-8da4w-g128": 4.85,  # not measured (dropped at build there): g64's
    "et-int8": 0.31,
    "gguf-q8_0": 19.21,
    "gguf-q4_0": 15.77,
    "gguf-q4_k_m": 12.58,
}
PRIOR_SPREAD = 1.5  # a prior's prediction may be this factor off either way
DECODE_POSITIONS = 32  # the cache's mean fill while the decode rate is timed (from an empty cache)


@dataclass(frozen=True)
class Weights:
    """What a decode step reads, in weights: the decoder's linear layers, the output layer, one embedding
    row, and the KV cache's elements a position."""

    body: int
    head: int
    embed_width: int
    kv_per_position: int

    @classmethod
    def of(cls, src: Any) -> "Weights":
        body = head = 0
        for name, mod in linear_layers(src.model):
            n = int(mod.weight.numel())
            if name.split(".")[-1] in OUTPUT_NAMES:
                head += n
            else:
                body += n
        return cls(body, head, int(src.config.hidden_size), 2 * src.layers * src.kv_heads * src.head_dim)


def bytes_per_token(w: Weights, name: str, positions: int = DECODE_POSITIONS) -> float:
    """Bytes a decode step of row ``name`` reads at ``positions`` in the cache."""
    e = ENCODINGS.get(name, _FP32)
    return w.body * e.body + w.head * e.head + w.embed_width * e.embed + w.kv_per_position * positions * e.kv


@dataclass(frozen=True)
class Prediction:
    tokens_per_s: float
    spread: float  # the figure may be this factor off either way
    basis: str  # how it was made, for the report
    bytes_per_token: float

    @property
    def optimistic(self) -> float:
        return self.tokens_per_s * self.spread

    def to_dict(self) -> dict[str, Any]:
        return {
            "decode_tokens_per_s": round(self.tokens_per_s, 2),
            "range": [round(self.tokens_per_s / self.spread, 2), round(self.optimistic, 2)],
            "bytes_per_token": int(self.bytes_per_token),
            "basis": self.basis,
        }


def gbps(name: str, history: dict[str, tuple[float, float]] | None = None) -> tuple[float, float, str]:
    """(effective GB/s, spread, source) of row ``name``: this device's history, else the prior."""
    if history and name in history:
        value, spread = history[name]
        return value, spread, "this device's history"
    return PRIOR_GBPS.get(name, min(PRIOR_GBPS.values())), PRIOR_SPREAD, "the benchmark prior"


def predict(
    w: Weights,
    name: str,
    *,
    history: dict[str, tuple[float, float]] | None = None,
    leader: tuple[str, float] | None = None,
) -> Prediction:
    """Row ``name``'s decode tok/s: calibrated on ``leader`` (its name, its measured decode tok/s) when one is
    measured, else from the effective bandwidth alone (history or prior)."""
    b = bytes_per_token(w, name)
    g, spread, source = gbps(name, history)
    if leader is None:
        return Prediction(g * 1e9 / b, spread, f"{source}: {g:g} GB/s effective over {b / 1e6:.2f} MB a token", b)
    lname, measured = leader
    if lname == name:
        return Prediction(measured, 1.0, "measured", b)
    # the ratio of efficiencies from one source: both rows' device history, else both priors
    same = history if history and name in history and lname in history else None
    g, spread, source = gbps(name, same)
    gl, lspread, _ = gbps(lname, same)
    rate = measured * bytes_per_token(w, lname) / b * g / gl
    return Prediction(
        rate,
        max(spread, lspread),
        f"calibrated on {lname}'s measured {measured:.1f} tok/s: bytes a token {b / 1e6:.2f} vs "
        f"{bytes_per_token(w, lname) / 1e6:.2f} MB, efficiency {g / gl:.2f}x ({source})",
        b,
    )


__all__ = ["ENCODINGS", "PRIOR_GBPS", "PRIOR_SPREAD", "Encoding", "Prediction", "Weights", "bytes_per_token", "predict"]
