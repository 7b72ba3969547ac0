"""The eval text: plain text, or JSONL of prompts (``{"text": ...}`` or ``{"prompt": ...}`` a line), tokenized
with the model's own tokenizer and cut into teacher-forced windows (what the device scores), plus the prompts
its greedy generations start from. Too little text is refused with the number of tokens it holds."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError


@dataclass(frozen=True)
class EvalText:
    path: Path
    kind: str  # text | jsonl
    tokens: int  # tokens the file holds (all of them, before windowing)
    windows: np.ndarray  # int32 [W, T]: teacher-forced windows, each scored from an empty cache
    prompts: list[list[int]]  # greedy-generation prompts (the start of a window each)

    def describe(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "kind": self.kind,
            "tokens": self.tokens,
            "windows": int(self.windows.shape[0]),
            "window_tokens": int(self.windows.shape[1]),
            "scored_positions": int(self.windows.shape[0] * (self.windows.shape[1] - 1)),
            "greedy_prompts": len(self.prompts),
            "windows_sha256": hashlib.sha256(np.ascontiguousarray(self.windows, np.int32).tobytes()).hexdigest(),
        }


def read_documents(path: Path) -> tuple[str, list[str]]:
    """(kind, documents): a .jsonl/.json-lines file gives one document a line (its ``text`` or ``prompt``),
    anything else is one plain-text document."""
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise DataError(f"eval text {path} not found") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(
            f"eval text {path} is not readable UTF-8 text ({exc})",
            hint="--eval-text takes plain UTF-8 text or JSONL with a text/prompt field",
        ) from exc
    if path.suffix.lower() not in (".jsonl", ".ndjson"):
        return "text", [raw]
    docs = []
    for i, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise DataError(f"{path}:{i} is not JSON ({exc})", hint="one JSON object a line") from exc
        text = row.get("text", row.get("prompt")) if isinstance(row, dict) else None
        if not isinstance(text, str):
            raise DataError(f"{path}:{i} has no string field 'text' or 'prompt'")
        docs.append(text)
    return "jsonl", docs


def load_eval_text(
    path: str | Path, tokenizer: Any, *, window: int, max_windows: int = 32, prompt_tokens: int = 16, prompts: int = 4
) -> EvalText:
    """Windows of ``window`` tokens: consecutive, non-overlapping cuts of the plain text (or of each JSONL
    document, which may be shorter: then each document is one window, padded documents are never mixed), at
    most ``max_windows`` spread evenly over the text."""
    p = Path(path)
    kind, docs = read_documents(p)
    encoded = [list(tokenizer(d, add_special_tokens=False)["input_ids"]) for d in docs]
    total = sum(len(e) for e in encoded)
    if kind == "text":
        ids = encoded[0]
        n = len(ids) // window
        if n < 1:
            raise DataError(
                f"eval text {p} holds {len(ids)} tokens, fewer than one window of {window}",
                hint=f"give at least {window} tokens of text (about {window * 4} characters)",
            )
        cuts = [ids[i * window : (i + 1) * window] for i in range(n)]
    else:
        cuts = [e[:window] for e in encoded if len(e) >= 2]
        if not cuts:
            raise DataError(f"eval text {p} holds {total} tokens in {len(docs)} lines: no line has two tokens")
        shortest = min(len(c) for c in cuts)
        cuts = [c[:shortest] for c in cuts]  # one window length: the device scores [W, T]
    if len(cuts) > max_windows:  # evenly spread, deterministic
        cuts = [cuts[int(i * len(cuts) / max_windows)] for i in range(max_windows)]
    windows = np.asarray(cuts, dtype=np.int32)
    k = max(1, min(prompt_tokens, windows.shape[1] - 1))
    chosen = [cuts[int(i * len(cuts) / min(prompts, len(cuts)))][:k] for i in range(min(prompts, len(cuts)))]
    return EvalText(path=p, kind=kind, tokens=total, windows=windows, prompts=chosen)
