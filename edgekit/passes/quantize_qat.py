"""Quantization-aware fine-tuning (QAT), rung 3 of the INT8 recovery ladder: when post-training
quantization cannot reach the tolerance, fine-tune the float model for a few epochs *under simulated
INT8* on the user's train data, with the float model as the distillation teacher, then quantize the
fine-tuned weights with onnxruntime as every other rung does.

    loss = alpha * T^2 * KL(softmax(s/T) || softmax(t/T)) + (1 - alpha) * task loss(s, y)

s: the student's first output under fake quantization, t: the fp32 teacher's (the model before
fine-tuning, computed once); the task loss is cross-entropy on class indices (``y`` of shape (N,) for
(N, C) logits, (N, H, W) for (N, C, H, W)) or MSE on targets shaped like the output. Further float
outputs are matched to the teacher's (MSE relative to their energy).

The simulation mirrors onnxruntime's static INT8 as ``quantize_ort`` builds it (checked here: on a
trained MLP the simulated model and onnxruntime's QDQ build agree on every eval prediction): fake
quantization (torch's ``fake_quantize_per_*_affine``, straight-through gradients) on the weights of
conv / linear / matmul (symmetric int8 [-127, 127], or [-64, 64] with ``reduce_range``; per output
channel or per tensor; a conv followed by an eval-mode BatchNorm quantizes the *folded* weight
``w * gamma / sqrt(var + eps)``, as onnxruntime sees it after the fold) and on every float tensor that
a quantized op reads or writes (asymmetric 8-bit, per tensor; a Relu/Clip right after an op shares its
quantization, as in onnxruntime's fused QDQ graph), and on the int32 bias (multiples of input scale x
weight scale: it matters when a weight scale is large). Activation ranges are minmax over the same
calibration samples onnxruntime calibrates on, re-computed from the float model at every epoch.

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
from ..data import Dataset
from ..errors import DataError, PassError
from ..formats import Format
from ..timeline import check_deadline
from .base import PassContext, PassOutput, TorchPass
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


# --- the simulation ------------------------------------------------------------------------------

_WEIGHTED = ("conv1d", "conv2d", "conv3d", "linear", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
_ACTIVATIONS = ("relu", "relu_", "relu6", "hardtanh", "hardtanh_", "clamp", "clamp_min")
_BATCHNORM = ("batch_norm", "_native_batch_norm_legit_no_training")
# aten ops whose counterpart onnxruntime's static quantizer handles (its QDQ and QOperator registries:
# Conv, Gemm/MatMul, Add, Mul, Concat, pools, Softmax, Sigmoid, LayerNormalization, Relu/Clip, Reshape...)
_QUANTIZED = (*_WEIGHTED, *_ACTIVATIONS, *_BATCHNORM, "matmul", "mm", "bmm", "addmm", "add", "mul", "cat",
              "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
              "adaptive_avg_pool1d", "adaptive_avg_pool2d", "softmax", "_softmax", "sigmoid",
              "layer_norm", "leaky_relu", "flatten", "view", "reshape", "permute", "transpose", "squeeze",
              "unsqueeze", "upsample_nearest2d", "upsample_bilinear2d", "pad", "constant_pad_nd", "split",
              "where", "gather", "embedding")
_GUARDS = "_guards_fn"


def _aten_name(node) -> str | None:
    if node.op != "call_function":
        return None
    name = getattr(node.target, "__name__", "")  # "conv2d.default", "add.Tensor"
    return name.split(".")[0] if "." in name else name


def _is_float(node) -> bool:
    import torch

    v = node.meta.get("val")
    return isinstance(v, torch.Tensor) and v.is_floating_point()


def _modules():
    import torch
    from torch import nn

    class ActivationFQ(nn.Module):
        """Asymmetric per-tensor fake quantization with minmax ranges (onnxruntime's MinMax calibrator)."""

        def __init__(self, qmin: int, qmax: int):
            super().__init__()
            self.qmin, self.qmax, self.mode = qmin, qmax, "off"
            self.register_buffer("lo", torch.tensor(float("inf")))
            self.register_buffer("hi", torch.tensor(float("-inf")))

        def scale(self):
            rmin, rmax = torch.clamp(self.lo, max=0.0), torch.clamp(self.hi, min=0.0)
            return torch.clamp((rmax - rmin) / (self.qmax - self.qmin), min=1e-12)

        def forward(self, x):
            if self.mode == "observe":
                with torch.no_grad():
                    d = x.detach().float()
                    self.lo.copy_(torch.minimum(self.lo, d.min()))
                    self.hi.copy_(torch.maximum(self.hi, d.max()))
                return x
            if self.mode != "on" or not bool(torch.isfinite(self.lo) & torch.isfinite(self.hi)):
                return x  # never observed, or an infinite range (a mask): onnxruntime's result is no better
            scale = self.scale()
            zp = torch.clamp(torch.round(self.qmin - torch.clamp(self.lo, max=0.0) / scale),
                             self.qmin, self.qmax).to(torch.int32)
            return torch.fake_quantize_per_tensor_affine(x, scale.float(), zp, self.qmin, self.qmax)

    class WeightFQ(nn.Module):
        """onnxruntime's weight quantization: symmetric int8 (or asymmetric uint8), per output channel
        (``axis``) or per tensor; with ``k`` the folded weight ``w * k`` is quantized, then unfolded."""

        def __init__(self, per_channel: bool, axis: int, qmin: int, qmax: int, symmetric: bool):
            super().__init__()
            self.per_channel, self.axis, self.qmin, self.qmax, self.symmetric = per_channel, axis, qmin, qmax, symmetric
            self.mode = "off"

        def forward(self, w, k=None):
            if self.mode != "on":
                return w
            axis = self.axis % w.dim()
            shape = [1] * w.dim()
            shape[axis] = -1
            wk = w * k.reshape(shape) if k is not None else w
            d = wk.detach()
            dims = [i for i in range(w.dim()) if i != axis] if self.per_channel else list(range(w.dim()))
            lo = torch.clamp(d.amin(dim=dims), max=0.0) if dims else torch.clamp(d, max=0.0)
            hi = torch.clamp(d.amax(dim=dims), min=0.0) if dims else torch.clamp(d, min=0.0)
            if self.symmetric:
                scale = torch.clamp(torch.maximum(-lo, hi) / self.qmax, min=1e-12)
                zp = torch.zeros_like(scale, dtype=torch.int32)
            else:
                scale = torch.clamp((hi - lo) / (self.qmax - self.qmin), min=1e-12)
                zp = torch.clamp(torch.round(self.qmin - lo / scale), self.qmin, self.qmax).to(torch.int32)
            self.last_scale = scale.detach()
            if self.per_channel:
                q = torch.fake_quantize_per_channel_affine(wk, scale.float(), zp, axis, self.qmin, self.qmax)
            else:
                q = torch.fake_quantize_per_tensor_affine(wk, scale.float(), zp, self.qmin, self.qmax)
            return q / k.reshape(shape) if k is not None else q

    class BiasFQ(nn.Module):
        """onnxruntime's int32 bias: rounded to multiples of input scale x weight scale (it matters when a
        weight scale is large, e.g. per-tensor weights with outlier rows); straight-through gradient."""

        def __init__(self, act, weight):
            super().__init__()
            self._refs = [act, weight]  # a list: not registered twice as submodules
            self.mode = "off"

        def forward(self, b):
            act, weight = self._refs
            s_w = getattr(weight, "last_scale", None)
            if self.mode != "on" or act.mode != "on" or s_w is None or not bool(torch.isfinite(act.lo) & torch.isfinite(act.hi)):
                return b
            s = act.scale() * s_w
            return b + (torch.round(b / s) * s - b).detach()

    return ActivationFQ, WeightFQ, BiasFQ


def _ranges(enc: OrtQuantizeConfig) -> tuple[tuple[int, int], tuple[int, int, bool]]:
    """((activation qmin, qmax), (weight qmin, qmax, symmetric)) as onnxruntime computes them."""
    act = (0, 255) if enc.activation_type == "uint8" else (-128, 127)
    if enc.weight_type == "int8":
        m = 64 if enc.reduce_range else 127
        return act, (-m, m, True)
    return act, (0, 127 if enc.reduce_range else 255, False)


def strip_guards(gm) -> None:
    """Drop the input-shape guard an unlifted torch.export module calls (it pins the export's batch)."""
    for n in list(gm.graph.nodes):
        if n.op == "call_module" and str(n.target) == _GUARDS:
            gm.graph.erase_node(n)
    if hasattr(gm, _GUARDS):
        delattr(gm, _GUARDS)
    gm.recompile()


def insert_fake_quant(gm, enc: OrtQuantizeConfig) -> list:
    """Fake-quant modules in ``gm``'s graph (see the module doc); returns them."""
    ActivationFQ, WeightFQ, BiasFQ = _modules()
    (aq0, aq1), (wq0, wq1, sym) = _ranges(enc)
    g = gm.graph
    fqs: list = []

    def add(mod) -> str:
        name = f"edgekit_fq{len(fqs)}"
        gm.add_module(name, mod)
        fqs.append(mod)
        return name

    for n in list(g.nodes):
        op = _aten_name(n)
        if op is None or len(n.args) < 2 or not hasattr(n.args[1], "op") or n.args[1].op != "get_attr":
            continue
        if op in _WEIGHTED or (op in ("matmul", "mm") and _is_float(n.args[1])):
            axis = 1 if op.startswith("conv_transpose") else (-1 if op in ("matmul", "mm") else 0)
            users = list(n.users)
            bn = users[0] if (len(users) == 1 and _aten_name(users[0]) in _BATCHNORM and op.startswith("conv")
                              and not op.startswith("conv_transpose")) else None
            name = add(WeightFQ(enc.per_channel, axis, wq0, wq1, sym))
            with g.inserting_before(n):
                if bn is not None:  # aten.batch_norm(x, gamma, beta, mean, var, training, momentum, eps, ...)
                    eps = bn.args[7] if _aten_name(bn) == "batch_norm" else bn.args[6]
                    gamma, var = bn.args[1], bn.args[4]
                    if gamma is None:
                        new = g.call_module(name, (n.args[1],))
                    else:
                        import torch

                        aten = torch.ops.aten
                        k = g.call_function(aten.div.Tensor, (gamma, g.call_function(
                            aten.sqrt.default, (g.call_function(aten.add.Scalar, (var, eps)),))))
                        new = g.call_module(name, (n.args[1], k))
                else:
                    new = g.call_module(name, (n.args[1],))
            n.replace_input_with(n.args[1], new)

    def fused_into_next(n) -> bool:
        users = list(n.users)
        if len(users) != 1:
            return False
        nxt = _aten_name(users[0])
        return nxt in _ACTIVATIONS or (nxt in _BATCHNORM and (_aten_name(n) or "").startswith("conv"))

    for n in [n for n in g.nodes if n.op in ("placeholder", "call_function") and _is_float(n)]:
        mine = _aten_name(n) in _QUANTIZED
        feeds = any(_aten_name(u) in _QUANTIZED for u in n.users)
        if not (mine or feeds) or (mine and fused_into_next(n)):
            continue
        name = add(ActivationFQ(aq0, aq1))
        with g.inserting_after(n):
            new = g.call_module(name, (n,))
        n.replace_all_uses_with(new, delete_user_cb=lambda u, new=new: u is not new)
    # biases of the weighted ops whose input and weights are both fake-quantized (a bias folded with a
    # BatchNorm is left in float: its int32 rounding is not simulated)
    for n in list(g.nodes):
        op = _aten_name(n)
        if op not in _WEIGHTED or len(n.args) < 3 or not hasattr(n.args[2], "op") or n.args[2].op != "get_attr":
            continue
        x, w = n.args[0], n.args[1]
        act = getattr(gm, str(x.target)) if getattr(x, "op", None) == "call_module" and str(x.target).startswith("edgekit_fq") else None
        wfq = getattr(gm, str(w.target)) if getattr(w, "op", None) == "call_module" and len(w.args) == 1 else None
        if act is None or wfq is None or not hasattr(act, "lo"):
            continue
        name = add(BiasFQ(act, wfq))
        with g.inserting_before(n):
            new = g.call_module(name, (n.args[2],))
        n.replace_input_with(n.args[2], new)
    g.lint()
    gm.recompile()
    return fqs


def remove_fake_quant(gm) -> None:
    """The float graph again (fine-tuned weights): every fake-quant node bypassed and deleted."""
    g = gm.graph
    names = {n for n, _ in gm.named_children() if n.startswith("edgekit_fq")}
    for n in list(g.nodes):
        if n.op == "call_module" and n.target in names:
            n.replace_all_uses_with(n.args[0])
            g.erase_node(n)
    g.eliminate_dead_code()
    for name in names:
        delattr(gm, name)
    g.lint()
    gm.recompile()


def _set(fqs, mode: str, kind: str | None = None) -> None:
    for f in fqs:
        if kind is None or type(f).__name__ == kind:
            f.mode = mode


def calibrate_ranges(gm, fqs: list, xs: tuple[np.ndarray, ...], batch: int) -> None:
    """Minmax activation ranges of the float model on the calibration samples ``xs`` (what
    onnxruntime's MinMax calibrator computes), then every fake quantizer on."""
    import torch

    for f in fqs:
        if hasattr(f, "lo"):
            f.lo.fill_(float("inf"))
            f.hi.fill_(float("-inf"))
    _set(fqs, "off")
    _set(fqs, "observe", "ActivationFQ")
    with torch.no_grad():
        for i in range(0, len(xs[0]), batch):
            gm(*_tensors(xs, slice(i, i + batch)))
    _set(fqs, "on")


def simulate(program, io: IOSpec, calib: Dataset, enc: OrtQuantizeConfig, batch: int = 64):
    """``program`` as the INT8 model onnxruntime would build in ``enc``, simulated (fake quantization,
    minmax ranges on ``calib``): an nn.Module taking batches."""
    gm, batch = trainable_module(program, io, batch)
    fqs = insert_fake_quant(gm, enc)
    calibrate_ranges(gm, fqs, as_model_dtypes(tuple(x[: enc.calibration_samples] for x in calib.xs), io), batch)
    return gm


def as_model_dtypes(xs: tuple[np.ndarray, ...], io: IOSpec) -> tuple[np.ndarray, ...]:
    """The arrays in the dtypes the program takes (data checks accept float64 for float32 and the like)."""
    return tuple(x if x.dtype == np.dtype(spec.dtype) else x.astype(spec.dtype) for x, spec in zip(xs, io.inputs))


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


def trainable_module(program, io: IOSpec, batch: int):
    """(an nn.Module of ``program`` that takes batches of ``batch``, the batch it takes): the program
    re-exported with a dynamic batch, else (a program that pins its batch) its own module at batch 1."""
    import torch

    from ._torch import example_input

    gm = copy.deepcopy(program.module())  # its parameters alias the program's: training must not change the source
    strip_guards(gm)
    if batch > 1:
        ex = example_input(io, batch=2)
        dim = torch.export.Dim("batch", min=1, max=max(4096, batch))
        try:
            from ..logs import quiet

            with quiet("torch.export", "torch._dynamo"):
                dyn = torch.export.export(gm, ex, dynamic_shapes=tuple({0: dim} for _ in ex)).module()
            strip_guards(dyn)
            return dyn, batch
        except Exception:  # the graph pins the batch (e.g. a reshape to 1): train one sample at a time
            pass
    return gm, 1


def _tensors(xs, idx):
    import torch

    return [torch.from_numpy(np.ascontiguousarray(x[idx])) for x in xs]


def _outputs(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def finetune(program, io: IOSpec, train: Dataset, calib: Dataset, settings: QatSettings,
             enc: OrtQuantizeConfig, deadline: float | None = None) -> FinetuneResult:
    """Fine-tune ``program`` under simulated INT8 in ``enc`` (see the module doc). Runs with the
    caller's torch threads (the passes set ``settings.threads``)."""
    import torch
    import torch.nn.functional as F

    from ._torch import example_input
    from ..logs import quiet

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
    from ..convert.torch_to_onnx import export_onnx
    from ..source import from_program
    from ._torch import save_ep

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

        from ..source import load_onnx
        from ._torch import load_program

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
    from ..source import ort_reference

    if ds.y is None or ds.y.dtype.kind not in "iu" or ds.y.ndim != 1:
        return None
    if torch_program is not None:
        from ._torch import predict

        out = predict(torch_program.module(), ds.xs)
    else:
        out = ort_reference(path)(list(ds.xs))
    if out.ndim != 2:
        return None
    return round(float((out.argmax(1) == ds.y).mean() * 100), 4)
