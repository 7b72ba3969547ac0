"""`edgekit prune`: structured channel pruning (really removes channels, then fine-tunes) or
unstructured magnitude pruning (zeros; smaller compressed size, not faster)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import HOST_THREADS_HELP, PANEL_COMPRESSION, PANEL_DATA, PANEL_HOST, PANEL_OUTPUT, host_threads_for

HELP = """Prune a PyTorch model: remove whole channels (structured) or zero the smallest weights (unstructured).

Structured (default) removes whole channels with dependency tracking (Torch-Pruning) and fine-tunes
on --train-data; unstructured zeroes the smallest weights, which shrinks the compressed size but not
dense latency. Measure the result with `edgekit deploy`: the latency measured on the device decides
whether pruning paid off.

Examples:

  edgekit prune examples/digits/artifacts/model.pt2 \\
      --arch examples/digits/model.py:DigitsCNN --sparsity 0.5 \\
      --train-data examples/digits/artifacts/train.npz --out pruned.pt2

  edgekit prune model.pt2 --unstructured --sparsity 0.8 --out sparse.pt2

Write .pt2 to keep compressing (e.g. `edgekit distill`), or .onnx to deploy.
"""


def prune_cmd(
    model: Path = typer.Argument(..., help="A .pt2 (or .pt/.pth with --arch)."),
    arch: Optional[str] = typer.Option(None, "--arch", rich_help_panel=PANEL_DATA, help="module:Class the model was exported from (structured)."),
    train_data: Optional[Path] = typer.Option(None, "--train-data", rich_help_panel=PANEL_DATA, help=".npz with x and y for the fine-tune."),
    eval_data: Optional[Path] = typer.Option(None, "--eval-data", rich_help_panel=PANEL_DATA, help=".npz with x and y: accuracy before/after."),
    x_key: str = typer.Option("x", "--x-key", rich_help_panel=PANEL_DATA),
    y_key: str = typer.Option("y", "--y-key", rich_help_panel=PANEL_DATA),
    sparsity: float = typer.Option(0.5, "--sparsity", rich_help_panel=PANEL_COMPRESSION, help="Fraction removed, strictly between 0 and 1."),
    unstructured: bool = typer.Option(False, "--unstructured", rich_help_panel=PANEL_COMPRESSION, help="Magnitude pruning (zeros) instead of channels."),
    epochs: int = typer.Option(5, "--epochs", rich_help_panel=PANEL_COMPRESSION, help="Fine-tune epochs after structured pruning (0 = none)."),
    host_threads: Optional[int] = typer.Option(None, "--host-threads", rich_help_panel=PANEL_HOST, help=HOST_THREADS_HELP),
    out: Path = typer.Option(..., "--out", "-o", rich_help_panel=PANEL_OUTPUT, help="Output .pt2 or .onnx (written atomically)."),
    as_json: bool = typer.Option(False, "--json", rich_help_panel=PANEL_OUTPUT, help="Print what was done as JSON."),
):
    from ..errors import BadInputError
    from ..formats import Format
    from ..passes.base import PassContext
    from . import _compress as C

    C.check_range(sparsity, 0, 1, "--sparsity", "fraction of channels or weights removed", lo_open=True, hi_open=True)
    if epochs < 0:
        raise BadInputError(f"--epochs must be >= 0, got {epochs}")
    C.check_out(out, (".pt2", ".onnx"))
    train = C.load_data(train_data, "train", labels=True, x_key=x_key, y_key=y_key)
    ev = C.load_data(eval_data, "eval", labels=True, x_key=x_key, y_key=y_key)
    if out.suffix.lower() == ".onnx" and ev is None and train is None:
        raise BadInputError("writing .onnx exports the model and checks parity on real inputs, but no data was given",
                            hint="pass --eval-data (or --train-data), or write a .pt2")
    with C.Workdir() as wd, host_threads_for(host_threads):
        source = C.load_model(model, arch, [None, ev, train], wd)
        if source.artifact.format != Format.TORCH:
            raise BadInputError(f"pruning works on PyTorch models; {model.name} is {source.artifact.format.value}",
                                hint="give the .pt2 (or .pth with --arch)")
        ctx = PassContext(workdir=wd, eval=ev, train=train, arch=arch or None)
        if unstructured:
            art = C.run_one("prune_magnitude", source.artifact, {"sparsity": sparsity}, ctx, "pruned")
        else:
            art = C.run_one("prune_structured", source.artifact, {"sparsity": sparsity, "finetune_epochs": epochs,
                                                                  "arch": arch}, ctx, "pruned")
        data = ev or train
        art = C.write_out(art, out, list(data.xs) if data else None)
        step = next(s for s in reversed(art.lineage) if s.kind == "pass")
        m = step.metrics
        if unstructured:
            lines = [f"sparsity {m['sparsity']:.1%}; file {m['size_bytes']['before']} -> {m['size_bytes']['after']} B, "
                     f"compressed {m['compressed_size_bytes']['before']} -> {m['compressed_size_bytes']['after']} B",
                     f"note: {m['note']}"]
        else:
            b, a = m["before"], m["after"]
            lines = [f"params {b['params']} -> {a['params']} ({m['params_ratio']:.2f}x), MACs {b['macs']} -> {a['macs']} "
                     f"({m['macs_ratio']:.2f}x)",
                     f"accuracy {b['accuracy']} -> {m['after_prune']['accuracy']} (pruned) -> {a['accuracy']} (fine-tuned)"
                     if b.get("accuracy") is not None else "accuracy: give --eval-data to see it",
                     f"note: {m['note']}"]
        C.report(art, out, as_json, lines)
