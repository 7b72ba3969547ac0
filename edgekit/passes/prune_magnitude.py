"""Unstructured magnitude pruning: the smallest weights of conv and linear layers set to zero.

Honest note (also in the lineage): zeros in dense tensors do not make a dense runtime faster and
do not shrink the model file; they shrink the *compressed* size (what a download or an OTA update
carries). The pass records both sizes so the report shows exactly that.
"""

from __future__ import annotations

import zlib


from pydantic import BaseModel, ConfigDict, Field

from ..formats import Format
from .base import PassContext, PassOutput, TorchPass

NOTE = ("unstructured sparsity shrinks the compressed size, not dense latency: dense runtimes "
        "(onnxruntime, LiteRT CPU) compute the zeros; use prune_structured for speed")


class MagnitudePruneConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sparsity: float = Field(0.5, gt=0, lt=1, description="fraction of each layer's weights set to zero")
    scope: str = Field("layer", pattern="^(layer|global)$",
                       description="layer: the same fraction in every layer; global: one threshold for all")
    min_elements: int = Field(64, ge=1, description="tensors smaller than this are left dense (biases, norms)")
    threads: int | None = Field(1, ge=1, description="torch threads (None: torch default); tiny models are fastest on 1")


def compressed_size(path) -> int:
    with open(path, "rb") as fh:
        return len(zlib.compress(fh.read(), 6))


class MagnitudePrune(TorchPass):
    name = "prune_magnitude"
    Config = MagnitudePruneConfig

    def run_torch(self, artifact, config: MagnitudePruneConfig, ctx: PassContext, stem: str) -> PassOutput:
        import torch

        from . import _torch as T  # heavy: torch

        ep = T.load_program(artifact)
        # weights of convs and linears: 2-D or 4-D parameters
        targets = {k: v for k, v in ep.state_dict.items()
                   if isinstance(v, torch.nn.Parameter | torch.Tensor) and v.dim() in (2, 4)
                   and v.numel() >= config.min_elements and v.is_floating_point()}
        before_acc = T.accuracy(ep.module(), ctx.eval)
        if config.scope == "global" and targets:
            allw = torch.cat([v.detach().abs().flatten() for v in targets.values()])
            k = int(config.sparsity * allw.numel())
            thr = allw.kthvalue(max(k, 1)).values
        zeroed, total = 0, 0
        per_layer = {}
        with torch.no_grad():
            for name, w in targets.items():
                if config.scope == "layer":
                    k = int(config.sparsity * w.numel())
                    if k == 0:
                        continue
                    thr = w.abs().flatten().kthvalue(k).values
                mask = w.abs() <= thr
                w.masked_fill_(mask, 0.0)
                per_layer[name] = round(float(mask.float().mean()), 4)
                zeroed += int(mask.sum())
                total += w.numel()
        out = ctx.workdir / f"{stem}.pt2"
        T.save_ep(ep, out)
        metrics = {
            "sparsity": round(zeroed / total, 4) if total else 0.0,
            "per_layer": per_layer,
            "size_bytes": {"before": artifact.size_bytes, "after": out.stat().st_size},
            "compressed_size_bytes": {"before": compressed_size(artifact.path), "after": compressed_size(out)},
            "accuracy": {"before": before_acc, "after": T.accuracy(torch.export.load(str(out)).module(), ctx.eval)},
            "note": NOTE,
        }
        return PassOutput(path=out, precision="fp32", metrics=metrics, fmt=Format.TORCH)
