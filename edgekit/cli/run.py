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

  # Python: from edgekit.run_shipped import run_shipped
  #         outputs = run_shipped("out/ship", {"x": x})
"""


def run_cmd(
    ship_dir: Path = typer.Argument(..., help="The ship/ folder a deploy wrote (out/ship)."),
    inputs: Path = typer.Option(..., "--input", rich_help_panel=PANEL_DATA,
                                help="An .npz of the inputs, named as the source model's inputs, batch first."),
    out: Path = typer.Option(..., "--out", rich_help_panel=PANEL_OUTPUT,
                             help="The .npz to write the outputs to (by the source model's output names)."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, rich_help_panel=PANEL_MEASURE,
                                          help="Runtime threads (default: runtime.json's, as measured)."),
):
    import numpy as np

    from ..errors import OutputError
    from ..fsutil import atomic_path
    from ..run_shipped import run_shipped

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
