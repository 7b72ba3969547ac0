"""Structured channel pruning with dependency tracking (Torch-Pruning): channels are really removed
(smaller convs and linears, fewer MACs), then a short fine-tune on the training data.

Whether it is faster is decided by the latency the agent measures on the device, not by the MAC
count; the pass records params, MACs and file size before and after so the report can show both.
Needs the model as an nn.Module: ``arch: module:Class`` (weights come from the .pt2).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..errors import PassError
from ..formats import Format
from ..timeline import check_deadline, epoch_done
from .base import PassContext, PassOutput, TorchPass


class StructuredPruneConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sparsity: float = Field(0.5, gt=0, lt=1, description="fraction of channels removed in each prunable layer")
    arch: str | None = Field(None, description="module:Class the .pt2 was exported from (default: --arch)")
    importance: str = Field("l2", pattern="^(l1|l2)$", description="channel importance: weight-magnitude norm")
    ignored_layers: list[str] = Field(default_factory=list,
                                      description="module names never pruned (the classifier is always kept)")
    round_to: int | None = Field(None, ge=1, description="keep channel counts a multiple of this (SIMD-friendly)")
    finetune_epochs: int = Field(5, ge=0)
    lr: float = Field(1e-3, gt=0)
    batch_size: int = Field(64, ge=1)
    seed: int = 0
    threads: int | None = Field(1, ge=1, description="torch threads (None: torch default); tiny models are fastest on 1")


class StructuredPrune(TorchPass):
    name = "prune_structured"
    Config = StructuredPruneConfig

    def run_torch(self, artifact, config: StructuredPruneConfig, ctx: PassContext, stem: str) -> PassOutput:
        import torch
        import torch_pruning as tp

        from . import _torch as T  # heavy: torch

        arch = config.arch or ctx.arch
        if not arch:
            raise PassError("structured pruning rebuilds the model as an nn.Module and needs its architecture",
                            hint="set arch: module:Class in the pass config (or pass --arch); the weights come "
                            "from the .pt2")
        train = T.require_train(ctx.train, "the fine-tune after structured pruning") if config.finetune_epochs else ctx.train
        ep = T.load_program(artifact)
        model = T.module_from_arch(arch, ep, "input")
        before = {**T.count(model, artifact.io), "size_bytes": artifact.size_bytes,
                  "accuracy": T.accuracy(model.eval(), ctx.eval)}
        example = T.example_input(artifact.io, 1)
        names = dict(model.named_modules())
        unknown = [n for n in config.ignored_layers if n not in names]
        if unknown:
            raise PassError(f"ignored_layers {unknown} are not modules of {arch}",
                            hint=f"module names: {', '.join(n for n in names if n)[:400]}")
        ignored = [names[n] for n in config.ignored_layers]
        # the classifier's outputs are the classes: never prune them
        last = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]
        if last:
            ignored.append(last[-1])
        imp = tp.importance.MagnitudeImportance(p=1 if config.importance == "l1" else 2)
        try:
            pruner = tp.pruner.MagnitudePruner(model, example, importance=imp, pruning_ratio=config.sparsity,
                                               ignored_layers=ignored, round_to=config.round_to)
            pruner.step()
        except Exception as exc:  # torch-pruning's graph tracing fails on some exotic ops
            raise PassError(f"Torch-Pruning could not prune {arch}: {type(exc).__name__}: {exc}",
                            hint="add the failing layer to ignored_layers") from exc
        pruned = {**T.count(model, artifact.io), "accuracy": T.accuracy(model.eval(), ctx.eval)}
        history = []
        if config.finetune_epochs:
            history = finetune(model, train, config.finetune_epochs, config.lr, config.batch_size, config.seed)
        out = ctx.workdir / f"{stem}.pt2"
        io = T.save_program(model, artifact.io, out)
        after = {**T.count(model, artifact.io), "size_bytes": out.stat().st_size,
                 "accuracy": T.accuracy(model.eval(), ctx.eval)}
        metrics = {
            "before": before, "after_prune": pruned, "after": after,
            "params_ratio": round(after["params"] / before["params"], 4),
            "macs_ratio": round(after["macs"] / before["macs"], 4),
            "finetune": {"epochs": config.finetune_epochs, "loss": history,
                         "train_data": str(train.path) if train is not None else None},
            "note": "fewer MACs do not always mean lower latency: the latency measured on the device decides",
        }
        return PassOutput(path=out, precision="fp32", metrics=metrics, fmt=Format.TORCH, io=io)


def finetune(model, train, epochs: int, lr: float, batch_size: int, seed: int) -> list[float]:
    """Plain cross-entropy fine-tune; returns the mean loss of each epoch."""
    import torch

    from . import _torch as T  # heavy: torch

    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for epoch in range(epochs):
        model.train()
        total, n = 0.0, 0
        for xs, y in T.batches(train, batch_size, gen):
            check_deadline("pruning fine-tune")
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(*xs), y)
            loss.backward()
            opt.step()
            total += loss.item() * len(y)
            n += len(y)
        losses.append(round(total / max(n, 1), 5))
        epoch_done("fine-tune", epoch + 1, epochs)
    model.eval()
    return losses
