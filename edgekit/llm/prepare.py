"""A language model's run, before any build: every bad input is exit 2 here (the source, the eval text, a
context that cannot fit the target's memory), and the float model scores the eval text's windows on the host
(``quality.reference``: what the device's outputs are compared with)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import BadInputError
from ..fsutil import ensure_writable_dir
from ..inputs.targets import TargetSpec
from .judge import OBJECTIVES
from .layer_plan import HEADS
from .memory import check_fits, memory_plan
from .options import DEFAULT_CONTEXT, DEFAULT_WINDOW, LMOptions
from .quality import COVERAGE, Reference, greedy_reference, reference
from .request import GenerateSettings
from .source import LMSource, load_lm
from .text import EvalText, load_eval_text

Progress = Callable[[str], None]


@dataclass
class Prepared:
    src: LMSource
    text: EvalText
    spec: TargetSpec
    settings: GenerateSettings
    out_dir: Path
    plan: Any
    ref: Reference


def prepare(
    model: str | Path, eval_text: str | Path, spec: TargetSpec, out: str | Path, o: LMOptions, progress: Progress
) -> Prepared:
    if o.top_k is not None and o.top_k < 1:
        raise BadInputError(f"--top-k {o.top_k}: at least 1 (the float model's tokens a position the device scores)")
    if o.head not in HEADS:
        raise BadInputError(f"--output-layer {o.head!r}: the output layer of an int4 file is one of {', '.join(HEADS)}")
    if o.objective not in OBJECTIVES:
        raise BadInputError(f"--objective {o.objective!r} for a language model: one of {', '.join(OBJECTIVES)}")
    out_dir = ensure_writable_dir(out)
    progress(f"reading {model}")
    src = load_lm(model)
    context = o.context or min(src.context, DEFAULT_CONTEXT)
    if context > src.context:
        raise BadInputError(
            f"--context {context} is beyond the model's {src.context} positions (max_position_embeddings)",
            hint=f"use --context {src.context} or less",
        )
    if context < 16:
        raise BadInputError(f"--context {context}: at least 16 positions")
    plan = memory_plan(src, context, spec.memory_mb)
    check_fits(plan, spec.name)
    window = min(o.window or DEFAULT_WINDOW, context - 1)  # a static-cache file takes at most context-1 at once
    text = load_eval_text(eval_text, src.tokenizer, window=window, max_windows=o.max_windows)
    if int(text.windows.max()) >= src.vocab_size:
        raise BadInputError(
            f"the tokenizer gives token id {int(text.windows.max())} on {eval_text}, past the "
            f"model's vocabulary of {src.vocab_size}"
        )
    progress(f"scoring {text.windows.shape[0]} windows of {text.windows.shape[1]} tokens with the float model")
    ref = reference(src.model, text.windows, o.top_k)
    cover = ref.describe()
    progress(
        f"the KLD scores {cover['scored_ids']} token log-probs ({cover['scoring_bytes'] / 1e6:.1f} MB to move a "
        f"variant): "
        + (
            f"top-{o.top_k} a position"
            if o.top_k is not None
            else f"{cover['top_k_mean']:.0f} a position on average to hold {COVERAGE:.1%} of the float mass"
            + (f", the flattest cut to {ref.capped_at}" if ref.capped_at else "")
        )
    )
    settings = GenerateSettings(context=context)
    ref = Reference(**{**ref.__dict__, "greedy": greedy_reference(src.model, text.prompts, settings.greedy_tokens)})
    return Prepared(src=src, text=text, spec=spec, settings=settings, out_dir=out_dir, plan=plan, ref=ref)
