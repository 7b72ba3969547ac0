"""Structured pruning to chosen per-group widths (the latency-aware search's model transform, issue #46).

Torch-Pruning's dependency graph finds the *groups*: the channels that must go together (a conv's outputs,
the batch norm after it, the next layer's inputs, both sides of a residual add, a depthwise conv's
channels). A group is named by its root module (``features.0``) and has a width (its channel count).
:func:`prune_to_widths` removes, in each named group, the channels of least weight magnitude until the
group has the width asked; the pass ``prune_widths`` does that and then fine-tunes briefly. Its config
says exactly which width each group got, so the lineage replays it.

The widths are chosen elsewhere (``variant_search/budget.py``), from what each width costs on the device
(``variant_search/latency_table.py``) and what it costs in accuracy on the host (:func:`group_sensitivity`).
The classifier's outputs (the classes) are never pruned.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from ..errors import BadInputError, PassError
from ..formats import Format
from .base import PassContext, PassOutput, TorchPass

if TYPE_CHECKING:
    from ..artifact import Artifact
    from ..inputs.data import Dataset


@dataclass(frozen=True)
class Group:
    """A set of channels that are pruned together, named by its root module, with its full width."""

    name: str
    width: int
    kind: str  # the root module's type (Conv2d, Linear...)


def _classifier(model: Any) -> Any:
    """The last conv or linear layer: its outputs are the classes, never pruned."""
    import torch

    layers = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]
    return layers[-1] if layers else None


def _graph(model: Any, example: tuple[Any, ...]) -> Any:
    import torch_pruning as tp

    try:
        # the ignored layers are left out of the groups' roots only (get_all_groups): the graph must still
        # shrink the classifier's inputs when the layer before it is pruned
        return tp.DependencyGraph().build_dependency(model, example_inputs=example, verbose=False)
    except Exception as exc:  # Torch-Pruning's tracing fails on some exotic ops: name it
        raise PassError(f"Torch-Pruning could not trace the model's channel dependencies: {type(exc).__name__}: "
                        f"{exc}", hint="leave the failing layer out with ignored_layers") from exc


def _ignored(model: Any, names: list[str]) -> list[Any]:
    mods = dict(model.named_modules())
    unknown = [n for n in names if n not in mods]
    if unknown:
        raise BadInputError(f"ignored_layers {unknown} are not modules of the model",
                            hint=f"module names: {', '.join(n for n in mods if n)[:400]}")
    last = _classifier(model)
    return [mods[n] for n in names] + ([last] if last is not None else [])


def _groups_by_name(model: Any, dg: Any, ignored: list[Any]) -> dict[str, tuple[Any, int, str]]:
    names = {id(m): n for n, m in model.named_modules()}
    out: dict[str, tuple[Any, int, str]] = {}
    for g in dg.get_all_groups(ignored_layers=ignored):
        root = g[0].dep.target.module
        width = dg.get_out_channels(root)
        if width is None or width < 2 or id(root) not in names:
            continue
        out[names[id(root)]] = (g, int(width), type(root).__name__)
    return out


def prunable_groups(model: Any, example: tuple[Any, ...], ignored_layers: list[str] | None = None) -> list[Group]:
    """The model's prunable groups, in graph order (a model without any is refused by the caller)."""
    ignored = _ignored(model, ignored_layers or [])
    dg = _graph(model, example)
    return [Group(n, w, k) for n, (_g, w, k) in _groups_by_name(model, dg, ignored).items()]


def prune_to_widths(model: Any, example: tuple[Any, ...], widths: dict[str, int],
                    ignored_layers: list[str] | None = None) -> dict[str, int]:
    """Prune ``model`` in place so each named group has the width asked (least-L2-magnitude channels go);
    returns the widths it now has. An unknown group name or a width outside 1..full is a bad input."""
    import torch
    import torch_pruning as tp

    ignored = _ignored(model, ignored_layers or [])
    dg = _graph(model, example)
    groups = _groups_by_name(model, dg, ignored)
    unknown = sorted(set(widths) - set(groups))
    if unknown:
        raise BadInputError(f"widths name groups the model does not have: {unknown}",
                            hint=f"prunable groups (root module: width): "
                            f"{', '.join(f'{n}: {w}' for n, (_g, w, _k) in groups.items())[:400]}")
    imp = tp.importance.GroupMagnitudeImportance(p=2)
    names = {id(m): n for n, m in model.named_modules()}
    done: dict[str, int] = {}
    # lazily: each group is traced after the previous one was pruned (a group listed before goes stale)
    for group in dg.get_all_groups(ignored_layers=ignored):
        name = names.get(id(group[0].dep.target.module))
        if name not in groups:
            continue
        full = groups[name][1]
        want = widths.get(name, full)
        if not 1 <= want <= full:
            raise BadInputError(f"width {want} for group {name} is outside 1..{full}")
        if want < full:
            scores = imp(group)
            group.prune(idxs=torch.argsort(scores)[: full - want].tolist())
        done[name] = want
    return done


def group_sensitivity(model: Any, example: tuple[Any, ...], groups: list[Group], grid: dict[str, list[int]],
                      data: Dataset, ignored_layers: list[str] | None = None) -> dict[str, dict[int, float]]:
    """The host-measured accuracy loss (top-1 points, no fine-tune) of pruning each group alone to each width of
    its grid, on ``data`` (a held-out part of the training data: the eval set is the gate's)."""
    from . import _torch as T  # heavy: torch

    base = T.accuracy(model.eval(), data) or 0.0
    out: dict[str, dict[int, float]] = {}
    for g in groups:
        out[g.name] = {}
        for w in grid.get(g.name, []):
            m = copy.deepcopy(model)
            prune_to_widths(m, example, {g.name: w}, ignored_layers)
            out[g.name][w] = round(base - (T.accuracy(m.eval(), data) or 0.0), 4)
    return out


@dataclass(frozen=True)
class ParamModel:
    """The model's parameter count at any per-group widths, exactly, without pruning it again: each tensor axis
    that a group's pruning shrinks loses ``slope`` entries per channel of the group removed (1 for a conv's
    channels, H*W for a linear layer after a flatten), found once by pruning each group alone; an axis belongs to
    at most one group, so the count of any combination is the product of its axes' sizes, summed over tensors."""

    shapes: dict[str, tuple[int, ...]]  # every floating tensor of the state dict at full width
    slopes: dict[str, dict[int, tuple[str, float]]]  # tensor -> axis -> (group, entries per channel removed)
    groups: dict[str, int]  # group -> full width

    def params(self, widths: dict[str, int]) -> int:
        total = 0
        for name, shape in self.shapes.items():
            n = 1
            for axis, size in enumerate(shape):
                g, slope = self.slopes.get(name, {}).get(axis, ("", 0.0))
                n *= max(int(round(size - slope * (self.groups.get(g, 0) - widths.get(g, self.groups.get(g, 0))))),
                         0)
            total += n
        return total


def param_model(model: Any, example: tuple[Any, ...], groups: list[Group], grid: dict[str, list[int]],
                ignored_layers: list[str] | None = None) -> ParamModel:
    """:class:`ParamModel` of ``model``: each group pruned alone (on a copy) to its narrowest width of ``grid``."""
    shapes = {n: tuple(int(d) for d in t.shape) for n, t in model.state_dict().items() if t.is_floating_point()}
    slopes: dict[str, dict[int, tuple[str, float]]] = {}
    for g in groups:
        w = min(grid.get(g.name) or [g.width - 1])
        m = copy.deepcopy(model)
        prune_to_widths(m, example, {g.name: w}, ignored_layers)
        after = m.state_dict()
        for name, shape in shapes.items():
            for axis, (a, b) in enumerate(zip(shape, after[name].shape)):
                if a != int(b):
                    slopes.setdefault(name, {})[axis] = (g.name, (a - int(b)) / (g.width - w))
    return ParamModel(shapes=shapes, slopes=slopes, groups={g.name: g.width for g in groups})


class PruneWidthsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    widths: dict[str, int] = Field(description="group (its root module's name) -> channels kept; other groups stay")
    arch: str | None = Field(None, description="module:Class the .pt2 was exported from (default: --arch)")
    ignored_layers: list[str] = Field(default_factory=list,
                                      description="module names never pruned (the classifier is always kept)")
    finetune_epochs: int = Field(3, ge=0)
    lr: float = Field(1e-3, gt=0)
    batch_size: int = Field(64, ge=1)
    seed: int = 0
    threads: int | None = Field(1, ge=1, description="torch threads (None: torch default); tiny models: 1")


class PruneWidths(TorchPass):
    name = "prune_widths"
    Config = PruneWidthsConfig

    def run_torch(self, artifact: Artifact, config: PruneWidthsConfig, ctx: PassContext, stem: str) -> PassOutput:
        from . import _torch as T  # heavy: torch
        from .prune_structured import finetune

        arch = config.arch or ctx.arch
        if not arch:
            raise PassError("pruning to widths rebuilds the model as an nn.Module and needs its architecture",
                            hint="set arch: module:Class in the pass config (or pass --arch)")
        train = T.require_train(ctx.train, "the fine-tune after pruning") if config.finetune_epochs else ctx.train
        model = T.module_from_arch(arch, T.load_program(artifact), "input")
        before = {**T.count(model, artifact.io), "accuracy": T.accuracy(model.eval(), ctx.eval)}
        widths = prune_to_widths(model, T.example_input(artifact.io, 1), config.widths, config.ignored_layers)
        pruned_acc = T.accuracy(model.eval(), ctx.eval)
        history: list[float] = []
        if config.finetune_epochs and train is not None:
            history = finetune(model, train, config.finetune_epochs, config.lr, config.batch_size, config.seed)
        out = ctx.workdir / f"{stem}.pt2"
        io = T.save_program(model, artifact.io, out)
        after = {**T.count(model, artifact.io), "size_bytes": out.stat().st_size,
                 "accuracy": T.accuracy(model.eval(), ctx.eval)}
        metrics = {"widths": widths, "before": before, "after_prune_accuracy": pruned_acc, "after": after,
                   "macs_ratio": round(int(after["macs"] or 0) / max(int(before["macs"] or 0), 1), 4),
                   "params_ratio": round(int(after["params"] or 0) / max(int(before["params"] or 0), 1), 4),
                   "finetune": {"epochs": config.finetune_epochs, "loss": history}}
        return PassOutput(path=out, precision="fp32", metrics=metrics, fmt=Format.TORCH, io=io)
