"""``OUT/ship/`` for a language model: the model file, its tokenizer files, chat template and generation
config (one set, hashed in ship.json), the runtime and the options it was measured with, and how the file is
called (its inputs and outputs, how its KV cache is held). ``edgekit run ship/ --prompt`` and
``--eval-text`` read this folder alone."""

from __future__ import annotations

from typing import Any

from ..artifact import Artifact
from ..report.model import VariantResult
from .export_onnx import io_names
from .request import GenerateSettings
from .source import LMSource

TASK = "text-generation"


def calling(art: Artifact, src: LMSource) -> dict[str, Any]:
    if art.format.value == "onnx":
        ins, outs = io_names(src.layers)
        return {
            "inputs": ins,
            "outputs": outs,
            "cache": "past/present key values: feed each call's present.N.* "
            "back as the next call's past_key_values.N.*, starting from [1, kv_heads, 0, head_dim] zeros",
            "kv_heads": src.kv_heads,
            "head_dim": src.head_dim,
            "layers": src.layers,
        }
    if art.format.value == "gguf":
        return {
            "runtime": "llama.cpp (libllama; llama-cpp-python's low-level API or llama.cpp's own tools)",
            "call": "llama_decode with a batch of (token, position, sequence 0, logits wanted) per token",
            "cache": "inside the llama_context; llama_memory_clear begins a new sequence",
            "tokenizer": "in the GGUF (it tokenizes as the shipped tokenizer.json does)",
        }
    return {
        "inputs": ["input_ids [1, S] int64", "cache_position [S] int64"],
        "outputs": ["logits [1, S, vocab]"],
        "cache": "static, inside the program's mutable buffers; cache_position 0 begins a new sequence",
    }


def lm_contract(v: VariantResult, art: Artifact, src: LMSource, settings: GenerateSettings) -> dict[str, Any]:
    """A language model's part of ship.json (the folder is written by the one ship writer,
    ``orchestration/ship.write_file_set``, with the tokenizer files beside the model): the generator contract
    (context, vocabulary, tokenizer, chat template, how the file is called and its cache held) and the measured
    figures."""
    g, q = v.generation, v.quality
    contract = {
        "task": TASK,
        "generator": {
            "context": settings.context,
            "vocab_size": src.vocab_size,
            "architecture": src.architecture,
            "family": src.family,
            "tokenizer_files": [f.name for f in src.files],
            "chat_template": bool(getattr(src.tokenizer, "chat_template", None)),
            "bos_token_id": getattr(src.tokenizer, "bos_token_id", None),
            "eos_token_id": getattr(src.tokenizer, "eos_token_id", None),
            "calling": calling(art, src),
        },
        "eval": {"window": int(q.positions // q.windows + 1) if q else None, "windows": q.windows if q else None},
        "measured": {
            "decode_tokens_per_s": g.decode_tokens_per_s if g else None,
            "ttft_ms": g.ttft_ms if g else None,
            "perplexity": q.perplexity if q else None,
            "kld_mean": q.kld_mean if q else None,
            "peak_rss_mb": g.peak_rss_mb if g else None,
        },
    }
    return contract
