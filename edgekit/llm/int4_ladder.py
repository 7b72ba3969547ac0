"""INT4 that never degrades silently: each int4 file is built from a layer plan (``layer_plan``), checked on
the host against the float model before any device time, and recovered when it misses the tolerance.

The check: the file's own logits (the agent's decoder code run here, as ``parity`` does) on the first
``HOST_WINDOWS`` eval windows, against the float model's, as the mean KL divergence over the whole vocabulary
(the device's figure, over the top-K plus a tail bucket, is a lower bound of this one). Within the gate's
``max_kld``: done. Otherwise the recovery ladder: the layers ranked by their measured int4 output error on
the same text (``layer_plan.layer_errors``: sensitivity measured, not guessed), the 1, 2, 4, ... most
sensitive kept at int8 (at most half the int4 layers). Nothing is built twice (issue #45 item 3): each rung is
checked on the PyTorch model with its layers' weights rounded as the file stores them (``layer_plan.fake_quant``,
on the model's own weights, put back after), and only the first rung inside the tolerance is lowered; the
lowered file is then checked once more with its own logits. Only if that check misses (a runtime's kernels
round more than the weights: activations, accumulation) does the ladder go on, lowering each further rung. If no
rung is inside, the variant is dropped naming every rung's figure. Every rung is in the account the lineage
carries (``quantization.ladder``), and ``quantization.lowered`` says which rung was lowered and how often."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..artifact import Artifact
from ..errors import ConversionError
from ..timeline import check_deadline
from .layer_plan import LayerChoice, account, layer_errors
from .parity import open_decoder

HOST_WINDOWS = 2


@dataclass(frozen=True)
class Calibration:
    """What an int4 build checks itself with: eval windows [W, T] and the gate's KLD tolerance."""

    windows: np.ndarray
    max_kld: float
    head: str = "int8"  # the output layer's scheme (layer_plan.HEADS)

    def key(self) -> dict[str, Any]:
        """What an int4 row's file depends on, for the build cache: the tolerance, the head, the host windows."""
        host = np.ascontiguousarray(self.windows[:HOST_WINDOWS], dtype=np.int64)
        return {"max_kld": self.max_kld, "head": self.head, "windows": hashlib.sha256(host.tobytes()).hexdigest()}


def host_kld(art: Artifact, model: Any, windows: np.ndarray, context: int) -> float:
    """Mean KL(P_float || Q_file) a position over the full vocabulary on ``windows``."""
    import torch

    dec = open_decoder(art, context)
    total, n = 0.0, 0
    for row in windows:
        ids = [int(v) for v in row]
        q = torch.log_softmax(torch.as_tensor(np.asarray(dec.forward(ids, 0), np.float64)), dim=-1)
        with torch.no_grad():
            p = torch.log_softmax(model(torch.as_tensor([ids])).logits[0].double(), dim=-1)
        total += float((p.exp() * (p - q)).sum())
        n += len(ids)
    return total / max(n, 1)


def act_int8(x: Any) -> Any:
    """``x`` rounded as a dynamic int8 activation per token stores it (asymmetric, one scale and zero point a
    row: ExecuTorch's 8da schemes), returned in float."""
    import torch

    lo = x.amin(dim=-1, keepdim=True).clamp(max=0.0)
    hi = x.amax(dim=-1, keepdim=True).clamp(min=0.0)
    scale = ((hi - lo) / 255.0).clamp(min=1e-12)
    zero = torch.round(-128.0 - lo / scale)
    return (torch.clamp(torch.round(x / scale) + zero, -128, 127) - zero) * scale


def fake_quant_kld(
    model: Any, windows: np.ndarray, plan: list[LayerChoice], float_logp: list[Any], *, activations: bool = False
) -> float:
    """``host_kld`` of the PyTorch model with the plan's layers rounded as the file stores them (``activations``:
    their inputs too, as int8 per token)."""
    import torch

    from .layer_plan import fake_quant, linear_layers

    mods = dict(linear_layers(model))
    saved = {}
    hooks = []
    try:
        with torch.no_grad():
            for c in plan:
                if c.kind != "embedding" and c.scheme != "float" and c.name in mods:
                    w = mods[c.name].weight
                    saved[c.name] = w.detach().clone()
                    w.copy_(fake_quant(w.detach().float(), c.scheme, c.group).to(w.dtype))
                    if activations:
                        hooks.append(mods[c.name].register_forward_pre_hook(lambda _m, a: (act_int8(a[0]), *a[1:])))
            total, n = 0.0, 0
            for row, p in zip(windows, float_logp):
                q = torch.log_softmax(model(torch.as_tensor([[int(v) for v in row]])).logits[0].double(), dim=-1)
                total += float((p.exp() * (p - q)).sum())
                n += len(row)
    finally:
        for h in hooks:
            h.remove()
        with torch.no_grad():
            for name, w in saved.items():
                mods[name].weight.copy_(w)
    return total / max(n, 1)


PlanFor = Callable[[set[str], dict[str, str]], list[LayerChoice]]
Make = Callable[[list[LayerChoice], dict[str, Any]], Artifact]


def build_int4(
    model: Any,
    cal: Calibration,
    context: int,
    *,
    plan_for: PlanFor,
    make: Make,
    name: str,
    activations_int8: bool = False,
) -> Artifact:
    """The int4 file by ``plan_for(keep_int8, notes)`` and ``make(plan, account)``, recovered by the ladder: the
    rung picked on the fake-quantized PyTorch model (``activations_int8``: the layers' inputs rounded as int8 per
    token too, as ExecuTorch's 8da4w computes), then lowered once."""
    import torch

    windows = cal.windows[:HOST_WINDOWS]
    plan = plan_for(set(), {})
    int4 = [c.name for c in plan if c.scheme == "int4"]
    if not int4:
        raise ConversionError(
            f"{name}: no layer can be int4: "
            + "; ".join(f"{c.name}: {c.reason}" for c in plan if c.kind != "embedding"),
            hop=f"{name} (int4 layer plan)",
        )
    headline = next(c.label() for c in plan if c.scheme == "int4")
    at_int4 = layer_errors(
        model, windows, plan, schemes={c.name: ("int4", c.group) for c in plan if c.scheme == "int4"}
    )
    ranked = sorted(int4, key=lambda n: -at_int4[n])
    measured_on = f"the first {len(windows)} eval windows of {windows.shape[1]} tokens"
    with torch.no_grad():
        float_logp = [
            torch.log_softmax(model(torch.as_tensor([[int(v) for v in row]])).logits[0].double(), dim=-1)
            for row in windows
        ]
    rungs: list[dict[str, Any]] = []
    lowered: list[dict[str, Any]] = []
    ks = [0] + [k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256) if k <= max(1, len(int4) // 2)]
    for k in ks:
        check_deadline(f"the recovery ladder's rung with {k} layer(s) at int8")
        keep = ranked[:k]
        notes = {
            n: f"kept at int8 by the recovery ladder: sensitivity rank {i + 1} (int4 output error "
            f"{at_int4[n]:.3g} on the text)"
            for i, n in enumerate(keep)
        }
        plan = plan_for(set(keep), notes)
        kld = fake_quant_kld(model, windows, plan, float_logp, activations=activations_int8)
        within = kld <= cal.max_kld
        if within or lowered:  # from the first rung inside on the host, the lowered file decides
            errors = layer_errors(model, windows, plan)
            acc = account(plan, errors, headline=headline, measured_on=measured_on)
            art = make(plan, acc)
            lowered_kld = host_kld(art, model, windows, context)
            lowered.append({"int8_layers": len(keep), "host_kld": round(lowered_kld, 6)})
            within = lowered_kld <= cal.max_kld
        rungs.append({"int8_layers": keep, "host_kld": round(kld, 6), "within": within})
        if within:
            acc = {
                **acc,
                "ladder": rungs,
                "lowered": {"rungs": lowered, "times": len(lowered), "picked_on": PICKED_ON},
                "sensitivity_int4": {n: round(at_int4[n], 6) for n in ranked},
                "host_check": f"mean KLD over the full vocabulary on {measured_on}, tolerance {cal.max_kld}: each "
                "rung on the fake-quantized PyTorch model, the lowered file on its own logits",
            }
            last = art.lineage[-1]
            metrics = {**last.metrics, "quantization": {**last.metrics.get("quantization", {}), **acc}}
            return art.model_copy(update={"lineage": (*art.lineage[:-1], last.model_copy(update={"metrics": metrics}))})
    raise ConversionError(
        f"{name}: int4 misses the KLD tolerance {cal.max_kld} on the host even with the "
        f"{len(rungs[-1]['int8_layers'])} most sensitive layers at int8: "
        + "; ".join(f"{len(r['int8_layers'])} at int8: KLD {r['host_kld']:.4g}" for r in rungs)
        + "".join(f"; lowered with {r['int8_layers']} at int8: KLD {r['host_kld']:.4g}" for r in lowered),
        hop=f"{name} (int4 recovery ladder)",
        hint="keep more layers at int8 (an int8 variant), or raise --max-kld if the loss is acceptable",
    )


PICKED_ON = "the PyTorch model with each rung's weights rounded as the file stores them (layer_plan.fake_quant)"
