"""`edgekit convert`: one model to ONNX, TFLite or Core ML, with parity proven at every hop."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from ..formats import all_precisions, convert_targets, format_spec
from .common import (HOST_THREADS_HELP, PANEL_CONVERSION, PANEL_DATA, PANEL_HOST, PANEL_OUTPUT, host_threads_for,
                     out_console, progress_display)

HELP = """Convert a model to ONNX, TFLite or Core ML and check parity at every hop.

Examples:

  edgekit convert model.pt2 --to tflite --precision int8 \\
      --calib-data calib.npz --out model-int8.tflite

  edgekit convert model.pt2 --to coreml --precision fp16 \\
      --out model.mlpackage

  edgekit convert model.onnx --to tflite --input-shape input:1,3,224,224 \\
      --calib-data calib.npz

  # no data: synthetic parity inputs
  edgekit convert model.pt2 --to tflite --out model.tflite

Parity inputs are --eval-data when given, else --calib-data, else (when every input size is known)
seeded synthetic inputs, with a warning: real data is a stronger check. Every output is compared.

Exit codes: 0 converted within tolerance, 2 bad input or no converter route within tolerance
(nothing is written at --out).
"""

# --to and --precision come from the format registry (edgekit/formats.py): a new row is a new --to
To = Enum("To", {t: t for t in convert_targets()}, type=str)
Precision = Enum("Precision", {p: p for p in all_precisions()}, type=str)


def _parse_shapes(values: list[str]) -> dict[str, list[int]]:
    from ..errors import BadInputError

    out: dict[str, list[int]] = {}
    for v in values:
        name, sep, dims = v.rpartition(":")
        try:
            shape = [int(d) for d in dims.split(",")]
        except ValueError:
            shape = []
        if not sep or not name or not shape or any(d <= 0 for d in shape):
            raise BadInputError(f"--input-shape {v!r} is not NAME:D0,D1,...", hint="e.g. --input-shape input:1,3,224,224")
        out[name] = shape
    return out


def convert_cmd(
    model: Path = typer.Argument(..., help="A .pt2 (torch.export), .onnx, or .pt/.pth state dict with --arch."),
    calib_data: Optional[Path] = typer.Option(None, "--calib-data", rich_help_panel=PANEL_DATA, help=".npz with x for INT8 calibration."),
    eval_data: Optional[Path] = typer.Option(None, "--eval-data", rich_help_panel=PANEL_DATA, help=".npz with x: the parity inputs (else calib)."),
    input_shape: list[str] = typer.Option([], "--input-shape", rich_help_panel=PANEL_DATA, help="NAME:1,3,224,224 for a dynamic ONNX input."),
    arch: Optional[str] = typer.Option(None, "--arch", rich_help_panel=PANEL_DATA, help="module:Class for a .pt/.pth state dict."),
    x_key: str = typer.Option("x", "--x-key", rich_help_panel=PANEL_DATA, help="Array name(s) of the inputs in the .npz files, comma-separated in the model's input order (a,b)."),
    to: To = typer.Option(..., "--to", rich_help_panel=PANEL_CONVERSION, help="Target format."),
    precision: Precision = typer.Option(Precision("fp32"), "--precision", "-p",
                                        rich_help_panel=PANEL_CONVERSION, help="fp32 | fp16 | int8 (TFLite: full-integer with --calib-data; "
                                        "Core ML: 8-bit weights)."),
    quantization: str = typer.Option("full", "--quantization", rich_help_panel=PANEL_CONVERSION, help="int8 (TFLite, ExecuTorch): full (calibrated activations) | dynamic (activations quantized at run time; no calibration)."),
    io: str = typer.Option("float", "--io", rich_help_panel=PANEL_CONVERSION, help="TFLite full-integer int8: float | int8 inputs/outputs."),
    route: str = typer.Option("auto", "--route", rich_help_panel=PANEL_CONVERSION, help="TFLite: auto | onnx2tf | litert-torch."),
    host_threads: Optional[int] = typer.Option(None, "--host-threads", rich_help_panel=PANEL_HOST, help=HOST_THREADS_HELP),
    out: Optional[Path] = typer.Option(None, "--out", "-o", rich_help_panel=PANEL_OUTPUT, help="Output file (default: MODEL-PRECISION.EXT here)."),
    as_json: bool = typer.Option(False, "--json", rich_help_panel=PANEL_OUTPUT, help="Print the artifact (io spec + lineage) as JSON."),
):
    from ..convert.api import convert

    shapes = _parse_shapes(input_shape)
    target = out or Path(f"{model.stem}-{precision.value}{format_spec(to.value).suffix}")
    with progress_display(not as_json) as progress, host_threads_for(host_threads):
        art = convert(model, to=to.value, precision=precision.value, out=target, calib_data=calib_data,
                      eval_data=eval_data, io=io, quantization=quantization, route=route, input_shapes=shapes or None,
                      arch=arch, x_key=x_key, progress=progress)
    warnings = list(dict.fromkeys(w for st in art.lineage if st.kind == "convert"
                                  for w in [st.metrics.get("parity_warning")] if w))
    for w in warnings:
        typer.echo(f"warning: {w}", err=True)
    if as_json:
        print(json.dumps(art.model_dump(mode="json")))
        return
    out_console.print(f"wrote {art.path} ({art.format.value}, {art.precision}, {art.size_bytes / 1e3:.1f} KB)")
    for step in art.lineage:
        if step.kind != "convert":
            continue
        m = step.metrics
        par = m.get("parity")
        route_ = m.get("route") or step.config.get("converter", "")
        if par:
            top1 = f"{par['top1_agreement']:.1%}" if par.get("top1_agreement") is not None else "n/a"
            line = (f"  {step.name:<14} {route_:<28} {step.seconds or 0:6.2f} s  max|err| {par['max_abs_err']:.3g}  "
                    f"cosine {par['cosine']:.6f}  top-1 {top1}")
            viol = m.get("parity_violations")
            line += "  OK" if not viol else "  OUT OF TOLERANCE: " + "; ".join(viol)
        else:
            line = f"  {step.name:<14} {route_:<28} {step.seconds or 0:6.2f} s  parity: {m.get('parity_reason', 'n/a')}"
        out_console.print(line, highlight=False, soft_wrap=True)
        outs = m.get("parity_outputs") or {}
        if len(outs) > 1:
            for name, p in outs.items():
                agree = (f"exact {p['exact_agreement']:.1%}" if p.get("exact_agreement") is not None
                         else f"max|err| {p['max_abs_err']:.3g}  cosine {p['cosine']:.6f}")
                if p.get("top1_agreement") is not None:
                    agree += f"  top-1 {p['top1_agreement']:.1%}" + (
                        "" if p.get("top1_held", True) else " (reported, not held: not a class distribution)")
                out_console.print(f"    output {name}: {agree}", highlight=False, soft_wrap=True)
        for t in m.get("routes_tried") or []:
            out_console.print(f"    (route {t['route']} not kept: {t['error']})", highlight=False, soft_wrap=True)
