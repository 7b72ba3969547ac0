"""`edgekit plan`: the scale advisor (one process or DDP, and which preprocessing engine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from .common import PANEL_DATA, PANEL_HARDWARE, PANEL_OUTPUT, PANEL_TRAINING, out_console
from .train import _shape

HELP = """Say whether a training job needs distributing, and which preprocessing engine suits its data.

Estimate memory per device and time per epoch from the data set's size, the model's parameter
count and a few training steps measured here, then recommend one process or DDP (processes,
nodes), and Polars/DuckDB or a cluster engine.

Examples:

  edgekit plan examples/digits/model.py:DigitsCNN --data train.npz

  # a large set described, not present: the model is still measured here
  # on random inputs
  edgekit plan examples/digits/model.py:DigitsCNN --rows 500000000 \\
      --sample-shape 1,8,8

  # nothing measured: everything described
  edgekit plan --rows 1300000000 --sample-shape 3,224,224 \\
      --params 25600000 --step-ms-per-sample 2 --device gpu \\
      --device-memory-gb 80 --devices-per-node 8
"""


def plan_cmd(
    factory: Optional[str] = typer.Argument(None, help="module:factory of the model (measured here)."),
    data: Optional[Path] = typer.Option(None, "--data", rich_help_panel=PANEL_DATA, help="The training data (as for `edgekit train`)."),
    rows: Optional[int] = typer.Option(None, "--rows", min=1, rich_help_panel=PANEL_DATA, help="Rows (samples) of a described data set."),
    sample_shape: Optional[str] = typer.Option(None, "--sample-shape", rich_help_panel=PANEL_DATA, help="Per-sample input shape, e.g. 3,224,224."),
    classes: Optional[int] = typer.Option(None, "--classes", min=1, rich_help_panel=PANEL_DATA, help="Classes for random labels (described data)."),
    params: Optional[int] = typer.Option(None, "--params", min=1, rich_help_panel=PANEL_DATA, help="Parameter count (instead of a factory)."),
    x_key: str = typer.Option("x", "--x-key", rich_help_panel=PANEL_DATA),
    y_key: str = typer.Option("y", "--y-key", rich_help_panel=PANEL_DATA),
    input_shape: Optional[str] = typer.Option(None, "--input-shape", rich_help_panel=PANEL_DATA, help="Per-sample shape for flat features."),
    step_ms_per_sample: Optional[float] = typer.Option(None, "--step-ms-per-sample", min=0.0,
                                                       rich_help_panel=PANEL_TRAINING, help="Training step time per sample, ms (instead of measuring)."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, rich_help_panel=PANEL_TRAINING, help="Global batch size."),
    optimizer: str = typer.Option("adam", "--optimizer", rich_help_panel=PANEL_TRAINING, help="adam or sgd (sets optimizer-state memory)."),
    target_epoch_minutes: float = typer.Option(30.0, "--target-epoch-minutes", rich_help_panel=PANEL_TRAINING, help="Longest acceptable epoch."),
    device: Optional[str] = typer.Option(None, "--device", rich_help_panel=PANEL_HARDWARE, help="cpu or gpu (default: this machine)."),
    device_memory_gb: Optional[float] = typer.Option(None, "--device-memory-gb", rich_help_panel=PANEL_HARDWARE, help="Memory of one device."),
    devices_per_node: Optional[int] = typer.Option(None, "--devices-per-node", min=1, rich_help_panel=PANEL_HARDWARE, help="GPUs per node."),
    as_json: bool = typer.Option(False, "--json", rich_help_panel=PANEL_OUTPUT, help="Print the plan as JSON."),
):
    from ..errors import BadInputError
    from ..train.plan import human_bytes, human_s, plan_for

    if step_ms_per_sample is not None and step_ms_per_sample <= 0:
        raise BadInputError("--step-ms-per-sample must be positive")
    if device not in (None, "cpu", "gpu"):
        raise BadInputError(f"--device {device!r} is not one of cpu, gpu")
    model = ds = None
    if factory:
        from ..train.model import build_model

        model = build_model(factory)
    if data is not None:
        from ..train.data import load_train_data

        ds = load_train_data(data, x_key=x_key, y_key=y_key, input_shape=_shape(input_shape))
    plan = plan_for(model, ds, rows=rows, sample_shape=_shape(sample_shape), params=params,
                    seconds_per_sample=step_ms_per_sample / 1000 if step_ms_per_sample else None,
                    batch_size=batch_size, optimizer=optimizer, classes=classes, device=device,
                    device_memory_bytes=int(device_memory_gb * 2**30) if device_memory_gb else None,
                    devices_per_node=devices_per_node, target_epoch_s=target_epoch_minutes * 60)
    if as_json:
        print(json.dumps(plan.model_dump(mode="json")))
        return
    i, r, m = plan.inputs, plan.recommend, plan.recommend.memory_per_device
    src = "measured here" if i.step_measured else "as given"
    act = human_bytes(m.activations) if m.activations is not None else "not measured"
    out_console.print(
        f"data: {i.rows:,} rows of {i.sample_shape}; model: {i.params:,} parameters; "
        f"step: {i.seconds_per_sample * 1e3:.4f} ms/sample ({src}, {i.device}"
        + (f", {i.threads} threads" if i.device == "cpu" else "") + ")\n"
        f"one process: ~{human_s(plan.epoch_s_single)} per epoch, ~{human_bytes(plan.single.total)} "
        f"of {human_bytes(i.device_memory_bytes)}\n"
        f"recommend: {r.mode}"
        + (f" ({r.nnodes} node(s) x {r.nproc_per_node} process(es))" if r.mode == "ddp" else "")
        + f" - {r.why}\n"
        f"memory per device: weights {human_bytes(m.weights)}, gradients {human_bytes(m.gradients)}, "
        f"optimizer {human_bytes(m.optimizer)}, DDP buckets {human_bytes(m.ddp_buckets)}, activations {act}, "
        f"data {human_bytes(m.data)}\n"
        f"preprocessing: {plan.preprocessing.engine} - {plan.preprocessing.why}", highlight=False)
