"""``edgekit run ship/ --prompt "..."`` and ``--eval-text FILE`` for a shipped language model: the shipped file
on its shipped runtime through the agent's own decoder (the code the device ran), the tokenizer from the
folder; nothing else is read. Greedy decoding, as measured."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..agent.inprocess import load_agent
from ..errors import BadInputError
from .source import render_chat
from .text import load_eval_text


@dataclass
class ShippedLM:
    folder: Path
    meta: dict[str, Any]
    tokenizer: Any
    decoder: Any


def is_lm_ship(ship_dir: str | Path) -> bool:
    try:
        doc = json.loads((Path(ship_dir) / "ship.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("task") == "text-generation"


def open_shipped(ship_dir: str | Path, threads: int | None = None) -> ShippedLM:
    from transformers import AutoTokenizer  # heavy: transformers

    folder = Path(ship_dir)
    meta = json.loads((folder / "ship.json").read_text(encoding="utf-8"))
    rt = json.loads((folder / "runtime.json").read_text(encoding="utf-8"))
    model = folder / Path(meta["file"]).name
    if not model.is_file():
        raise BadInputError(f"{folder} has no {model.name} (ship.json names it)", hint="copy the whole ship/ folder")
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    cls = load_agent().runners.decoder_for(meta["runtime"])
    dec = cls.open(
        str(model),
        {
            "threads": threads or rt.get("threads") or 1,
            "runtime_options": rt.get("options") or None,
            "generate": {"context": meta["generator"]["context"]},
        },
    )
    return ShippedLM(folder=folder, meta=meta, tokenizer=tok, decoder=dec)


def generate(lm: ShippedLM, prompt: str, max_new_tokens: int = 64, chat: bool = False) -> dict[str, Any]:
    """Greedy continuation of ``prompt`` (in the chat template with ``chat``), stopping at end-of-text."""
    text = render_chat(lm.tokenizer, prompt) if chat else prompt
    if text is None:
        raise BadInputError("--chat: the shipped tokenizer has no chat template")
    ids = list(lm.tokenizer(text, add_special_tokens=not chat)["input_ids"]) or [
        int(lm.meta["generator"].get("bos_token_id") or 0)
    ]
    context = int(lm.meta["generator"]["context"])
    max_new = max(0, min(max_new_tokens, context - len(ids)))
    eos = lm.meta["generator"].get("eos_token_id")
    argmax = np.argmax
    tok = int(argmax(lm.decoder.forward(ids, 0)[-1]))
    out: list[int] = []
    for j in range(max_new):
        out.append(tok)
        if eos is not None and tok == eos:
            break
        if j + 1 < max_new:
            tok = int(argmax(lm.decoder.forward([tok], len(ids) + j)[-1]))
    return {
        "prompt_tokens": len(ids),
        "new_tokens": len(out),
        "tokens": out,
        "text": lm.tokenizer.decode(out, skip_special_tokens=True),
    }


def rescore(lm: ShippedLM, eval_text: str | Path) -> dict[str, Any]:
    """Perplexity of the shipped file on ``eval_text``, windowed as the deploy windowed it (ship.json's eval)."""
    ev = lm.meta.get("eval") or {}
    text = load_eval_text(
        eval_text, lm.tokenizer, window=int(ev.get("window") or 128), max_windows=int(ev.get("windows") or 32)
    )
    scored = load_agent().generation.score_windows(lm.decoder, text.windows, None)
    nll = -np.asarray(scored["target_logprob"], dtype=np.float64)
    return {
        "perplexity": float(np.exp(nll.mean())),
        "positions": int(nll.size),
        "windows": int(nll.shape[0]),
        "measured_perplexity": (lm.meta.get("measured") or {}).get("perplexity"),
    }
