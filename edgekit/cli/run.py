"""`edgekit run`: feed a shipped model (``out/ship/``) from its ship contract alone."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import PANEL_DATA, PANEL_MEASURE, PANEL_OUTPUT, out_console

HELP = """Run the shipped model in a ship/ folder on this host, exactly as the device ran it.

Reads ship.json (the file's inputs and outputs: names, shapes, layouts, transposes) and runtime.json
(runtime, threads, options), feeds the inputs by the source model's names and layout, and writes the
outputs by the source model's output names and layout: the same arrays the report's metric scored.

Examples:

  edgekit run out/ship --input x.npz --out y.npz

  # a shipped language model: greedy generation, or the eval text
  # re-scored (the report's perplexity)
  edgekit run out/ship --prompt "The licence permits" --max-new-tokens 32
  edgekit run out/ship --eval-text eval.txt --json

  # Python: from edgekit.orchestration.run_shipped import run_shipped
  #         outputs = run_shipped("out/ship", {"x": x})
"""


def run_cmd(
    ship_dir: Path = typer.Argument(..., help="The ship/ folder a deploy wrote (out/ship)."),
    inputs: Optional[Path] = typer.Option(None, "--input", rich_help_panel=PANEL_DATA,
                                          help="An .npz of the inputs, named as the source model's inputs, batch first."),
    out: Optional[Path] = typer.Option(None, "--out", rich_help_panel=PANEL_OUTPUT,
                                       help="The .npz to write the outputs to (by the source model's output names)."),
    prompt: Optional[str] = typer.Option(None, "--prompt", rich_help_panel=PANEL_DATA,
                                         help="A shipped language model: generate greedily from this prompt."),
    chat: bool = typer.Option(False, "--chat", rich_help_panel=PANEL_DATA,
                              help="With --prompt: put it in the model's chat template (rendered sandboxed)."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", min=1, rich_help_panel=PANEL_DATA,
                                       help="With --prompt: at most this many tokens (stops at end-of-text)."),
    eval_text: Optional[Path] = typer.Option(None, "--eval-text", rich_help_panel=PANEL_DATA,
                                             help="A shipped language model: its perplexity on this text, windowed as "
                                             "the deploy windowed it."),
    as_json: bool = typer.Option(False, "--json", rich_help_panel=PANEL_OUTPUT, help="Print the answer as JSON."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, rich_help_panel=PANEL_MEASURE,
                                          help="Runtime threads (default: runtime.json's, as measured)."),
):
    import numpy as np

    from ..errors import BadInputError, OutputError
    from ..fsutil import atomic_path
    from ..llm.run import is_lm_ship
    from ..orchestration.run_shipped import run_shipped
    from ..orchestration.ship import nothing_shipped

    why = nothing_shipped(ship_dir)
    if why is not None:
        raise BadInputError(f"{ship_dir}: nothing shipped: the deploy that wrote it shipped no file ({why})",
                            hint="read its report.json's decision and gate; a deploy that ships a file writes it here")
    if is_lm_ship(ship_dir):
        _run_lm(ship_dir, prompt, chat, max_new_tokens, eval_text, threads, as_json)
        return
    if prompt is not None or eval_text is not None:
        raise BadInputError(f"{ship_dir} holds a fixed-graph model: --prompt and --eval-text are for a shipped "
                            "language model", hint="run it with --input X.npz --out Y.npz")
    if inputs is None or out is None:
        raise BadInputError("edgekit run needs --input X.npz and --out Y.npz for a fixed-graph model")
    if out.suffix != ".npz":
        raise OutputError(f"--out {out} must end in .npz", hint=f"e.g. --out {out.with_suffix('.npz')}")
    ys = run_shipped(ship_dir, inputs, threads=threads)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **ys)
    for name, y in ys.items():
        out_console.print(f"{name}: {y.dtype} {list(y.shape)}", highlight=False)
    out_console.print(f"outputs: {out}", highlight=False)


def _run_lm(ship_dir: Path, prompt, chat: bool, max_new_tokens: int, eval_text, threads, as_json: bool) -> None:
    import json

    from ..errors import BadInputError
    from ..llm.run import generate, open_shipped, rescore

    if (prompt is None) == (eval_text is None):
        raise BadInputError(f"{ship_dir} holds a language model: give --prompt TEXT or --eval-text FILE (one of them)")
    lm = open_shipped(ship_dir, threads)
    if prompt is not None:
        ans = generate(lm, prompt, max_new_tokens, chat=chat)
        if as_json:
            print(json.dumps(ans))
        else:
            out_console.print(ans["text"], highlight=False, markup=False)
        return
    ans = rescore(lm, eval_text)
    if as_json:
        print(json.dumps(ans))
    else:
        out_console.print(f"perplexity {ans['perplexity']:.6g} on {ans['positions']} positions ({ans['windows']} "
                          f"windows); the deploy measured {ans['measured_perplexity']}", highlight=False)
