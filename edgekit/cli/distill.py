"""`edgekit distill`: train a student on a teacher's soft targets (temperature, alpha)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import HOST_THREADS_HELP, PANEL_COMPRESSION, PANEL_DATA, PANEL_HOST, PANEL_OUTPUT, host_threads_for

HELP = """Distill a teacher into a student trained on the teacher's soft targets.

The student is a model file (e.g. the output of `edgekit prune`) or a fresh architecture
(--student module:factory). It must predict the same classes as the teacher (same output shape),
else exit 2.

Examples:

  edgekit distill pruned.pt2 --teacher examples/digits/artifacts/model.pt2 \\
      --train-data examples/digits/artifacts/train.npz \\
      --eval-data examples/digits/artifacts/eval.npz --out distilled.pt2

  edgekit distill --student mymodels.py:tiny_cnn --teacher model.pt2 \\
      --train-data train.npz --temperature 4 --alpha 0.7 --epochs 20 \\
      --out student.onnx
"""


def distill_cmd(
    student_model: Optional[Path] = typer.Argument(None, help="Student .pt2 (e.g. a pruned model); or use --student."),
    teacher: Path = typer.Option(..., "--teacher", rich_help_panel=PANEL_DATA, help="Teacher .pt2."),
    student: Optional[str] = typer.Option(None, "--student", rich_help_panel=PANEL_DATA, help="module:factory building a fresh student."),
    train_data: Path = typer.Option(..., "--train-data", rich_help_panel=PANEL_DATA, help=".npz with x and y."),
    eval_data: Optional[Path] = typer.Option(None, "--eval-data", rich_help_panel=PANEL_DATA, help=".npz with x and y: accuracy before/after."),
    x_key: str = typer.Option("x", "--x-key", rich_help_panel=PANEL_DATA),
    y_key: str = typer.Option("y", "--y-key", rich_help_panel=PANEL_DATA),
    temperature: float = typer.Option(4.0, "--temperature", rich_help_panel=PANEL_COMPRESSION, help="Softmax temperature of the soft targets (> 0)."),
    alpha: float = typer.Option(0.7, "--alpha", rich_help_panel=PANEL_COMPRESSION, help="Weight of the soft-target loss, 0-1 (1 - alpha: labels)."),
    epochs: int = typer.Option(10, "--epochs", rich_help_panel=PANEL_COMPRESSION),
    lr: float = typer.Option(1e-3, "--lr", rich_help_panel=PANEL_COMPRESSION),
    host_threads: Optional[int] = typer.Option(None, "--host-threads", rich_help_panel=PANEL_HOST, help=HOST_THREADS_HELP),
    out: Path = typer.Option(..., "--out", "-o", rich_help_panel=PANEL_OUTPUT, help="Output .pt2 or .onnx (written atomically)."),
    as_json: bool = typer.Option(False, "--json", rich_help_panel=PANEL_OUTPUT, help="Print what was done as JSON."),
):
    from ..errors import BadInputError
    from ..formats import Format
    from ..passes.base import PassContext
    from . import _compress as C

    if (student_model is None) == (student is None):
        raise BadInputError("give the student either as a model file (positional) or as --student module:factory",
                            hint="e.g. edgekit distill pruned.pt2 --teacher model.pt2 --train-data train.npz --out d.pt2")
    C.check_range(alpha, 0, 1, "--alpha", "weight of the soft-target loss")
    if temperature <= 0:
        raise BadInputError(f"--temperature must be > 0, got {temperature:g}", hint="typical values: 2 to 8")
    if epochs < 1:
        raise BadInputError(f"--epochs must be >= 1, got {epochs}")
    C.check_out(out, (".pt2", ".onnx"))
    train = C.load_data(train_data, "train", labels=True, x_key=x_key, y_key=y_key)
    ev = C.load_data(eval_data, "eval", labels=True, x_key=x_key, y_key=y_key)
    with C.Workdir() as wd, host_threads_for(host_threads):
        t_src = C.load_model(teacher, None, [None, ev, train], wd / "teacher")
        s_art = C.load_model(student_model, None, [None, ev, train], wd / "student").artifact if student_model else t_src.artifact
        for a, what in ((t_src.artifact, "teacher"), (s_art, "student")):
            if a.format != Format.TORCH:
                raise BadInputError(f"the {what} must be a PyTorch program (.pt2), got {a.format.value}")
        ctx = PassContext(workdir=wd, eval=ev, train=train, teacher=t_src.artifact)
        cfg = {"teacher": str(teacher), "student": student, "temperature": temperature, "alpha": alpha,
               "epochs": epochs, "lr": lr}
        art = C.run_one("distill", s_art, cfg, ctx, "distilled")
        art = C.write_out(art, out, list((ev or train).xs))
        m = next(s for s in reversed(art.lineage) if s.kind == "pass").metrics
        sa = m["student_accuracy"]
        lines = [f"teacher accuracy {m['teacher_accuracy']}; student {sa['before']} -> {sa['after']}"
                 if sa.get("after") is not None else "accuracy: give --eval-data to see it",
                 f"params: student {m['params']['student']}, teacher {m['params']['teacher']}"]
        C.report(art, out, as_json, lines)
