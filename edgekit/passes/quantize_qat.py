"""Quantization-aware fine-tuning (QAT), rung 3 of the INT8 recovery ladder: when post-training
quantization cannot reach the tolerance, fine-tune the float model for a few epochs *under simulated
INT8* on the user's train data, with the float model as the distillation teacher, then quantize the
fine-tuned weights with onnxruntime as every other rung does.

    loss = alpha * T^2 * KL(softmax(s/T) || softmax(t/T)) + (1 - alpha) * task loss(s, y)

s: the student's first output under fake quantization, t: the fp32 teacher's (the model before
fine-tuning, computed once); the task loss is cross-entropy on class indices (``y`` of shape (N,) for
(N, C) logits, (N, H, W) for (N, C, H, W)) or MSE on targets shaped like the output. Further float
outputs are matched to the teacher's (MSE relative to their energy).

The simulation (``qat_simulation.py``) mirrors onnxruntime's static INT8 as ``quantize_ort`` builds it:
fake quantization of the weights (a conv's folded with its BatchNorm), of every float tensor a quantized op
reads or writes and of the int32 bias; activation ranges minmax over the calibration samples onnxruntime
calibrates on, re-computed from the float model at every epoch.

After training the fake-quant nodes are removed: the result is the same float graph with new weights,
exported to ONNX and quantized by onnxruntime (``quantize_ort``), re-calibrated on the calibration
set, so the INT8 file is onnxruntime's own QDQ (or QOperator) output in the encoding the device runs
fastest and the later rungs (calibration methods, encodings, mixed precision) apply to it.

Why not PT2E (torchao ``prepare_qat_pt2e`` / ``convert_pt2e``): measured here (torch 2.13, torchao
0.18, executorch 1.5.1) it works -- XNNPACK's quantizer, convert, the dynamo ONNX exporter writes
QuantizeLinear/DequantizeLinear + Gemm that onnxruntime runs -- but the encoding is XNNPACK's (int8
activations, the S8S8 QDQ that this repo measured slower than fp32 on x86 with VNNI), the quantizer
lives in the ``executorch`` extra (torchao only in ``inc``), and the result bypasses onnxruntime's
own calibration and mixed precision. This module needs torch only.

The epoch is chosen on a held-out slice of the train data (``holdout``): the one whose simulated INT8
model agrees best with the teacher (top-1 agreement for logits, relative MSE otherwise), the model
before fine-tuning included, so the fine-tune never returns a model its own simulation scores worse.
Bounded by ``epochs`` and ``seconds``; seeded; ``threads`` torch threads.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..artifact import Artifact, IOSpec
from ..convert.torch_to_onnx import export_onnx
from ..errors import DataError, PassError
from ..formats import Format
from ..inputs.data import Dataset
from ..inputs.source import from_program, load_onnx, ort_reference
from ..logs import quiet
from ..timeline import check_deadline
from .base import PassContext, PassOutput, TorchPass
from .qat_simulation import (
    _set,
    _tensors,
    as_model_dtypes,
    calibrate_ranges,
    insert_fake_quant,
    remove_fake_quant,
    trainable_module,
)
from .quantize_ort import OrtQuantize, OrtQuantizeConfig, encoding_label


class QatSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    epochs: int = Field(10, ge=1, description="fine-tuning epochs over the train data (the best one is kept)")
    seconds: float = Field(300.0, gt=0, description="time budget of the fine-tune, checked every step; "
                           "the best epoch finished so far is kept")
    # measured on the test model (a trained digits MLP, tests/unit/test_quantize_qat.py): Adam 1e-3 with
    # cosine decay recovered it, 1e-4 did not move it enough in 10 epochs; lower it for large pretrained nets
    lr: float = Field(1e-3, gt=0, description="Adam learning rate (cosine-decayed to 0 over the planned steps)")
    batch_size: int = Field(64, ge=1)
    temperature: float = Field(4.0, gt=0, description="distillation temperature")
    alpha: float = Field(0.5, ge=0, le=1, description="weight of the distillation loss (1 - alpha: the task loss "
                         "on the labels; alpha 1 needs no labels)")
    holdout: float = Field(0.1, ge=0, lt=1, description="fraction of the train data held out to choose the epoch "
                           "(0: keep the last epoch)")
    train_samples: int | None = Field(None, ge=1, description="fine-tune on the first N train samples (default all)")
    seed: int = 0
    threads: int | None = Field(1, ge=1, description="torch threads (None: torch default); tiny models are fastest on 1")


class QatConfig(QatSettings, OrtQuantizeConfig):
    """The ``quantize_qat`` pass: the fine-tune's settings and the onnxruntime static encoding it
    simulates and then builds."""

    mode: Literal["static"] = "static"  # QAT simulates static INT8 (activations quantized too)


# --- data checks -----------------------------------------------------------------------------------

def task_of(train: Dataset, out_shape: tuple[int, ...], alpha: float) -> str:
    """How the labels are used: "classes" (cross-entropy over axis 1), "targets" (MSE) or "none"
    (alpha 1: distillation only). Raises DataError naming the problem when they do not fit the output."""
    if alpha >= 1.0:
        return "none"
    where = f"train data {train.path.name}"
    if train.y is None:
        raise DataError(f"{where} has no labels (array {train.y_key or 'y'!r}); quantization-aware fine-tuning "
                        "trains on them (its task loss, beside the distillation loss)",
                        hint="add y=labels to the .npz (class indices of shape (N,) for a classifier), pass --y-key, "
                        "or set qat alpha: 1 (distillation only, no labels)")
    y = train.y
    want = tuple(out_shape[1:])

    def fits(got, shape) -> bool:  # None: a dynamic size, anything fits
        return len(got) == len(shape) and all(w is None or w == g for g, w in zip(got, shape))

    if y.dtype.kind in "iub" and len(want) >= 1 and fits(tuple(y.shape[1:]), want[1:]):
        lo, hi = int(y.min()), int(y.max())
        c = want[0]
        if lo < 0 or (c is not None and hi >= c):
            raise DataError(f"{where}: labels must be class indices in [0, {c}) for the model's {c} outputs, "
                            f"got values in [{lo}, {hi}]", hint="store class indices, e.g. y = labels.argmax(1)")
        return "classes"
    if fits(tuple(y.shape[1:]), want):
        return "targets"
    dims = ["?" if d is None else str(d) for d in want]
    raise DataError(f"{where}: labels have shape {tuple(y.shape)}, the model's first output is "
                    f"(N, {', '.join(dims)}); QAT's task loss takes class indices of shape "
                    f"(N{''.join(', ' + d for d in dims[1:])}) or targets shaped like the output",
                    hint="fix the labels' shape, or set qat alpha: 1 (distillation only, labels unused)")


# --- the fine-tune ---------------------------------------------------------------------------------

@dataclass
class FinetuneResult:
    program: Any  # torch.export.ExportedProgram of the fine-tuned float model, batch 1
    metrics: dict = field(default_factory=dict)


def _outputs(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def finetune(program, io: IOSpec, train: Dataset, calib: Dataset, settings: QatSettings,
             enc: OrtQuantizeConfig, deadline: float | None = None) -> FinetuneResult:
    """Fine-tune ``program`` under simulated INT8 in ``enc`` (see the module doc). Runs with the
    caller's torch threads (the passes set ``settings.threads``)."""
    import torch
    import torch.nn.functional as F

    from ._torch import example_input  # heavy: torch

    started = time.perf_counter()
    deadline = min(deadline or float("inf"), started + settings.seconds)
    torch.manual_seed(settings.seed)
    gen = torch.Generator().manual_seed(settings.seed)
    n_all = min(train.n, settings.train_samples or train.n)
    order = torch.randperm(train.n, generator=gen).numpy()[:n_all]
    n_hold = int(round(n_all * settings.holdout)) if settings.holdout > 0 and n_all > 1 else 0
    n_hold = min(n_hold, n_all - 1, 2048)
    hold_idx, train_idx = order[:n_hold], order[n_hold:]
    xs = as_model_dtypes(train.xs, io)
    gm, batch = trainable_module(program, io, settings.batch_size)
    dynamic = batch > 1
    fqs = insert_fake_quant(gm, enc)
    if not fqs:
        raise PassError("QAT found nothing to quantize in the program (no conv, linear or matmul with weights)")
    params = [p for p in gm.parameters() if p.is_floating_point()]
    for p in params:
        p.requires_grad_(True)
    calib_xs = as_model_dtypes(tuple(x[: enc.calibration_samples] for x in calib.xs), io)

    def forward_all(index, bs):  # outputs of the current mode over train samples ``index``
        outs: list[list] = []
        with torch.no_grad():
            for i in range(0, len(index), bs):
                o = _outputs(gm(*_tensors(xs, index[i:i + bs])))
                outs.append([t.detach() for t in o])
        return [torch.cat([o[k] for o in outs]) for k in range(len(outs[0]))] if outs else []

    def calibrate():
        calibrate_ranges(gm, fqs, calib_xs, batch)

    with quiet("torch.export", "torch._dynamo"):
        _set(fqs, "off")
        teacher = forward_all(np.arange(train.n), batch)  # the float model, every train sample
        probe_shape = tuple(teacher[0].shape)
        task = task_of(train, probe_shape, settings.alpha)
        classes = len(probe_shape) >= 2 and (task == "classes" or (task != "targets" and len(probe_shape) == 2))
        y_all = None
        if task != "none":
            y = train.y
            y_all = torch.from_numpy(np.ascontiguousarray(y.astype(np.int64) if task == "classes" else y.astype(np.float32)))

        def agreement(outs) -> float:
            """How close the simulated INT8 model is to the teacher on the holdout (higher is better):
            -KL(teacher || student) at T=1 for logits (continuous: top-1 agreement on a small holdout
            ties and picks by noise), -relative MSE otherwise."""
            t, s = teacher[0][hold_idx], outs[0]
            if classes:
                kl = F.kl_div(F.log_softmax(s.float(), 1), F.log_softmax(t.float(), 1), log_target=True,
                              reduction="sum") / float(np.prod([s.shape[0], *s.shape[2:]]))
                return -float(kl)
            return -float(((s - t) ** 2).mean() / ((t ** 2).mean() + 1e-12))

        def top1_agreement(outs) -> float | None:
            t, s = teacher[0][hold_idx], outs[0]
            return round(float((s.argmax(1) == t.argmax(1)).float().mean()), 4) if classes else None

        Tm = settings.temperature

        def loss_of(idx):
            outs = _outputs(gm(*_tensors(xs, idx)))
            s0, t0 = outs[0], teacher[0][idx]
            if classes:
                kd = F.kl_div(F.log_softmax(s0 / Tm, 1), F.softmax(t0 / Tm, 1), reduction="batchmean") * Tm * Tm
                if s0.dim() > 2:  # per position: batchmean divides by N only
                    kd = kd / float(np.prod(s0.shape[2:]))
            else:
                kd = F.mse_loss(s0, t0) / ((t0 ** 2).mean() + 1e-12)
            loss = settings.alpha * kd
            if task == "classes":
                loss = loss + (1 - settings.alpha) * F.cross_entropy(s0, y_all[idx])
            elif task == "targets":
                loss = loss + (1 - settings.alpha) * F.mse_loss(s0, y_all[idx])
            for s, t in zip(outs[1:], teacher[1:]):
                if s.is_floating_point():
                    tt = t[idx]
                    loss = loss + F.mse_loss(s, tt) / ((tt ** 2).mean() + 1e-12)
            return loss

        calibrate()
        start_state = copy.deepcopy(gm.state_dict())
        outs0 = forward_all(hold_idx, batch) if n_hold else None
        best = (agreement(outs0) if n_hold else float("-inf"), 0, start_state)
        before, top1 = best[0], {"before": top1_agreement(outs0) if n_hold else None}
        with torch.no_grad():  # the starting model's loss: the divergence guard's yardstick
            first = [train_idx[i:i + batch] for i in range(0, min(len(train_idx), 4 * batch), batch)]
            start_loss = float(np.mean([float(loss_of(idx)) for idx in first])) if first else float("inf")
        steps_per_epoch = max(1, -(-len(train_idx) // batch))
        planned = settings.epochs * steps_per_epoch
        lr, restarts = settings.lr, []
        while True:
            opt = torch.optim.Adam(params, lr=lr)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 0.5 * (1 + np.cos(np.pi * min(k, planned) / planned)))
            history, epochs_run, steps, stopped, diverged = [], 0, 0, "epochs", None
            for epoch in range(settings.epochs):
                calibrate()
                perm = train_idx[torch.randperm(len(train_idx), generator=gen).numpy()]
                total, seen, late = 0.0, 0, []
                for i in range(0, len(perm), batch):
                    check_deadline(f"QAT epoch {epoch + 1}")  # the search's budget (its own, below, ends the fine-tune)
                    if time.perf_counter() > deadline:
                        stopped = "time budget (seconds)"
                        break
                    idx = perm[i:i + batch]
                    loss = loss_of(idx)
                    if not torch.isfinite(loss):
                        diverged = f"loss {float(loss)} at epoch {epoch + 1}"
                        break
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    sched.step()
                    steps += 1
                    total += float(loss) * len(idx)
                    seen += len(idx)
                    if i >= len(perm) // 2:
                        late.append(float(loss))
                # the first epoch ends far above the loss the model started from: the rate is too high. Measured
                # here: the zoo MobileNetV2 at lr 1e-3 ended its first epoch at 35x its start and kept rising; the
                # test MLP (far from its quantized optimum) rose 2.2x, then fell below its start by the third epoch
                if diverged is None and epoch == 0 and late and np.mean(late) > 3.0 * start_loss:
                    diverged = f"first-epoch loss {np.mean(late):.4g} above the start's {start_loss:.4g}"
                if diverged or seen == 0:
                    break
                epochs_run += 1
                history.append(round(total / seen, 5))
                calibrate()
                outs = forward_all(hold_idx, batch) if n_hold else None
                score = agreement(outs) if n_hold else float(epochs_run)
                if score >= best[0]:  # ties: the later epoch (more fine-tuned)
                    best = (score, epochs_run, copy.deepcopy(gm.state_dict()))
                    top1["chosen"] = top1_agreement(outs) if n_hold else None
                if stopped != "epochs":
                    break
            if diverged is None:
                break
            restarts.append({"lr": lr, "why": diverged})
            if len(restarts) > 2 or time.perf_counter() > deadline:
                if best[1] == 0:
                    raise PassError(f"QAT diverged at every learning rate tried ({', '.join(str(r['lr']) for r in restarts)})",
                                    hint="lower qat lr, or raise the batch size")
                break
            gm.load_state_dict(start_state)  # from the start again, ten times slower
            lr /= 10
        gm.load_state_dict(best[2])
        remove_fake_quant(gm)
        try:
            ft = torch.export.export(gm, example_input(io, 1))
        except Exception as exc:  # the same graph exported before; report it if it does not now
            raise PassError(f"re-exporting the fine-tuned model failed: {type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:300] if str(exc) else ''}") from exc
    metrics = {
        "method": "fake-quant fine-tuning (onnxruntime's static INT8 simulated), then onnxruntime quantization",
        "simulated_encoding": encoding_label(enc.model_copy(update={"calibration_method": "minmax"})),
        "fake_quant_nodes": len(fqs),
        "train_samples": int(len(train_idx)), "holdout_samples": int(n_hold),
        "batch_size": batch, **({} if dynamic else {"batch_note": "the program pins its batch: trained one sample at a time"}),
        "task_loss": {"classes": "cross-entropy", "targets": "mse", "none": "none (alpha 1)"}[task],
        "epochs_run": epochs_run, "steps": steps, "stopped_by": stopped, "loss": history,
        "start_loss": round(start_loss, 5), **({"lr_restarts": restarts} if restarts else {}),
        "chosen_epoch": best[1],
        "holdout": ({"selection": ("-KL(teacher || simulated INT8), T=1" if classes else
                                   "-relative MSE vs the teacher") + ", per sample; the highest is kept",
                     "before": round(before, 5), "chosen": round(best[0], 5),
                     **({"top1_agreement": {"before": top1["before"], "chosen": top1.get("chosen", top1["before"])}}
                        if classes else {})} if n_hold else None),
        "lr": lr, "alpha": settings.alpha, "temperature": settings.temperature, "seed": settings.seed,
        "train_data": str(train.path),
        "seconds": round(time.perf_counter() - started, 3),
    }
    return FinetuneResult(program=ft, metrics=metrics)


def finetuned_onnx(result: FinetuneResult, dest: Path, parity_xs: list[np.ndarray]) -> Artifact:
    """The fine-tuned float model as ONNX (batch 1, the source's input names), parity checked."""
    from ._torch import save_ep  # heavy: torch

    pt2 = dest.with_suffix(".pt2")
    save_ep(result.program, pt2)
    return export_onnx(from_program(result.program, pt2, lineage_name="qat fine-tune"), dest, parity_xs)


def require_qat_data(train: Dataset | None, calib: Dataset | None) -> Dataset:
    if train is None:
        raise DataError("quantization-aware fine-tuning needs training data",
                        hint="pass --train-data TRAIN.npz (inputs x and labels y), or set train_data in the recipe")
    if calib is None:
        raise DataError("quantization-aware fine-tuning simulates static INT8: it needs a calibration set",
                        hint="pass --calib-data CALIB.npz")
    return train


class QatQuantize(TorchPass):
    """``quantize_qat``: PyTorch program -> fine-tuned under simulated INT8 -> onnxruntime static INT8 ONNX."""

    name = "quantize_qat"
    Config = QatConfig

    def run_torch(self, artifact, config: QatConfig, ctx: PassContext, stem: str) -> PassOutput:
        import shutil
        import tempfile

        from ._torch import load_program  # heavy: torch

        train = require_qat_data(ctx.train, ctx.calib)
        program = load_program(artifact)
        enc = OrtQuantizeConfig(**config.model_dump(include=set(OrtQuantizeConfig.model_fields)))
        tmp = Path(tempfile.mkdtemp(prefix=f".{stem}.qat-", dir=ctx.workdir))
        try:
            res = finetune(program, artifact.io, train, ctx.calib, config, enc)
            parity = [x[:8] for x in (ctx.eval or ctx.calib).xs]
            started = time.perf_counter()
            fp32 = finetuned_onnx(res, tmp / "finetuned.onnx", parity)
            export_s = time.perf_counter() - started
            src = load_onnx(Path(fp32.path)).artifact
            q = OrtQuantize().run(src, enc, PassContext(workdir=tmp, calib=ctx.calib), "int8")
            out = ctx.workdir / f"{stem}.onnx"
            part = ctx.workdir / f".{stem}.partial.onnx"
            shutil.copyfile(q.path, part)
            part.replace(out)
            metrics = {**res.metrics, "encoding": encoding_label(enc), "export_seconds": round(export_s, 3),
                       "quantize": q.metrics,
                       "finetuned_parity": (fp32.lineage[-1].metrics or {}).get("parity")}
            if ctx.eval is not None and ctx.eval.y is not None:
                metrics["eval_top1"] = {"fp32": _top1(Path(artifact.path), ctx.eval, torch_program=program),
                                        "qat_fp32": _top1(Path(fp32.path), ctx.eval),
                                        "qat_int8": _top1(out, ctx.eval)}
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return PassOutput(path=out, precision="int8", metrics=metrics, fmt=Format.ONNX, io=fp32.io)


def _top1(path: Path, ds: Dataset, torch_program=None) -> float | None:
    """Top-1 (percent) of the first output on ``ds``, when its labels are class indices."""

    if ds.y is None or ds.y.dtype.kind not in "iu" or ds.y.ndim != 1:
        return None
    if torch_program is not None:
        from ._torch import predict  # heavy: torch

        out = predict(torch_program.module(), ds.xs)
    else:
        out = ort_reference(path)(list(ds.xs))
    if out.ndim != 2:
        return None
    return round(float((out.argmax(1) == ds.y).mean() * 100), 4)
