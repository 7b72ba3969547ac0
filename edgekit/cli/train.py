"""`edgekit train`: a teacher trained with DDP through torchrun."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from .common import PANEL_DATA, PANEL_DISTRIBUTED, PANEL_OUTPUT, PANEL_TRAINING, err_console, out_console

HELP = """Train a teacher (module:factory) on DATA with torch DDP launched by torchrun; write a .pt2.

The same command runs one process, several processes on this machine, or several nodes.
Run `edgekit plan` first: distributing a job that fits one process only adds overhead
(this command warns when it judges so; --force silences the warning).

Examples:

  edgekit train examples/digits/model.py:DigitsCNN --data train.npz \\
      --epochs 5 --out teacher.pt2

  edgekit train examples/digits/model.py:DigitsCNN --data train.npz \\
      --epochs 5 --out teacher.pt2 --nproc-per-node 2 --force

  # node 0 of 2 (node 1 runs the same with --node-rank 1):
  edgekit train mypkg.models:teacher --data /shared/shards --epochs 10 \\
      --out /shared/teacher.pt2 --nnodes 2 --node-rank 0 \\
      --rdzv-endpoint 10.0.0.1:29400

  # continue a killed run from its last checkpoint
  edgekit train ... --resume

Data: .npz (x, y), a folder of x_*.npy + y_*.npy shards (memory-mapped), or Parquet (a file or a
folder; a list column x or numeric feature columns, label column y).

Exit codes: 0 ok, 2 bad input, 3 a process or the rendezvous failed.
"""


def _shape(text: Optional[str]) -> Optional[tuple[int, ...]]:
    if not text:
        return None
    try:
        shape = tuple(int(v) for v in text.replace("x", ",").split(",") if v.strip())
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a shape like 1,8,8") from None
    if not shape or any(d <= 0 for d in shape):
        raise typer.BadParameter(f"{text!r} is not a shape like 1,8,8")
    return shape


def train_cmd(
    factory: str = typer.Argument(..., help="module:factory or path/to/file.py:factory returning an nn.Module."),
    data: Path = typer.Option(..., "--data", rich_help_panel=PANEL_DATA, help=".npz, folder of .npy shards, or Parquet file/folder."),
    eval_data: Optional[Path] = typer.Option(None, "--eval-data", rich_help_panel=PANEL_DATA, help="Held-out data (same format) for a final accuracy."),
    x_key: str = typer.Option("x", "--x-key", rich_help_panel=PANEL_DATA, help="Array/column name of the inputs."),
    y_key: str = typer.Option("y", "--y-key", rich_help_panel=PANEL_DATA, help="Array/column name of the labels."),
    input_shape: Optional[str] = typer.Option(None, "--input-shape", rich_help_panel=PANEL_DATA, help="Per-sample shape for flat features, e.g. 1,8,8."),
    epochs: int = typer.Option(1, "--epochs", min=1, rich_help_panel=PANEL_TRAINING, help="Epochs to train (total, also when resuming)."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, rich_help_panel=PANEL_TRAINING, help="GLOBAL batch, split over all processes."),
    lr: float = typer.Option(1e-3, "--lr", rich_help_panel=PANEL_TRAINING, help="Learning rate."),
    optimizer: str = typer.Option("adam", "--optimizer", rich_help_panel=PANEL_TRAINING, help="adam or sgd (momentum 0.9)."),
    seed: int = typer.Option(0, "--seed", rich_help_panel=PANEL_TRAINING, help="Seed of the initial weights and the data order."),
    precision: str = typer.Option("auto", "--precision", rich_help_panel=PANEL_TRAINING, help="auto (bf16/fp16 autocast on GPU, fp32 on CPU), fp32, bf16, fp16."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, rich_help_panel=PANEL_TRAINING, help="Torch threads per process (default cores/nproc)."),
    checkpoint_dir: Optional[Path] = typer.Option(None, "--checkpoint-dir", rich_help_panel=PANEL_TRAINING, help="Default: OUT with suffix .ckpt."),
    checkpoint_every: int = typer.Option(0, "--checkpoint-every", min=0, rich_help_panel=PANEL_TRAINING, help="Steps between checkpoints (0: each epoch)."),
    resume: bool = typer.Option(False, "--resume", rich_help_panel=PANEL_TRAINING, help="Continue from the last checkpoint."),
    nproc_per_node: int = typer.Option(1, "--nproc-per-node", min=1, rich_help_panel=PANEL_DISTRIBUTED, help="Processes on this node (torchrun)."),
    nnodes: int = typer.Option(1, "--nnodes", min=1, rich_help_panel=PANEL_DISTRIBUTED, help="Number of nodes (torchrun)."),
    node_rank: int = typer.Option(0, "--node-rank", min=0, rich_help_panel=PANEL_DISTRIBUTED, help="This node's rank; node 0 hosts the rendezvous."),
    rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint", rich_help_panel=PANEL_DISTRIBUTED, help="HOST:PORT of node 0's c10d rendezvous."),
    rdzv_id: Optional[str] = typer.Option(None, "--rdzv-id", rich_help_panel=PANEL_DISTRIBUTED, help="Job id shared by all nodes (default: from the command)."),
    rdzv_timeout: int = typer.Option(300, "--rdzv-timeout", min=1, rich_help_panel=PANEL_DISTRIBUTED, help="Seconds to reach node 0 / wait for all nodes."),
    max_restarts: int = typer.Option(0, "--max-restarts", min=0, rich_help_panel=PANEL_DISTRIBUTED, help="torchrun restarts of the worker group on a failure."),
    force: bool = typer.Option(False, "--force", rich_help_panel=PANEL_DISTRIBUTED, help="Distribute even when the advisor says one process is enough."),
    out: Path = typer.Option(..., "--out", "-o", rich_help_panel=PANEL_OUTPUT, help="The teacher, a torch.export program (.pt2)."),
    as_json: bool = typer.Option(False, "--json", rich_help_panel=PANEL_OUTPUT, help="Print the result (paths and metrics) as JSON."),
):
    from ..train import train

    def progress(msg: str) -> None:
        if not as_json:
            err_console.print(msg, highlight=False, markup=False)

    res = train(factory, data, out, epochs=epochs, force=force, progress=progress, batch_size=batch_size, lr=lr,
                optimizer=optimizer, seed=seed, precision=precision, eval_data=eval_data, x_key=x_key, y_key=y_key,
                input_shape=_shape(input_shape), checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                resume=resume, nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=node_rank,
                rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id, rdzv_timeout=rdzv_timeout, max_restarts=max_restarts,
                threads=threads)
    doc = {"out": str(res.out) if res.out else None,
           "lineage": str(res.lineage_path) if res.lineage_path else None,
           "metrics": res.metrics, "warnings": res.warnings, "log": str(res.log) if res.log else None}
    if as_json:
        print(json.dumps(doc))
        return
    if res.out is None:
        out_console.print(f"this node's processes finished; global rank 0 ran on another node and wrote {out} there")
        return
    m = res.metrics
    acc = f", eval accuracy {m['eval_accuracy']:.2f}%" if m.get("eval_accuracy") is not None else ""
    out_console.print(f"teacher: {res.out} ({m['epochs']} epochs, {m['world_size']} process(es), {m['backend']}, "
                      f"{m['precision']}; final loss {m['final_loss']:.4f}{acc})\nmetrics: {res.lineage_path}",
                      highlight=False)
