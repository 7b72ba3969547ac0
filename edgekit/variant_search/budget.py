"""A latency budget as a goal (issue #46): with training data and the architecture, the search changes the model
until the budget holds on the device, and ships the most accurate variant inside the gate whose measured p50's
95% CI upper bound meets it.

When no finalist of the encoding race meets the budget, the search:
 1. takes the encoding that will ship (the fastest finalist inside the accuracy tolerance) and measures on the
    device what each prunable group's widths buy in it (``latency_table.py``);
 2. measures on the host what each width costs in accuracy (``passes/prune_latency.group_sensitivity``);
 3. chooses per-group widths (:func:`plan_widths`): the least predicted accuracy loss whose predicted p50 is
    under ``PLAN_MARGIN`` of the budget, from the widths that pay on the device only;
 4. builds two students of that shape through the same encoding: fine-tuned only, and distilled from the
    source model for the same epochs, measures both like any finalist, and lets the gate and the budget judge.
Without a budget the objective decides as before; a budget nothing meets is a failed gate that names the closest
measured point. The record (table, plan, predicted beside measured, the frontier) goes to the report's search
section as ``budget``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..devices.session import MeasureFailure
from ..errors import BadInputError, DataError
from ..formats import Format
from ..inputs.recipe import PassStep, Recipe, VariantSpec
from ..orchestration.assemble import score
from ..orchestration.steps import build_variants
from ..passes.base import PassContext
from ..report.gate import evaluate_gate
from .choice import BASE, Candidate
from .latency_table import LatencyTable, measure_table

if TYPE_CHECKING:
    from ..devices.session import DeviceSession, Measured, RunSettings
    from ..orchestration.options import DeployOptions
    from ..orchestration.prepare import PreparedRun
    from ..report.model import VariantResult

PLAN_MARGIN = 0.9  # plan for a predicted p50 at 90% of the budget: the measured CI's upper bound is what is judged
RECOVERY_EPOCHS = 3  # fine-tune and distillation epochs of each student (tiny models; the time budget cuts more)
REFINE_ROUNDS = 3  # plans measured: the first, then re-planned from how far the measured p50 missed the prediction
MAX_COMBINATIONS = 20000  # above this many width combinations the plan is greedy (NetAdapt's step), else exhaustive
FRACTIONS = (0.75, 0.5, 0.25)  # of each group's width, rounded down to the quantum
STUDENTS = ("finetuned", "distilled")


@dataclass
class BudgetGoal:
    latency_ms: float
    arch: str
    groups: dict[str, int]  # prunable group -> full width
    epochs: int = RECOVERY_EPOCHS
    record: dict[str, Any] = field(default_factory=dict)  # what the report's search section carries as `budget`

    def meets(self, v: VariantResult) -> bool:
        """The measured p50's 95% CI upper bound is inside the budget (a lucky run does not pass)."""
        lat = v.latency_ms
        return lat is not None and upper(v) <= self.latency_ms

    def choose(self, qualified: list[VariantResult]) -> VariantResult | None:
        """The most accurate of the qualified files inside the budget; equal accuracy: the faster p50."""
        inside = [v for v in qualified if self.meets(v)]
        if not inside:
            return None

        def acc(v: VariantResult) -> float:
            a = v.accuracy
            return 0.0 if a is None else (-a.value if a.direction == "lower" else a.value)

        return max(inside, key=lambda v: (acc(v), -(v.latency_ms.p50 if v.latency_ms else 0.0), v.name))

    def over(self, v: VariantResult) -> str:
        """Why a file inside the gate misses the budget as a goal, in words."""
        p50 = v.latency_ms.p50 if v.latency_ms is not None else float("nan")
        return (f"p50 {p50:.4g} ms, its 95% CI upper bound {upper(v):.4g} ms is over the {self.latency_ms:g} ms "
                "latency budget")

    def closest(self, measured: list[VariantResult]) -> str:
        """The measured point closest to the budget (the fastest by its CI's upper bound), in words."""
        timed = [v for v in measured if v.latency_ms is not None]
        if not timed:
            return "no point was measured"
        v = min(timed, key=upper)
        acc = f"{v.accuracy.metric} {v.accuracy.value:.4g}" if v.accuracy is not None else "accuracy not measured"
        return (f"the closest measured point is {v.name}: p50 {v.latency_ms.p50:.4g} ms (95% CI upper "  # type: ignore[union-attr]
                f"{upper(v):.4g} ms) against the {self.latency_ms:g} ms budget, {acc}")


def upper(v: VariantResult) -> float:
    lat = v.latency_ms
    if lat is None:
        return float("inf")
    return float(lat.ci95[1]) if lat.ci95 else float(lat.p50)


def budget_goal(run: PreparedRun, opts: DeployOptions) -> BudgetGoal | None:
    """The budget as a goal when the run has a latency budget, training data and the architecture; checks the
    training data and the model before any work (exit 2). None: the budget stays a gate check."""
    budget = run.gate.latency_ms_p50
    if budget is None or run.train_ds is None or not run.arch:
        return None
    if run.source.artifact.format != Format.TORCH:
        raise BadInputError("a latency budget with --train-data prunes the PyTorch model, and the source is not one",
                            hint="deploy the .pt2 (or .pth with --arch), or drop --train-data to keep the budget a "
                            "gate check")
    _check_classes(run)
    from ..passes import _torch as T  # heavy: torch
    from ..passes.prune_latency import prunable_groups

    model = T.module_from_arch(run.arch, T.load_program(run.source.artifact), "source")
    groups = prunable_groups(model, T.example_input(run.source.artifact.io, 1))
    if not groups:
        raise BadInputError(f"a latency budget with --train-data prunes channels, and {run.arch} has no prunable "
                            "group (no conv or linear layer whose outputs feed another layer)",
                            hint="drop --train-data to keep the budget a gate check, or give a model with hidden "
                            "conv/linear layers")
    return BudgetGoal(latency_ms=float(budget), arch=run.arch, groups={g.name: g.width for g in groups})


def _check_classes(run: PreparedRun) -> None:
    """Training labels must be classes the model predicts (before any training)."""
    import numpy as np

    ds = run.train_ds
    outs = run.source.artifact.io.outputs
    if ds is None or ds.y is None or not outs or not outs[0].shape:
        return
    classes = outs[0].shape[-1]
    y = np.asarray(ds.y).reshape(ds.n, -1)[:, 0]
    if y.dtype.kind not in "iu" and not np.all(np.equal(np.mod(y, 1), 0)):
        raise DataError(f"training labels in {ds.path} are not class indices (dtype {y.dtype})",
                        hint="y must hold integer class indices")
    if classes is not None and len(y) and (int(y.min()) < 0 or int(y.max()) >= int(classes)):
        raise DataError(f"training labels in {ds.path} run {int(y.min())}..{int(y.max())}, but the model predicts "
                        f"{classes} classes (0..{int(classes) - 1})",
                        hint="give training data labelled for this model's classes")


def width_grid(groups: dict[str, int]) -> dict[str, list[int]]:
    """The widths tried per group: FRACTIONS of the full width rounded down to a SIMD-friendly quantum (8 channels
    from 32 up, 4 from 8, else 1), distinct and below the full width."""
    out: dict[str, list[int]] = {}
    for g, full in groups.items():
        q = 8 if full >= 32 else 4 if full >= 8 else 1
        ws = sorted({max(q, int(full * f) // q * q) for f in FRACTIONS} - {full}, reverse=True)
        if ws:
            out[g] = ws
    return out


@dataclass
class Plan:
    widths: dict[str, int]  # the pruned groups only
    predicted_ms: float
    predicted_loss: float
    feasible: bool
    unpaid: dict[str, str]  # groups left whole because no width of theirs is faster on the device, and why
    method: str

    def to_dict(self) -> dict[str, Any]:
        return {"widths": self.widths, "predicted_p50_ms": round(self.predicted_ms, 6),
                "predicted_accuracy_loss": round(self.predicted_loss, 4), "feasible": self.feasible,
                "left_unpruned": self.unpaid, "method": self.method}


def plan_widths(table: LatencyTable, loss: dict[str, dict[int, float]], groups: dict[str, int],
                target_ms: float) -> Plan:
    """Per-group widths with the least predicted accuracy loss (the sum of each group's host-measured loss) whose
    predicted p50 is at most ``target_ms``; only widths that pay on the device are options. Nothing meets it:
    the fastest prediction, ``feasible`` False."""
    options: dict[str, list[int]] = {}
    unpaid: dict[str, str] = {}
    for g, full in groups.items():
        paying = [w for w in sorted(table.points.get(g, {}), reverse=True) if table.pays(g, w)]
        options[g] = [full, *paying]
        if table.points.get(g) and not paying:
            unpaid[g] = (f"no width of {g} is clearly faster on the device than the whole model (base p50 "
                         f"{table.base.p50:.4g} ms, 95% CI [{table.base.ci95[0]:.4g}, {table.base.ci95[1]:.4g}]; "
                         + ", ".join(f"{w}: {p.p50:.4g} ms" for w, p in sorted(table.points[g].items())) + ")")

    def cost(ws: dict[str, int]) -> tuple[float, float]:
        pruned = {g: w for g, w in ws.items() if w != groups[g]}
        return table.predict(pruned), sum(loss.get(g, {}).get(w, 0.0) for g, w in pruned.items())

    names = list(options)
    total = 1
    for g in names:
        total *= len(options[g])
    if total <= MAX_COMBINATIONS:
        method = f"exhaustive over {total} combinations"
        scored = [(dict(zip(names, c)), *cost(dict(zip(names, c)))) for c in itertools.product(*options.values())]
        inside = [s for s in scored if s[1] <= target_ms]
        best = (min(inside, key=lambda s: (s[2], s[1])) if inside else min(scored, key=lambda s: (s[1], s[2])))
    else:  # NetAdapt's greedy step: the next width with the most latency saved per point of accuracy lost
        method = "greedy (latency saved per point lost)"
        cur = {g: groups[g] for g in names}
        while cost(cur)[0] > target_ms:
            steps = []
            for g in names:
                lower = [w for w in options[g] if w < cur[g]]
                if lower:
                    nxt = {**cur, g: lower[0]}
                    d_lat = cost(cur)[0] - cost(nxt)[0]
                    d_loss = max(cost(nxt)[1] - cost(cur)[1], 0.0)
                    steps.append((d_lat / (d_loss + 1e-3), nxt))
            if not steps:
                break
            cur = max(steps, key=lambda s: s[0])[1]
        best = (cur, *cost(cur))
    widths = {g: w for g, w in best[0].items() if w != groups[g]}
    return Plan(widths=widths, predicted_ms=best[1], predicted_loss=best[2], feasible=best[1] <= target_ms,
                unpaid=unpaid, method=method)


def _accuracy_ok(run: PreparedRun, final: dict[str, Measured], name: str) -> bool:
    g = evaluate_gate([final[BASE].result, final[name].result], BASE, run.gate, judged=[name])
    return all(c.passed for c in g.checks if c.name == "accuracy_drop")


def _ctx(run: PreparedRun) -> PassContext:
    return PassContext(workdir=run.art_dir, calib=run.calib_ds, eval=run.eval_ds, train=run.train_ds,
                       source=run.source, metric_plan=run.plan, arch=run.arch or None, teacher=run.source.artifact)


def extend_for_budget(goal: BudgetGoal, st: Any, session: DeviceSession, final: dict[str, Measured],
                      settings: RunSettings) -> None:
    """When no finalist meets the budget: the table, the plan, the two students, measured and added to ``final``
    and ``st.cands`` (the selection judges them like every finalist). Fills ``goal.record``."""
    run, progress = st.run, st.progress
    score(final, run.plan, BASE, run.gate)
    rec = goal.record
    rec.update({"latency_budget_ms": goal.latency_ms, "judged_on": "the p50's 95% CI upper bound",
                "groups": goal.groups})
    met = [n for n, m in final.items() if _accuracy_ok(run, final, n) and goal.meets(m.result)]
    if met:
        rec["pruning"] = f"not needed: {', '.join(met)} already meet the budget inside the accuracy tolerance"
        rec["frontier"] = frontier(final, goal)
        return
    if st.clock.remaining() <= 0:  # the table and the students' training would run past --time-budget
        rec["pruning"] = (f"not tried: the {st.clock.budget_s:g} s time budget was spent before it "
                          "(--time-budget raises it)")
        rec["frontier"] = frontier(final, goal)
        return
    inside = [n for n in final if _accuracy_ok(run, final, n)]
    enc = min(inside or [BASE], key=lambda n: upper(final[n].result))
    encoding: list[PassStep] = next((c.spec.passes for c in st.cands if c.name == enc), [])
    rec["encoding"] = enc
    ctx = _ctx(run)
    grid = width_grid(goal.groups)
    with st.clock.span("budget", "latency table"):
        table = measure_table(session, run, ctx, encoding_name=enc, encoding=list(encoding), grid=grid,
                              settings=settings, progress=progress)
    rec["latency_table"] = table.to_dict()
    with st.clock.span("budget", "sensitivity"):
        progress(f"host sensitivity of {len(grid)} groups at {sum(map(len, grid.values()))} widths")
        loss = _sensitivity(run, goal, grid)
    rec["sensitivity"] = {"data": "the training data, no fine-tune (host, top-1 points lost)",
                          "loss": {g: {str(w): v for w, v in ws.items()} for g, ws in loss.items()}}
    target = goal.latency_ms * PLAN_MARGIN
    rec["rounds"] = []
    tried: list[dict[str, int]] = []
    for round_no in range(1, REFINE_ROUNDS + 1):
        plan = plan_widths(table, loss, goal.groups, target)
        rnd: dict[str, Any] = {"round": round_no, "target_ms": round(target, 6), "plan": plan.to_dict()}
        rec["rounds"].append(rnd)
        if round_no > 1 and st.clock.remaining() <= 0:
            rnd["stopped"] = f"the {st.clock.budget_s:g} s time budget is spent (--time-budget raises it)"
            break
        if not plan.widths or plan.widths in tried:
            rnd["stopped"] = ("no group's width is faster on the device: nothing to prune" if not plan.widths
                              else "the re-planned widths are the ones already measured")
            break
        tried.append(plan.widths)
        progress(f"pruning to {plan.widths}: predicted p50 {plan.predicted_ms:.4g} ms "
                 f"({'inside' if plan.feasible else 'over'} the {target:.4g} ms target)")
        rnd["students"] = _race_students(goal, st, session, final, settings, ctx, plan, list(encoding), enc, round_no)
        rnd["distillation"] = _distillation_note(rnd["students"])
        measured = [p for p in rnd["students"].values() if p and p["p50_ms"]]
        if not measured or any(p["meets_budget"] for p in measured):
            break
        # the table's additive prediction missed: plan again for a target scaled by how far it missed (NetAdapt
        # measures each proposal and steps on from it)
        miss = min(p["p50_ci95_upper_ms"] for p in measured) / max(plan.predicted_ms, 1e-12)
        target = target / max(miss, 1.0 + 1e-3)
    rec["frontier"] = frontier(final, goal)


def _race_students(goal: BudgetGoal, st: Any, session: DeviceSession, final: dict[str, Measured],
                   settings: RunSettings, ctx: PassContext, plan: Plan, encoding: list[PassStep], enc: str,
                   round_no: int) -> dict[str, Any]:
    """Both students of the plan's shape, built and measured; each one's point (None: it was dropped)."""
    run, progress = st.run, st.progress
    students = _students(goal, plan, encoding, enc, round_no)
    for spec in students:
        cand = Candidate(spec)
        cand.joined = "the latency budget: pruned to the planned widths, recovered by " + (
            "distillation from the source model" if spec.name.endswith("distilled") else "fine-tuning only")
        st.cands.append(cand)
        with st.clock.span("build", spec.name):
            progress(f"building {spec.name}")
            try:
                art = build_variants(run.fp32, Recipe(baseline=BASE, variants=[spec]), ctx, progress,
                                     source=run.source, cache=run.cache)[spec.name]
            except Exception as exc:  # a student whose pruning breaks an export loses with its reason
                cand.drop("build", f"build failed: {getattr(exc, 'message', exc)}")
                continue
        cand.artifact, cand.status = art, "built"
        if bad := _parity_failure(art):
            cand.drop("build", f"{bad}: the pruned model does not convert with parity")
            continue
        progress(f"measuring {spec.name} on the device")
        m = session.measure_or_drop(spec.name, art, settings)
        if isinstance(m, MeasureFailure):
            cand.drop("finals", f"failed on the device ({m.kind}): {m.message}")
            continue
        final[spec.name] = m
        cand.status = "finalist"
    score(final, run.plan, BASE, run.gate)
    return {s.name: (_point(final[s.name].result, goal, plan.predicted_ms) if s.name in final else None)
            for s in students}


def _sensitivity(run: PreparedRun, goal: BudgetGoal, grid: dict[str, list[int]]) -> dict[str, dict[int, float]]:
    from ..passes import _torch as T  # heavy: torch
    from ..passes.prune_latency import Group, group_sensitivity

    with T.torch_threads(1):
        model = T.module_from_arch(goal.arch, T.load_program(run.source.artifact), "source")
        groups = [Group(g, w, "") for g, w in goal.groups.items()]
        assert run.train_ds is not None
        return group_sensitivity(model, T.example_input(run.source.artifact.io, 1), groups, grid, run.train_ds)


def _students(goal: BudgetGoal, plan: Plan, encoding: list[PassStep], enc: str, round_no: int) -> list[VariantSpec]:
    """Two students of the planned shape in the shipped encoding: fine-tuned only, and distilled (same epochs)."""
    tag = (f"pruned-{enc}" if enc != BASE else "pruned") + (f"-r{round_no}" if round_no > 1 else "")
    ft = PassStep(name="prune_widths", config={"widths": plan.widths, "finetune_epochs": goal.epochs})
    raw = PassStep(name="prune_widths", config={"widths": plan.widths, "finetune_epochs": 0})
    kd = PassStep(name="distill", config={"epochs": goal.epochs, "temperature": 4.0, "alpha": 0.7})
    return [VariantSpec(name=f"{tag}-finetuned", passes=[ft, *encoding]),
            VariantSpec(name=f"{tag}-distilled", passes=[raw, kd, *encoding])]


def _parity_failure(art: Any) -> str | None:
    bad = [f"parity[{s.name}]: {'; '.join(s.metrics['parity_violations'])}" for s in art.lineage
           if s.kind == "convert" and s.metrics.get("parity_violations")]
    return bad[0] if bad else None


def _point(v: VariantResult, goal: BudgetGoal, predicted: float | None) -> dict[str, Any]:
    lat = v.latency_ms
    return {"name": v.name, "p50_ms": lat.p50 if lat else None, "ci95_ms": list(lat.ci95) if lat else None,
            "p50_ci95_upper_ms": upper(v),
            "predicted_p50_ms": None if predicted is None else round(predicted, 6),
            "prediction_error": (round(lat.p50 / predicted - 1, 4) if lat and predicted else None),
            "accuracy": v.accuracy.value if v.accuracy else None, "accuracy_drop": v.accuracy_drop,
            "size_bytes": v.size_bytes, "peak_memory_mb": v.peak_memory_mb, "meets_budget": goal.meets(v)}


def _distillation_note(students: dict[str, Any]) -> str:
    ft = next((p for n, p in students.items() if n.endswith("finetuned") and p), None)
    kd = next((p for n, p in students.items() if n.endswith("distilled") and p), None)
    if not ft or not kd or ft["accuracy"] is None or kd["accuracy"] is None:
        return "not compared: a student was not measured"
    d = kd["accuracy"] - ft["accuracy"]
    return (f"distillation {'bought' if d > 0 else 'lost'} {abs(d):.3g} points over fine-tuning alone at the same "
            f"shape ({kd['accuracy']:.4g} vs {ft['accuracy']:.4g})")


def frontier(final: dict[str, Measured], goal: BudgetGoal) -> list[dict[str, Any]]:
    """Every device-measured point (accuracy against latency, size, memory), fastest first, with the budget."""
    pts = [{"name": n, "p50_ms": m.result.latency_ms.p50 if m.result.latency_ms else None,
            "p50_ci95_upper_ms": upper(m.result),
            "accuracy": m.result.accuracy.value if m.result.accuracy else None,
            "accuracy_drop": m.result.accuracy_drop, "size_bytes": m.result.size_bytes,
            "peak_memory_mb": m.result.peak_memory_mb, "meets_budget": goal.meets(m.result)}
           for n, m in final.items()]
    return sorted(pts, key=lambda p: p["p50_ms"] if p["p50_ms"] is not None else float("inf"))


def no_training_data_note(run: PreparedRun, why_not: dict[str, str]) -> str:
    """Said when a latency budget was missed by every file and the run could not prune (no training data or no
    architecture)."""
    if run.gate.latency_ms_p50 is None or not any("latency" in w for w in why_not.values()):
        return ""
    missing = " and ".join(x for x, have in (("training data (--train-data)", run.train_ds is not None),
                                             ("the architecture (--arch)", bool(run.arch))) if not have)
    return (f"; no encoding meets the {run.gate.latency_ms_p50:g} ms budget: {missing} would let the search prune "
            "channels until it holds") if missing else ""

