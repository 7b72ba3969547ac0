"""`edgekit profile`: measure a model as it is on a device (no compression)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from .common import (
    EXIT_GATE_FAILED,
    PANEL_DATA,
    PANEL_GATE,
    PANEL_MEASURE,
    PANEL_OUTPUT,
    PANEL_TARGET,
    out_console,
    progress_display,
)

HELP = """Measure a model as it is on the device: latency, memory, energy, accuracy; no compression.

Examples:

  edgekit profile model.tflite --target rpi4 --device pi \\
      --eval-data eval_nhwc.npz

  edgekit profile out/ship/tflite-int8.tflite --target local \\
      --eval-data eval.npz --latency-budget-ms 2

A .tflite is fed data in its own layout; a .pt2 is exported to ONNX first (with its parity check).

Exit codes: 0 ok, 1 a budget failed, 2 bad input, 3 device or transport failure.
"""


def profile_cmd(
    model: Path = typer.Argument(..., help="A .tflite, .onnx or .pt2 model."),
    eval_data: Path = typer.Option(..., "--eval-data", rich_help_panel=PANEL_DATA, help=".npz with x (inputs as the model takes them) and y."),
    x_key: str = typer.Option("x", "--x-key", rich_help_panel=PANEL_DATA, help="Array name of the inputs."),
    y_key: str = typer.Option("y", "--y-key", rich_help_panel=PANEL_DATA, help="Array name of the labels."),
    target: str = typer.Option("local", "--target", "-t", rich_help_panel=PANEL_TARGET, help="Target class or a target .yaml."),
    device: Optional[str] = typer.Option(None, "--device", "-d", rich_help_panel=PANEL_TARGET, help="Device name from the inventory."),
    latency_budget_ms: Optional[float] = typer.Option(None, "--latency-budget-ms", rich_help_panel=PANEL_GATE, help="p50 latency budget."),
    memory_budget_mb: Optional[float] = typer.Option(None, "--memory-budget-mb", rich_help_panel=PANEL_GATE, help="Peak memory budget."),
    threads: Optional[int] = typer.Option(None, "--threads", rich_help_panel=PANEL_MEASURE, help="Runtime threads (default: the target's)."),
    warmup: Optional[int] = typer.Option(None, "--warmup", rich_help_panel=PANEL_MEASURE, help="Untimed runs (default: the target's)."),
    runs: Optional[int] = typer.Option(None, "--runs", rich_help_panel=PANEL_MEASURE, help="Minimum timed runs (default: the target's)."),
    min_seconds: Optional[float] = typer.Option(None, "--min-seconds", rich_help_panel=PANEL_MEASURE, help="Minimum timed seconds."),
    out: Path = typer.Option(Path("edgekit-profile"), "--out", "-o", rich_help_panel=PANEL_OUTPUT, help="Folder for the report files."),
    as_json: bool = typer.Option(False, "--json", rich_help_panel=PANEL_OUTPUT, help="Print the report JSON instead of the summary."),
):
    from ..pipeline.deploy import DeployOptions, profile
    from .report import print_summary

    opts = DeployOptions(latency_budget_ms=latency_budget_ms, memory_budget_mb=memory_budget_mb, warmup=warmup,
                         runs=runs, min_seconds=min_seconds, threads=threads)
    with progress_display(not as_json) as progress:
        report = profile(model, eval_data=eval_data, target=target, device=device, out=out, x_key=x_key, y_key=y_key,
                         options=opts, progress=progress)
    if as_json:
        print(json.dumps(report.model_dump(mode="json")))
    else:
        print_summary(report)
        out_console.print(f"report: {Path(out) / 'report.json'}")
    if not report.gate.passed:
        raise typer.Exit(EXIT_GATE_FAILED)
