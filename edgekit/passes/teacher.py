"""An explicit teacher for distillation (issue #46): a model trained with ``edgekit train`` (DDP through torchrun),
given as ``--teacher`` instead of the source model.

Accepted: the ``.pt2`` that ``edgekit train --out`` writes (its ``.lineage.json`` sidecar, when present, says how
it was trained), or the run's checkpoint ``last.pt`` (``--checkpoint-dir``), read with
``torch.load(weights_only=True)``: its state dict is loaded into the factory its fingerprint names and exported
to a ``.pt2`` beside the run's artifacts. Before any training, :func:`check_teacher` runs the teacher and the
student on two training samples: a teacher whose outputs do not match the student's (shape, so classes) is a
bad input (exit 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BadInputError
from ..formats import Format
from ..inputs.source import import_object, load_pt2

if TYPE_CHECKING:
    from ..artifact import Artifact
    from ..inputs.data import Dataset

HINT = ("--teacher takes the .pt2 `edgekit train --out` wrote, or its checkpoint (last.pt in --checkpoint-dir), "
        "trained on the same classes as the deployed model")


def load_teacher(path: str | Path, student: Artifact, workdir: Path) -> Artifact:
    """The teacher as a PyTorch-program artifact (a checkpoint is exported to ``workdir`` first)."""
    p = Path(path)
    if p.is_dir() and (p / "last.pt").is_file():
        p = p / "last.pt"
    if not p.is_file():
        raise BadInputError(f"teacher {p} not found", hint=HINT)
    if p.suffix == ".pt2":
        art = load_pt2(p).artifact
        if art.format != Format.TORCH:
            raise BadInputError(f"teacher {p} is not a PyTorch program", hint=HINT)
        return art
    if p.suffix in (".pt", ".pth"):
        return _from_checkpoint(p, student, workdir)
    raise BadInputError(f"teacher {p} is neither a .pt2 nor an `edgekit train` checkpoint (.pt)", hint=HINT)


def _from_checkpoint(p: Path, student: Artifact, workdir: Path) -> Artifact:
    import torch

    from . import _torch as T  # heavy: torch

    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError / RuntimeError: a foreign or damaged file
        raise BadInputError(f"teacher {p} cannot be read with torch.load(weights_only=True): "
                            f"{str(exc).splitlines()[0][:200]}", hint=HINT) from exc
    fp = state.get("fingerprint") if isinstance(state, dict) else None
    factory = fp.get("factory") if isinstance(fp, dict) else None
    if not isinstance(factory, str) or not isinstance(state.get("model"), dict):
        raise BadInputError(f"teacher {p} is not an `edgekit train` checkpoint (no model state and factory)",
                            hint=HINT)
    model = import_object(factory)()
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        raise BadInputError(f"teacher {p}: its weights do not fit {factory} ({str(exc).splitlines()[0][:200]})",
                            hint=HINT) from exc
    out = workdir / f"teacher-{p.parent.name or 'checkpoint'}.pt2"
    out.parent.mkdir(parents=True, exist_ok=True)
    T.save_program(model.eval(), student.io, out)
    return load_pt2(out).artifact


def check_teacher(teacher: Artifact, student: Artifact, train: Dataset | None) -> dict[str, Any]:
    """The teacher's and the student's outputs on two training samples (the student's example input without
    data) must have one shape; returns the teacher's facts for the report."""
    from . import _torch as T  # heavy: torch

    probe = tuple(x[:2] for x in train.xs) if train is not None else tuple(
        t.numpy() for t in T.example_input(student.io, 2))
    t_mod, s_mod = T.load_program(teacher).module(), T.load_program(student).module()
    try:
        t_out = T.predict(t_mod, probe)
    except Exception as exc:  # the teacher cannot take the student's inputs: name it, before any training
        raise BadInputError(f"teacher {teacher.path.name} cannot run on the deployed model's inputs "
                            f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})", hint=HINT) from exc
    s_out = T.predict(s_mod, probe)
    if tuple(t_out.shape) != tuple(s_out.shape):
        raise BadInputError(f"teacher {teacher.path.name}'s outputs have shape {tuple(t_out.shape)[1:]} a sample, "
                            f"the deployed model's {tuple(s_out.shape)[1:]}: the distilled student cannot learn "
                            "from it", hint=HINT)
    return {"path": str(teacher.path), "sha256": teacher.sha256, "outputs": list(t_out.shape[1:])}
