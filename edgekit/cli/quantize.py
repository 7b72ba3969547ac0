"""`edgekit quantize`: INT8 with onnxruntime (default) or Intel Neural Compressor; accuracy-aware
whenever eval data is given."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import (
    CONST_HELP,
    HOST_THREADS_HELP,
    PANEL_COMPRESSION,
    PANEL_DATA,
    PANEL_GATE,
    PANEL_HOST,
    PANEL_OUTPUT,
    STATE_HELP,
    host_threads_for,
)

HELP = """INT8-quantize a model to an ONNX file.

With --eval-data the result is accuracy-aware: the most sensitive ops stay in float until the
accuracy drop is within --max-accuracy-drop (points, 1 = one percentage point), and the command
fails (exit 2, nothing written) when no configuration meets it.

Examples:

  edgekit quantize examples/digits/artifacts/model.pt2 \\
      --calib-data examples/digits/artifacts/calib.npz --out model-int8.onnx

  edgekit quantize model.pt2 --calib-data calib.npz --eval-data eval.npz \\
      --max-accuracy-drop 0.5 --out model-int8.onnx

  edgekit quantize model.pt2 --calib-data calib.npz --eval-data eval.npz \\
      --train-data train.npz --out model-int8.onnx

  edgekit quantize model.pt2 --calib-data calib.npz --eval-data eval.npz \\
      --backend inc --out model-inc.onnx

--train-data (x and labels y) adds the ladder's quantization-aware fine-tuning rung: when no post-training
configuration meets the tolerance (or mixed precision needs many float ops), the PyTorch model is fine-tuned
under simulated INT8 for a few epochs (--qat-epochs), with the fp32 model as distillation teacher, and
quantized again.

--backend inc takes PyTorch models only (INC's ONNX package needs numpy<2, which conflicts with edgekit's stack).
"""


def quantize_cmd(
    model: Path = typer.Argument(..., help="A .pt2, .onnx, or .pt/.pth state dict with --arch."),
    calib_data: Optional[Path] = typer.Option(None, "--calib-data", rich_help_panel=PANEL_DATA, help=".npz with x for calibration (static INT8)."),
    eval_data: Optional[Path] = typer.Option(None, "--eval-data", rich_help_panel=PANEL_DATA, help=".npz with x and y: makes the result accuracy-aware."),
    train_data: Optional[Path] = typer.Option(None, "--train-data", rich_help_panel=PANEL_DATA, help=".npz with x and y: enables quantization-aware fine-tuning when PTQ misses the tolerance (needs --eval-data and a PyTorch model)."),
    arch: Optional[str] = typer.Option(None, "--arch", rich_help_panel=PANEL_DATA, help="module:Class for a .pt/.pth state dict."),
    x_key: str = typer.Option("x", "--x-key", rich_help_panel=PANEL_DATA, help="Input array name(s), comma-separated in the model's input order."),
    y_key: str = typer.Option("y", "--y-key", rich_help_panel=PANEL_DATA),
    metric: Optional[str] = typer.Option(None, "--metric", "-m", rich_help_panel=PANEL_DATA, help="What the accuracy-aware search scores (default top1; see `edgekit deploy --help`); the tolerance is in its units."),
    output: list[str] = typer.Option([], "--output", rich_help_panel=PANEL_DATA, help="The output(s) the metric reads (names or indices)."),
    const: list[str] = typer.Option([], "--const", rich_help_panel=PANEL_DATA, help=CONST_HELP),
    state: list[str] = typer.Option([], "--state", rich_help_panel=PANEL_DATA, help=STATE_HELP + " An ONNX model."),
    backend: str = typer.Option("ort", "--backend", rich_help_panel=PANEL_COMPRESSION, help="ort (onnxruntime) or inc (Intel Neural Compressor, PyTorch models)."),
    per_channel: Optional[bool] = typer.Option(None, "--per-channel/--per-tensor", rich_help_panel=PANEL_COMPRESSION, help="Weight quantization granularity (default: per-channel; with --eval-data, the device's fastest encoding)."),
    fmt: Optional[str] = typer.Option(None, "--format", rich_help_panel=PANEL_COMPRESSION, help="qdq or qoperator (onnxruntime backend; default qdq)."),
    qat_epochs: Optional[int] = typer.Option(None, "--qat-epochs", rich_help_panel=PANEL_COMPRESSION, help="Epochs of quantization-aware fine-tuning (default 10; the best is kept)."),
    max_accuracy_drop: float = typer.Option(1.0, "--max-accuracy-drop", rich_help_panel=PANEL_GATE, help="Allowed drop in accuracy points vs fp32 (0-100)."),
    relative: bool = typer.Option(False, "--relative-drop", rich_help_panel=PANEL_GATE, help="Read --max-accuracy-drop as percent of the fp32 accuracy."),
    host_threads: Optional[int] = typer.Option(None, "--host-threads", rich_help_panel=PANEL_HOST, help=HOST_THREADS_HELP),
    out: Path = typer.Option(..., "--out", "-o", rich_help_panel=PANEL_OUTPUT, help="Output .onnx file (written atomically)."),
    as_json: bool = typer.Option(False, "--json", rich_help_panel=PANEL_OUTPUT, help="Print what was done as JSON."),
):
    from ..errors import BadInputError, DataError
    from ..formats import Format
    from ..passes.base import PassContext
    from . import _compress as C

    C.check_range(max_accuracy_drop, 0, 100, "--max-accuracy-drop", "accuracy points, 1 = one percentage point")
    if backend not in ("ort", "inc"):
        raise BadInputError(f"--backend must be ort or inc, got {backend!r}")
    if fmt is not None and fmt not in ("qdq", "qoperator"):
        raise BadInputError(f"--format must be qdq or qoperator, got {fmt!r}")
    C.check_out(out, (".onnx",))
    if train_data is not None and eval_data is None:
        raise BadInputError("--train-data enables the accuracy-aware search's quantization-aware fine-tuning, which "
                            "scores every result on the eval set", hint="give --eval-data EVAL.npz (x and y) too")
    if train_data is not None and backend != "ort":
        raise BadInputError("--train-data (quantization-aware fine-tuning) is a rung of the onnxruntime ladder",
                            hint="drop --backend inc, or drop --train-data")
    if qat_epochs is not None and (train_data is None or qat_epochs < 1):
        raise BadInputError("--qat-epochs needs --train-data and a positive number", hint="e.g. --train-data train.npz --qat-epochs 5")
    if backend == "inc" and model.suffix.lower() == ".onnx":
        from ..passes.quantize_inc import ONNX_UNSUPPORTED

        raise BadInputError(ONNX_UNSUPPORTED, hint="use --backend ort for ONNX models, or give the .pt2")
    if backend == "inc" and (calib_data is None or eval_data is None):
        raise DataError("--backend inc tunes against accuracy: it needs --calib-data and --eval-data (with labels)")
    from ..inputs.stateful import parse_constants, parse_state

    constants, links = parse_constants(const) or None, parse_state(state) or None
    calib = C.load_data(calib_data, "calib", labels=False, x_key=x_key)
    ev = C.load_data(eval_data, "eval", labels=metric is None, x_key=x_key, y_key=y_key)
    train = C.load_data(train_data, "train", labels=False, x_key=x_key, y_key=y_key)
    with C.Workdir() as wd, host_threads_for(host_threads):
        data = [calib, ev, train]
        source = C.load_model(model, arch, data, wd, constants, links)
        calib, ev, train = data
        ctx = PassContext(workdir=wd, calib=calib, eval=ev, train=train)
        if train is not None:
            _check_train(train, source, calib, model)
            ctx.source = source  # the QAT rung fine-tunes the PyTorch program
        if ev is not None and (metric is not None or output):
            from ..metrics import MetricSpec
            from ..metrics.evaluate import eval_plan

            outs = [o.strip() for v in output for o in v.split(",") if o.strip()] or None
            ctx.metric_plan = eval_plan(MetricSpec(name=metric or "top1", outputs=outs), source, ev)
        parity_xs = list((ev or calib).xs) if (ev or calib) else None
        art = source.artifact
        if backend == "inc":
            if art.format != Format.TORCH:
                raise BadInputError(f"--backend inc takes PyTorch models, got {art.format.value}")
            cfg = {"max_accuracy_drop": max_accuracy_drop, "relative": relative}
            art = C.run_one("quantize_inc", art, cfg, ctx, "quantized")
        else:
            if art.format == Format.TORCH:
                from ..convert.torch_to_onnx import export_onnx

                if parity_xs is None:
                    raise DataError("exporting a PyTorch model needs example inputs",
                                    hint="pass --calib-data or --eval-data")
                art = export_onnx(source, wd / "fp32.onnx", parity_xs)
            # only what the user set: the accuracy-aware pass starts from the device's fastest encoding otherwise
            base = {"mode": "static" if calib is not None else "dynamic",
                    **({"format": fmt} if fmt is not None else {}),
                    **({"per_channel": per_channel} if per_channel is not None else {})}
            if ev is not None:
                aa = {**base, "max_accuracy_drop": max_accuracy_drop, "relative": relative,
                      **({"qat": {"epochs": qat_epochs}} if qat_epochs is not None else {})}
                art = C.run_one("quantize_accuracy_aware", art, aa, ctx, "quantized")
            else:
                art = C.run_one("quantize", art, base, ctx, "quantized")
        art = C.write_out(art, out, parity_xs)
        m = art.lineage[-1].metrics
        lines = []
        if "fp32_accuracy" in m:
            lines.append(f"{m.get('metric', 'top1')} {m['accuracy']:.4g} vs fp32 {m['fp32_accuracy']:.4g} (worse by "
                         f"{m['accuracy_drop']:.4g}, tolerance {m['tolerance_points']:.4g})")
        if m.get("full_int8"):
            lines.append(f"full INT8 would drop {m['full_int8']['drop']:.2f} points")
        q = m.get("qat") or {}
        if q.get("ran"):
            rungs = ", ".join(f"{r['rung']} {r['seconds']:.1f} s" for r in m.get("rungs", []))
            lines.append(f"ladder rung: {m['rung']} ({rungs})")
            ft = q.get("finetune", {})
            lines.append(f"quantization-aware fine-tuning: {ft.get('epochs_run')} epochs in {q.get('finetune_seconds', 0):.1f} s "
                         f"(epoch {ft.get('chosen_epoch')} kept); {'won' if q.get('won') else 'did not meet the tolerance'}")
        elif q.get("skipped"):
            lines.append(f"quantization-aware fine-tuning not tried: {q['skipped']}")
        for d in m.get("kept_in_float") or []:
            lines.append(f"kept in float: {d['node']} ({d['op_type']}): {d['reason']}")
        C.report(art, out, as_json, lines)


def _check_train(train, source, calib, model: Path) -> None:
    """Train data the QAT rung cannot use is refused before any export or quantization."""
    from ..errors import BadInputError, DataError
    from ..formats import Format
    from ..passes.quantize_qat import QatSettings, task_of

    if source.artifact.format != Format.TORCH:
        raise BadInputError(f"--train-data: quantization-aware fine-tuning trains the PyTorch model, and {model.name} "
                            f"is {source.artifact.format.value}",
                            hint="give the .pt2 (or a .pt/.pth state dict with --arch), or drop --train-data")
    if calib is None:
        raise DataError("--train-data: quantization-aware fine-tuning simulates static INT8, which is calibrated",
                        hint="give --calib-data CALIB.npz too")
    task_of(train, tuple(source.artifact.io.outputs[0].shape), QatSettings().alpha)
