"""onnxruntime's static INT8 simulated in a torch program, for quantization-aware fine-tuning
(``quantize_qat.py``).

The simulation mirrors onnxruntime's static INT8 as ``quantize_ort`` builds it (checked here: on a
trained MLP the simulated model and onnxruntime's QDQ build agree on every eval prediction): fake
quantization (torch's ``fake_quantize_per_*_affine``, straight-through gradients) on the weights of
conv / linear / matmul (symmetric int8 [-127, 127], or [-64, 64] with ``reduce_range``; per output
channel or per tensor; a conv followed by an eval-mode BatchNorm quantizes the *folded* weight
``w * gamma / sqrt(var + eps)``, as onnxruntime sees it after the fold) and on every float tensor that
a quantized op reads or writes (asymmetric 8-bit, per tensor; a Relu/Clip right after an op shares its
quantization, as in onnxruntime's fused QDQ graph), and on the int32 bias (multiples of input scale x
weight scale: it matters when a weight scale is large). Activation ranges are minmax over the same
calibration samples onnxruntime calibrates on (``calibrate_ranges``; the fine-tune re-computes them from
the float model at every epoch). ``remove_fake_quant`` takes the nodes out again: the same float graph
with its (new) weights. torch is imported inside the functions: importing this module stays cheap.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from ..artifact import IOSpec
from ..inputs.data import Dataset
from ..logs import quiet
from .quantize_ort import OrtQuantizeConfig

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
            if (self.mode != "on" or act.mode != "on" or s_w is None
                    or not bool(torch.isfinite(act.lo) & torch.isfinite(act.hi))):
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
        act = (getattr(gm, str(x.target)) if getattr(x, "op", None) == "call_module"
               and str(x.target).startswith("edgekit_fq") else None)
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



def trainable_module(program: Any, io: IOSpec, batch: int) -> tuple[Any, int]:
    """(an nn.Module of ``program`` that takes batches of ``batch``, the batch it takes): the program
    re-exported with a dynamic batch, else (a program that pins its batch) its own module at batch 1."""
    import torch  # heavy: torch

    from ._torch import example_input  # heavy: torch

    gm = copy.deepcopy(program.module())  # its parameters alias the program's: training must not change the source
    strip_guards(gm)
    if batch > 1:
        ex = example_input(io, batch=2)
        dim = torch.export.Dim("batch", min=1, max=max(4096, batch))
        try:
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
