"""Knowledge distillation: train a student on the teacher's softened outputs (Hinton et al.):

    loss = alpha * T^2 * KL(softmax(s/T) || softmax(t/T)) + (1 - alpha) * CE(s, y)
           [+ feature_weight * MSE(proj(student_feature), teacher_feature) / mean(teacher_feature^2) per pair]

The student is the pass's input model (e.g. a pruned model, which recovers accuracy this way) or
a user architecture ``student: module:factory``; the teacher is ``teacher: model.pt2`` or the
pipeline's source model. Feature matching hooks named submodules, so it needs both as nn.Modules
(``student: module:factory`` and ``teacher_arch: module:Class``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ..artifact import Artifact
from ..errors import BadInputError, PassError
from ..formats import Format
from ..inputs.source import import_object, load_pt2
from ..timeline import check_deadline, epoch_done
from ..train.config import lineage_path
from .base import PassContext, PassOutput, TorchPass


class DistillConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    teacher: str | None = Field(None, description=".pt2 of the teacher (default: the deploy's source model)")
    teacher_arch: str | None = Field(None, description="module:Class of the teacher, for feature matching")
    student: str | None = Field(None, description="module:factory of the student (default: the input model)")
    temperature: float = Field(4.0, gt=0)
    alpha: float = Field(0.7, ge=0, le=1, description="weight of the soft-target loss (1 - alpha: labels)")
    feature_pairs: list[tuple[str, str]] = Field(
        default_factory=list, description="[student_module, teacher_module] pairs whose outputs are matched")
    feature_weight: float = Field(1.0, ge=0)
    epochs: int = Field(10, ge=1)
    lr: float = Field(1e-3, gt=0)
    batch_size: int = Field(64, ge=1)
    seed: int = 0
    threads: int | None = Field(1, ge=1, description="torch threads (None: torch default); tiny models are fastest on 1")


class Distill(TorchPass):
    name = "distill"
    Config = DistillConfig

    def run_torch(self, artifact, config: DistillConfig, ctx: PassContext, stem: str) -> PassOutput:
        import numpy as np
        import torch
        import torch.nn.functional as F

        from . import _torch as T  # heavy: torch

        train = T.require_train(ctx.train, "distillation")
        torch.manual_seed(config.seed)
        # --- teacher -----------------------------------------------------------------------
        teacher_art = _teacher_artifact(config, ctx, artifact)
        t_ep = T.load_program(teacher_art)
        teacher = T.module_from_arch(config.teacher_arch, t_ep, "teacher").eval() if config.teacher_arch \
            else t_ep.module()
        # --- student -----------------------------------------------------------------------
        if config.student:
            factory = import_object(config.student)
            try:
                student = factory()
            except TypeError as exc:
                raise BadInputError(f"student {config.student} cannot be built without arguments ({exc})") from exc
            if not isinstance(student, torch.nn.Module):
                raise BadInputError(f"student {config.student} built a {type(student).__name__}, not an nn.Module")
        else:
            student = T.load_program(artifact).module()
            if not T._batches_ok(student, tuple(x[:2] for x in train.xs)):
                raise PassError(f"the student program {artifact.path.name} has a static batch of 1 and cannot be "
                                "trained in batches",
                                hint="give student: module:factory, or distill a model written by an edgekit pass "
                                "(they keep a dynamic batch)")
        # --- shapes must agree -------------------------------------------------------------
        probe = tuple(x[:1] for x in train.xs)
        s_out, t_out = T.predict(student, probe), T.predict(teacher, probe)
        if s_out.shape != t_out.shape:
            raise BadInputError(
                f"the student's output shape {tuple(s_out.shape)} does not match the teacher's {tuple(t_out.shape)}",
                hint="the student must predict the same classes as the teacher (same last-layer size)")
        # the teacher is frozen: its soft targets are computed once
        t_logits = torch.from_numpy(T.predict(teacher, train.xs))
        pairs, projs = _feature_hooks(config, student, teacher,
                                      tuple(torch.from_numpy(np.ascontiguousarray(x[:2])) for x in train.xs))
        params = list(student.parameters()) + [p for m in projs for p in m.parameters()]
        opt = torch.optim.Adam(params, lr=config.lr)
        before = T.accuracy(student, ctx.eval)
        gen = torch.Generator().manual_seed(config.seed)
        Tm, history = config.temperature, []
        n = train.n
        index = torch.arange(n)
        for epoch in range(config.epochs):
            _train_mode(student, True)
            perm = torch.randperm(n, generator=gen)
            total = 0.0
            for i in range(0, n, config.batch_size):
                check_deadline("distillation")
                idx = index[perm[i:i + config.batch_size]]
                xs = [torch.from_numpy(np.ascontiguousarray(x[idx.numpy()])) for x in train.xs]
                y = torch.from_numpy(train.y.reshape(n, -1)[idx.numpy(), 0].astype(np.int64))
                opt.zero_grad()
                out = student(*xs)
                out = out[0] if isinstance(out, (tuple, list)) else out
                soft = F.kl_div(F.log_softmax(out / Tm, 1), F.softmax(t_logits[idx] / Tm, 1),
                                reduction="batchmean") * Tm * Tm
                loss = config.alpha * soft + (1 - config.alpha) * F.cross_entropy(out, y)
                if pairs:
                    with torch.no_grad():
                        teacher(*xs)
                    for (s_feat, t_feat), proj in zip(pairs, projs):
                        t_val = t_feat.value.detach()
                        # relative to the teacher feature's energy, so feature_weight does not depend on its scale
                        fm = F.mse_loss(proj(s_feat.value), t_val) / (t_val.pow(2).mean() + 1e-8)
                        loss = loss + config.feature_weight * fm
                loss.backward()
                opt.step()
                total += loss.item() * len(idx)
            history.append(round(total / n, 5))
            epoch_done("distillation", epoch + 1, config.epochs)
        _train_mode(student, False)
        for s_feat, t_feat in pairs:
            s_feat.remove()
            t_feat.remove()
        out_path = ctx.workdir / f"{stem}.pt2"
        io = T.save_program(student, artifact.io, out_path)
        metrics = {
            "teacher": str(teacher_art.path), "teacher_sha256": teacher_art.sha256,
            "student": config.student or "input model",
            "teacher_accuracy": T.accuracy(teacher, ctx.eval),
            "student_accuracy": {"before": before, "after": T.accuracy(student, ctx.eval)},
            "loss": history,
            "params": {"student": sum(p.numel() for p in student.parameters()),
                       "teacher": sum(p.numel() for p in teacher.parameters())},
            "train_data": str(train.path),
            "feature_pairs": [list(p) for p in config.feature_pairs],
            # how the teacher was made, when `edgekit train` left its lineage beside it
            "teacher_lineage": _teacher_training_lineage(Path(teacher_art.path)),
        }
        return PassOutput(path=out_path, precision="fp32", metrics=metrics, fmt=Format.TORCH, io=io)


def _teacher_training_lineage(teacher_path: Path) -> list | None:
    """The `teacher.pt2.lineage.json` sidecar written by `edgekit train` (None when absent or unreadable)."""
    import json


    side = lineage_path(teacher_path)
    try:
        doc = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, list) else [doc]


def _teacher_artifact(config: DistillConfig, ctx: PassContext, artifact: Artifact) -> Artifact:
    if config.teacher:
        p = Path(config.teacher)
        if not p.is_file():
            raise BadInputError(f"teacher {p} not found", hint="teacher: path to the teacher's .pt2")
        return load_pt2(p).artifact
    t = ctx.teacher
    if isinstance(t, Artifact) and t.format == Format.TORCH:
        return t
    if config.student:  # a fresh student learns from the input model
        return artifact
    raise PassError("distill needs a teacher", hint="set teacher: teacher.pt2 (or run it in a deploy recipe, "
                    "where the source model is the teacher)")


def _train_mode(module, on: bool) -> None:
    try:
        module.train(on)
    except NotImplementedError:  # a torch.export module stays in eval mode (frozen batch norm)
        pass


class _Capture:
    def __init__(self, module):
        self.value = None
        self.handle = module.register_forward_hook(self._hook)

    def _hook(self, _m, _i, out):
        self.value = out[0] if isinstance(out, (tuple, list)) else out

    def remove(self):
        self.handle.remove()


def _feature_hooks(config: DistillConfig, student, teacher, probe):
    if not config.feature_pairs:
        return [], []
    if not config.student or not config.teacher_arch:
        raise BadInputError("feature matching hooks named submodules: it needs student: module:factory and "
                            "teacher_arch: module:Class", hint="or drop feature_pairs (soft targets only)")
    s_mods, t_mods = dict(student.named_modules()), dict(teacher.named_modules())
    pairs, projs = [], []
    for s_name, t_name in config.feature_pairs:
        if s_name not in s_mods:
            raise BadInputError(f"feature_pairs: the student has no module {s_name!r}")
        if t_name not in t_mods:
            raise BadInputError(f"feature_pairs: the teacher has no module {t_name!r}")
        pairs.append((_Capture(s_mods[s_name]), _Capture(t_mods[t_name])))
    return pairs, build_projections(pairs, student, teacher, probe)


def build_projections(pairs, student, teacher, probe):
    """Size a 1x1 conv / linear projection per pair from one forward pass."""
    import torch

    with torch.no_grad():
        student(*probe)
        teacher(*probe)
    projs = []
    for s, t in pairs:
        sv, tv = s.value, t.value
        if sv.dim() != tv.dim() or sv.shape[2:] != tv.shape[2:]:
            raise BadInputError(f"feature shapes {tuple(sv.shape)} and {tuple(tv.shape)} cannot be matched "
                                "(spatial sizes must agree)")
        if sv.dim() == 4:
            projs.append(torch.nn.Conv2d(sv.shape[1], tv.shape[1], 1, bias=False))
        else:
            projs.append(torch.nn.Linear(sv.shape[-1], tv.shape[-1], bias=False))
    return projs
