"""Memory as the budget on a microcontroller (issue #44 item 6): with training data and the PyTorch architecture, a
full-integer INT8 file whose arena (or flash) does not fit the part is pruned until it does.

The measured quantity is TFLite Micro's arena, found by the interpreter's own bisection (``micro/interpreter.py``),
not a formula. The structured-pruning machinery is the latency budget's (``passes/prune_latency.py``: the prunable
groups, their host-measured accuracy loss per width, ``prune_widths``); what changes is the cost model:

 1. an *arena table*: each prunable group pruned alone to about half its width (no fine-tune), converted to INT8 and
    its arena bisected; the arena bytes and the file bytes it saves per channel removed are that group's slopes;
 2. the plan (:func:`plan_arena`): per-group widths with the least predicted accuracy loss (the sum of each group's
    host-measured loss) whose predicted arena and flash (each measured figure less each pruned group's slope times
    the channels removed) are at most ``PLAN_MARGIN`` of the SRAM and flash budgets; a group whose pruning saves
    nothing of what is over is left whole;
 3. the plan built (pruned, fine-tuned ``RECOVERY_EPOCHS`` on the training data), re-converted to full-integer INT8
    and its arena bisected again. An arena is a peak, not a sum: when the peak moves to another op the prediction
    misses, and the next round plans the missed figure for a target scaled by how far it missed (at most ``ROUNDS``
    rounds).
The file that fits is measured like the unpruned one (TFLM's outputs on the eval set) and the gate judges its TFLM
accuracy and fit."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..formats import Format
from ..inputs.recipe import PassStep, Recipe, VariantSpec
from ..micro.fit import Fit
from ..micro.interpreter import Arena, smallest_arena
from ..passes.base import PassContext
from .steps import build_variants

if TYPE_CHECKING:
    from ..artifact import Artifact
    from ..inputs.data import Dataset
    from .prepare import PreparedRun

Progress = Callable[[str], None]
Convert = Callable[["Artifact", str, "Dataset"], "Artifact"]  # (fp32 ONNX, file stem, calibration) -> INT8 .tflite

PLAN_MARGIN = 0.95  # plan for a predicted arena at 95% of the SRAM budget (the bisection is exact; the plan is not)
ROUNDS = 3  # plans built: the first, then re-planned from how far the measured arena missed the prediction
RECOVERY_EPOCHS = 3  # fine-tune epochs after pruning (tiny models; the caller's data decides the cost)
PROBE_FRACTION = 0.5  # each group's arena probe: pruned alone to this share of its width
FRACTIONS = (0.75, 0.5, 0.25)  # the widths a plan may give a group, as shares of its full width
PROBE_CALIB = 16  # calibration samples of an arena probe (the arena depends on the shapes, not the ranges)
MAX_COMBINATIONS = 20000  # above this many width combinations the plan is greedy (bytes saved per point lost)


def pruning_refusal(run: PreparedRun) -> str | None:
    """Why a model that does not fit cannot be pruned to fit here; None: it can."""
    missing = [x for x, have in (("training data (--train-data)", run.train_ds is not None),
                                 ("the architecture (--arch module:Class)", bool(run.arch))) if not have]
    if missing:
        return (f"{' and '.join(missing)} would open pruning: edgekit would prune channels until TFLite Micro's "
                "arena fits, fine-tune to recover and gate on TFLM's accuracy")
    if run.source.artifact.format != Format.TORCH:
        return ("pruning to fit prunes the PyTorch model, and the source is not one: deploy the .pt2 (or .pth with "
                "--arch) with --train-data")
    return None


def grid(groups: dict[str, int]) -> dict[str, list[int]]:
    """The widths a plan may give each group: ``FRACTIONS`` of its width, at least 1, distinct, below the full one."""
    return {g: ws for g, full in groups.items()
            if (ws := sorted({max(1, int(full * f)) for f in FRACTIONS} - {full}, reverse=True))}


@dataclass(frozen=True)
class Resource:
    """One measured quantity a plan must bring under its target: the arena against SRAM, the flash against flash."""

    name: str  # "arena" | "flash"
    now: int  # bytes, measured on the unpruned INT8 file
    slopes: dict[str, float]  # group -> bytes saved per channel removed (its probe, measured)
    target: float  # bytes the plan aims under

    def predict(self, groups: dict[str, int], ws: dict[str, int]) -> float:
        return self.now - sum(self.slopes.get(g, 0.0) * (groups[g] - w) for g, w in ws.items())


@dataclass
class ArenaPlan:
    widths: dict[str, int]  # the pruned groups only
    predicted: dict[str, int]  # resource -> predicted bytes
    predicted_loss: float
    feasible: bool
    method: str

    def to_dict(self) -> dict[str, Any]:
        return {"widths": self.widths, **{f"predicted_{r}_bytes": b for r, b in self.predicted.items()},
                "predicted_accuracy_loss": round(self.predicted_loss, 4), "feasible": self.feasible,
                "method": self.method}


def plan_arena(resources: list[Resource], loss: dict[str, dict[int, float]], groups: dict[str, int],
               widths: dict[str, list[int]]) -> ArenaPlan:
    """Per-group widths with the least predicted accuracy loss (the sum of each pruned group's) whose predicted bytes
    (each resource's measured bytes less each pruned group's slope times the channels removed) are all under their
    targets; equal loss: the plan that keeps the most channels. Only groups whose pruning saves bytes of a resource
    over its target are options. Nothing meets them: the plan closest to its targets, ``feasible`` False."""
    over = [r for r in resources if r.now > r.target]
    options = {g: [groups[g], *widths.get(g, [])] for g in groups if any(r.slopes.get(g, 0.0) > 0 for r in over)}

    def cost(ws: dict[str, int]) -> tuple[float, float]:
        """(the worst predicted bytes / target, the predicted loss)"""
        worst = max((r.predict(groups, ws) / r.target for r in resources), default=0.0)
        return worst, sum(loss.get(g, {}).get(w, 0.0) for g, w in ws.items() if w != groups[g])

    names = list(options)
    total = 1
    for g in names:
        total *= len(options[g])
    if total <= MAX_COMBINATIONS:
        method = f"exhaustive over {total} combinations"
        scored = [(dict(zip(names, c)), *cost(dict(zip(names, c)))) for c in itertools.product(*options.values())]
        inside = [s for s in scored if s[1] <= 1.0]
        best = (min(inside, key=lambda s: (s[2], -sum(s[0].values()))) if inside
                else min(scored, key=lambda s: (s[1], s[2])))
    else:  # one group a step at a time: the most bytes saved (relative to the targets) per point of accuracy lost
        method = "greedy (bytes saved per point lost)"
        cur = {g: groups[g] for g in names}
        while cost(cur)[0] > 1.0:
            steps = []
            for g in names:
                lower = [w for w in options[g] if w < cur[g]]
                if lower:
                    nxt = {**cur, g: lower[0]}
                    saved = sum(max(r.predict(groups, cur) - r.predict(groups, nxt), 0.0) / r.target for r in over)
                    steps.append((saved / (max(cost(nxt)[1] - cost(cur)[1], 0.0) + 1e-3), nxt))
            if not steps:
                break
            cur = max(steps, key=lambda s: s[0])[1]
        best = (cur, *cost(cur))
    return ArenaPlan(widths={g: w for g, w in best[0].items() if w != groups[g]},
                     predicted={r.name: int(r.predict(groups, best[0])) for r in resources},
                     predicted_loss=float(best[2]), feasible=best[1] <= 1.0, method=method)


@dataclass
class Pruning:
    art: Artifact | None = None  # the pruned, fine-tuned model's full-integer INT8 .tflite that fits; None: none did
    widths: dict[str, int] = field(default_factory=dict)
    record: dict[str, Any] = field(default_factory=dict)  # the report's micro.pruning section


def _ctx(run: PreparedRun) -> PassContext:
    return PassContext(workdir=run.art_dir, calib=run.calib_ds, eval=run.eval_ds, train=run.train_ds,
                       source=run.source, metric_plan=run.plan, arch=run.arch or None)


def _pruned_onnx(run: PreparedRun, ctx: PassContext, name: str, widths: dict[str, int], epochs: int,
                 progress: Progress) -> Artifact:
    """The source pruned to ``widths`` by the ``prune_widths`` pass (its lineage replays it), exported to ONNX."""
    spec = VariantSpec(name=name, passes=[PassStep(name="prune_widths",
                                                   config={"widths": widths, "finetune_epochs": epochs})])
    return build_variants(run.fp32, Recipe(baseline="fp32", variants=[spec]), ctx, progress, source=run.source,
                          cache=run.cache)[name]


def _few(ds: Dataset, n: int) -> Dataset:
    return dataclasses.replace(ds, xs=tuple(x[:n] for x in ds.xs), y=None if ds.y is None else ds.y[:n])


def prune_to_fit(run: PreparedRun, fit: Fit, convert: Convert, progress: Progress,
                 judge: Callable[[Arena, int], Fit]) -> Pruning:
    """Prune the source until its INT8 file's TFLM arena (and flash) fit; ``art`` None when the model has no
    prunable group or no plan fits in ``ROUNDS`` rounds (``record`` says why). ``judge(arena, model_bytes)`` is the
    part's fit of a measured file."""
    from ..passes import _torch as T  # heavy: torch
    from ..passes.prune_latency import group_sensitivity, prunable_groups

    calib = run.calib_ds or run.eval_ds
    assert run.train_ds is not None and run.arch  # pruning_refusal() said None
    rec: dict[str, Any] = {"measured": "TFLite Micro's arena, bisected by the interpreter on each INT8 file",
                           "arena_before_bytes": fit.arena, "flash_before_bytes": fit.flash,
                           "sram_budget_bytes": fit.sram_budget, "flash_budget_bytes": fit.flash_budget}
    out = Pruning(record=rec)
    with T.torch_threads(1):
        model = T.module_from_arch(run.arch, T.load_program(run.source.artifact), "source")
        example = T.example_input(run.source.artifact.io, 1)
        found = prunable_groups(model, example)
        if not found:
            rec["stopped"] = f"{run.arch} has no prunable group (no conv or linear layer whose outputs feed another)"
            return out
        groups = {g.name: g.width for g in found}
        widths = grid(groups)
        progress(f"host sensitivity of {len(widths)} groups at {sum(map(len, widths.values()))} widths")
        loss = group_sensitivity(model, example, found, widths, run.train_ds)
    rec["groups"] = groups
    rec["sensitivity"] = {"data": "the training data, no fine-tune (host, top-1 points lost)",
                          "loss": {g: {str(w): v for w, v in ws.items()} for g, ws in loss.items()}}
    ctx = _ctx(run)
    arena_slopes: dict[str, float] = {}
    flash_slopes: dict[str, float] = {}
    table: dict[str, Any] = {}
    for g, full in groups.items():
        w = max(1, int(full * PROBE_FRACTION))
        if w >= full:
            continue
        progress(f"arena probe: {g} at {w} of {full} channels")
        onnx = _pruned_onnx(run, ctx, f"arena-probe-{len(table)}", {g: w}, 0, progress)
        probe = convert(onnx, f"arena-probe-{len(table)}", _few(calib, PROBE_CALIB))
        probed = smallest_arena(probe.path).bytes
        arena_slopes[g] = (fit.arena - probed) / (full - w)
        flash_slopes[g] = (fit.model_bytes - probe.size_bytes) / (full - w)
        table[g] = {"width": w, "full": full, "arena_bytes": probed, "model_bytes": probe.size_bytes,
                    "arena_bytes_per_channel": round(arena_slopes[g], 2),
                    "flash_bytes_per_channel": round(flash_slopes[g], 2)}
    rec["arena_table"] = table
    rec["left_whole"] = {g: f"pruning {g} alone to {t['width']} channels did not shrink the arena (the peak is "
                            "elsewhere)" for g, t in table.items() if arena_slopes[g] <= 0 and not fit.sram_ok}
    targets = {"arena": fit.sram_budget * PLAN_MARGIN, "flash": fit.flash_budget * PLAN_MARGIN}
    rec["rounds"] = []
    tried: list[dict[str, int]] = []
    for round_no in range(1, ROUNDS + 1):
        resources = [Resource("arena", fit.arena, arena_slopes, targets["arena"]),
                     Resource("flash", fit.flash, flash_slopes, targets["flash"])]
        plan = plan_arena(resources, loss, groups, widths)
        rnd: dict[str, Any] = {"round": round_no, "target_arena_bytes": int(targets["arena"]),
                               "target_flash_bytes": int(targets["flash"]), "plan": plan.to_dict()}
        rec["rounds"].append(rnd)
        if not plan.widths or plan.widths in tried:
            rnd["stopped"] = ("no group's pruning shrinks what is over" if not plan.widths
                              else "the re-planned widths are the ones already built")
            break
        tried.append(plan.widths)
        progress(f"pruning to {plan.widths}: predicted arena {plan.predicted['arena']} B, flash "
                 f"{plan.predicted['flash']} B; fine-tuning {RECOVERY_EPOCHS} epochs")
        stem = f"tflm-int8-pruned-r{round_no}"
        onnx = _pruned_onnx(run, ctx, stem, plan.widths, RECOVERY_EPOCHS, progress)
        art = convert(onnx, stem, calib)
        got = judge(smallest_arena(art.path), art.size_bytes)
        measured = {"arena": got.arena, "flash": got.flash}
        rnd.update({"arena_bytes": got.arena, "flash_bytes": got.flash, "fits": got.fits,
                    "prediction_error": {r: round(measured[r] / max(plan.predicted[r], 1) - 1, 4)
                                         for r in measured}})
        if got.fits:
            rec.update({"widths": plan.widths, "arena_after_bytes": got.arena, "flash_after_bytes": got.flash})
            out.art, out.widths = art, plan.widths
            return out
        # the peak moved (an arena is a peak, not a sum): plan the missed resource for a target scaled by the miss
        for r, ok in (("arena", got.sram_ok), ("flash", got.flash_ok)):
            if not ok:
                targets[r] /= max(measured[r] / max(plan.predicted[r], 1), 1.0 + 1e-3)
    rec["stopped"] = rec["rounds"][-1].get("stopped") or f"no plan fit in {ROUNDS} rounds"
    return out
