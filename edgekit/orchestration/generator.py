"""A language model through :func:`edgekit.deploy`: the same entry, target and options as a fixed graph.

``deploy(model, eval_text=...)`` with a transformers folder or a ``.gguf`` comes here. The options that mean the
same for both kinds of model (the measurement, the device lock, the memory budget, the last release's report)
are read from deploy's own keyword overrides; what only a language model takes (context, the KLD and
perplexity limits, its variants, its time budget...) is ``lm_options`` (:class:`edgekit.LMOptions`); what only a
fixed graph takes (eval data, calibration data, a recipe, an architecture, the metric...) is refused by name,
before any work, as the CLI refuses it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from ..errors import BadInputError
from ..inputs.targets import TargetSpec
from ..report.model import Report
from ..transport.base import Transport
from .options import RunOptions

# deploy's overrides that a language model takes: DeployOptions field -> LMOptions field (every RunOptions field,
# which both extend, and the last release's report, which LMOptions calls ``baseline``)
SHARED = {**{f.name: f.name for f in dataclasses.fields(RunOptions)}, "baseline_report": "baseline"}


def lm_options(given: Any, overrides: dict[str, Any], fixed_only: dict[str, Any]) -> Any:
    """The language model's options: ``given`` (an LMOptions or None) with deploy's shared overrides applied;
    a fixed-graph-only argument or override is exit 2, named."""
    from ..llm.deploy import LMOptions

    refused = [k for k, v in fixed_only.items() if v is not None and v is not False]
    refused += [k for k, v in overrides.items() if k not in SHARED and k != "memory_budget_mb" and v is not None]
    if refused:
        raise BadInputError(
            f"a language model does not take {', '.join(sorted(refused))}",
            hint="a language model takes eval_text, deploy's measure and device options (warmup, runs, "
            "min_seconds, threads, remeasure, lock_wait, lock_timeout, sustained_seconds, memory_budget_mb, "
            "baseline_report) and lm_options=edgekit.LMOptions(...) for the rest",
        )
    if given is not None and not isinstance(given, LMOptions):
        raise BadInputError(f"lm_options is a {type(given).__name__}: pass an edgekit.LMOptions")
    o = dataclasses.replace(given) if given is not None else LMOptions()
    upd = {SHARED[k]: v for k, v in overrides.items() if k in SHARED and v is not None}
    if overrides.get("memory_budget_mb") is not None:
        upd["gate"] = dataclasses.replace(o.gate, max_memory_mb=overrides["memory_budget_mb"])
    return dataclasses.replace(o, **upd)


def deploy_generator(
    model: str | Path,
    *,
    eval_text: str | Path | None,
    target: TargetSpec,
    device: str | None,
    out: str | Path,
    options: Any,
    overrides: dict[str, Any],
    fixed: dict[str, Any],
    search: bool | None,
    transport: Transport | None,
    progress: Callable[[str], None],
) -> Report:
    """A language model's run (``llm/deploy.py``'s race over its runtimes and precisions) from deploy's entry:
    ``options`` an LMOptions or None, ``overrides`` deploy's keyword overrides, ``fixed`` deploy's fixed-graph-only
    arguments (each refused when given)."""
    from ..llm.deploy import deploy_lm

    options = lm_options(options, overrides, fixed)
    if eval_text is None:
        raise BadInputError(
            f"{model} is a language model: it needs eval_text (a text or .jsonl file)",
            hint="e.g. edgekit.deploy(model, eval_text='eval.txt'): a few thousand tokens like what the app sees",
        )
    if search is not None:
        options = dataclasses.replace(options, search=bool(search))
    return deploy_lm(
        model, eval_text=eval_text, target=target, device=device, out=out, options=options, transport=transport,
        progress=progress,
    )
