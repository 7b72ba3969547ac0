"""A budget as a goal (issue #46): with training data and the architecture, the search changes the model until
the budget holds on the device, and ships the most accurate variant inside the gate that meets every budget: the
measured p50's 95% CI upper bound under ``--latency-budget-ms``, the peak memory measured on the device under
``--memory-budget-mb``, the file under ``--size-budget-mb`` (``goal.py``: one goal over the three quantities).

When no finalist of the encoding race meets the goal, the search:
 1. takes the encoding that will ship (the finalist inside the accuracy tolerance closest to the budgets) and
    reads what each prunable group's widths buy in it, per budgeted quantity: latency measured on the device
    (``latency_table.py``), peak memory measured on the device, size computed exactly from the parameter
    count of each width (``footprint.py``);
 2. measures on the host what each width costs in accuracy (``passes/prune_latency.group_sensitivity``);
 3. chooses per-group widths (:func:`plan`): the least predicted accuracy loss whose every predicted quantity is
    under its budget's planning margin, from the widths that pay for some budgeted quantity only;
 4. builds two students of that shape through the same encoding: fine-tuned only, and distilled for the same
    epochs from the source model or the ``--teacher`` trained with ``edgekit train``, measures both like any
    finalist, and lets the gate and the budgets judge.
Without a budget the objective decides as before; a budget nothing meets is a failed gate that names the closest
measured point. The record (tables, plan, predicted beside measured, the frontier) goes to the report's search
section as ``budget``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..devices.session import MeasureFailure
from ..errors import BadInputError, DataError
from ..formats import Format
from ..inputs.recipe import PassStep, Recipe, VariantSpec
from ..orchestration.assemble import score
from ..orchestration.steps import build_variants
from ..passes.base import PassContext
from ..report.gate import evaluate_gate
from ..timeline import epoch_progress
from .choice import BASE, Candidate
from .footprint import measure_memory_table, size_model
from .goal import RECOVERY_EPOCHS, UNITS, Budget, BudgetGoal, Quantity, budgets_of, measured, upper
from .latency_table import measure_table

if TYPE_CHECKING:
    from ..devices.session import DeviceSession, Measured, RunSettings
    from ..orchestration.options import DeployOptions
    from ..orchestration.prepare import PreparedRun
    from ..report.model import VariantResult

# plan for a predicted quantity at this share of its budget: latency's measured CI upper bound is what is judged;
# peak memory moves by allocator pages run to run; the size model is exact up to the file format's metadata
PLAN_MARGIN: dict[Quantity, float] = {"latency": 0.9, "memory": 0.97, "size": 0.99}
REFINE_ROUNDS = 3  # plans measured: the first, then re-planned from how far the measured quantity missed the plan
MAX_COMBINATIONS = 20000  # above this many width combinations the plan is greedy (NetAdapt's step), else exhaustive
FRACTIONS = (0.75, 0.5, 0.25)  # of each group's width, rounded down to the quantum
STUDENTS = ("finetuned", "distilled")
__all__ = ["BudgetGoal", "Budget", "RECOVERY_EPOCHS", "budget_goal", "extend_for_budget", "plan", "plan_widths",
           "upper", "width_grid"]


def budget_goal(run: PreparedRun, opts: DeployOptions) -> BudgetGoal | None:
    """The budgets as a goal when the run has a budget, training data and the architecture; checks the training
    data, the model and the teacher before any work (exit 2). None: the budgets stay gate checks."""
    budgets = budgets_of(run.gate)
    if not budgets or run.train_ds is None or not run.arch:
        return None
    names = " and ".join(f"{b.quantity} budget" for b in budgets)
    if run.source.artifact.format != Format.TORCH:
        raise BadInputError(f"a {names} with --train-data prunes the PyTorch model, and the source is not one",
                            hint="deploy the .pt2 (or .pth with --arch), or drop --train-data to keep the budget a "
                            "gate check")
    _check_classes(run)
    from ..passes import _torch as T  # heavy: torch
    from ..passes.prune_latency import prunable_groups

    model = T.module_from_arch(run.arch, T.load_program(run.source.artifact), "source")
    groups = prunable_groups(model, T.example_input(run.source.artifact.io, 1))
    if not groups:
        raise BadInputError(f"a {names} with --train-data prunes channels, and {run.arch} has no prunable "
                            "group (no conv or linear layer whose outputs feed another layer)",
                            hint="drop --train-data to keep the budget a gate check, or give a model with hidden "
                            "conv/linear layers")
    goal = BudgetGoal(budgets=budgets, arch=run.arch, groups={g.name: g.width for g in groups})
    if opts.teacher is not None:
        from ..passes.teacher import check_teacher, load_teacher

        goal.teacher = load_teacher(opts.teacher, run.source.artifact, run.art_dir)
        goal.record["teacher"] = check_teacher(goal.teacher, run.source.artifact, run.train_ds)
    return goal


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


class Predictor(Protocol):
    """What a group's widths buy in one budgeted quantity: the latency table, the memory table, the size model."""

    quantity: str

    def predict(self, widths: dict[str, int]) -> float: ...

    def paying(self, group: str) -> list[int]: ...

    def unpaid(self, group: str) -> str | None: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass
class Constraint:
    predictor: Predictor
    target: float  # the planned-for value: the budget times its margin (re-planned rounds: scaled by the miss)

    @property
    def quantity(self) -> str:
        return self.predictor.quantity


@dataclass
class Plan:
    widths: dict[str, int]  # the pruned groups only
    predicted: dict[str, float]  # quantity -> predicted value (ms, MB, MB)
    predicted_loss: float
    feasible: bool
    unpaid: dict[str, str]  # groups left whole because no width of theirs buys anything budgeted, and why
    method: str

    @property
    def predicted_ms(self) -> float:
        return self.predicted.get("latency", float("nan"))

    def to_dict(self) -> dict[str, Any]:
        return {"widths": self.widths, "predicted": {q: round(v, 6) for q, v in self.predicted.items()},
                **({"predicted_p50_ms": round(self.predicted["latency"], 6)} if "latency" in self.predicted else {}),
                "predicted_accuracy_loss": round(self.predicted_loss, 4), "feasible": self.feasible,
                "left_unpruned": self.unpaid, "method": self.method}


def plan_widths(table: Predictor, loss: dict[str, dict[int, float]], groups: dict[str, int],
                target_ms: float) -> Plan:
    """:func:`plan` for one quantity (the latency table and its target)."""
    return plan([Constraint(table, target_ms)], loss, groups)


def plan(constraints: list[Constraint], loss: dict[str, dict[int, float]], groups: dict[str, int]) -> Plan:
    """Per-group widths with the least predicted accuracy loss (the sum of each group's host-measured loss) whose
    every predicted quantity is at most its target; a width is an option when it pays for some budgeted quantity
    (on the device, for latency and memory). Nothing meets every target: the plan closest to them (the least
    worst predicted/target ratio), ``feasible`` False."""
    options: dict[str, list[int]] = {}
    unpaid: dict[str, str] = {}
    for g, full in groups.items():
        paying = sorted({w for c in constraints for w in c.predictor.paying(g)}, reverse=True)
        options[g] = [full, *paying]
        whys = [w for c in constraints if (w := c.predictor.unpaid(g))]
        if not paying and whys:
            unpaid[g] = "; ".join(whys)

    def cost(ws: dict[str, int]) -> tuple[dict[str, float], float, float]:
        pruned = {g: w for g, w in ws.items() if w != groups[g]}
        pred = {c.quantity: c.predictor.predict(pruned) for c in constraints}
        worst = max(pred[c.quantity] / c.target if c.target > 0 else float("inf") for c in constraints)
        return pred, sum(loss.get(g, {}).get(w, 0.0) for g, w in pruned.items()), worst

    names = list(options)
    total = 1
    for g in names:
        total *= len(options[g])
    if total <= MAX_COMBINATIONS:
        method = f"exhaustive over {total} combinations"
        scored = [(dict(zip(names, combo)), *cost(dict(zip(names, combo))))
                  for combo in itertools.product(*options.values())]
        inside = [x for x in scored if x[3] <= 1.0]
        best = min(inside, key=lambda x: (x[2], x[3])) if inside else min(scored, key=lambda x: (x[3], x[2]))
    else:  # NetAdapt's greedy step: the next width that buys the most of the missed targets per point lost
        method = "greedy (budget bought per point lost)"
        cur = {g: groups[g] for g in names}
        while cost(cur)[2] > 1.0:
            now = cost(cur)
            steps = []
            for g in names:
                lower = [w for w in options[g] if w < cur[g]]
                if lower:
                    nxt = {**cur, g: lower[0]}
                    after = cost(nxt)
                    gain = sum(max(now[0][c.quantity] - after[0][c.quantity], 0.0) / c.target
                               for c in constraints if now[0][c.quantity] > c.target)
                    steps.append((gain / (max(after[1] - now[1], 0.0) + 1e-3), nxt))
            if not steps:
                break
            cur = max(steps, key=lambda x: x[0])[1]
        best = (cur, *cost(cur))
    widths = {g: w for g, w in best[0].items() if w != groups[g]}
    return Plan(widths=widths, predicted=best[1], predicted_loss=best[2], feasible=best[3] <= 1.0, unpaid=unpaid,
                method=method)


def _accuracy_ok(run: PreparedRun, final: dict[str, Measured], name: str) -> bool:
    g = evaluate_gate([final[BASE].result, final[name].result], BASE, run.gate, judged=[name])
    return all(c.passed for c in g.checks if c.name == "accuracy_drop")


def _ctx(run: PreparedRun, goal: BudgetGoal) -> PassContext:
    return PassContext(workdir=run.art_dir, calib=run.calib_ds, eval=run.eval_ds, train=run.train_ds,
                       source=run.source, metric_plan=run.plan, arch=run.arch or None,
                       teacher=goal.teacher or run.source.artifact)


def extend_for_budget(goal: BudgetGoal, st: Any, session: DeviceSession, final: dict[str, Measured],
                      settings: RunSettings) -> None:
    """When no finalist meets the goal: the quantities' tables, the plan, the two students, measured and added to
    ``final`` and ``st.cands`` (the selection judges them like every finalist). Fills ``goal.record``."""
    run, progress = st.run, st.progress
    score(final, run.plan, BASE, run.gate)
    rec = goal.record
    rec.update(goal.doc())
    if goal.latency_ms is not None:
        rec["latency_budget_ms"] = goal.latency_ms
    rec["groups"] = goal.groups
    met = [n for n, m in final.items() if _accuracy_ok(run, final, n) and goal.meets(m.result)]
    if met:
        rec["pruning"] = f"not needed: {', '.join(met)} already meet the budget inside the accuracy tolerance"
        rec["frontier"] = frontier(final, goal)
        return
    if st.clock.remaining() <= 0:  # the tables and the students' training would run past --time-budget
        rec["pruning"] = (f"not tried: the {st.clock.budget_s:g} s time budget was spent before it "
                          "(--time-budget raises it)")
        rec["frontier"] = frontier(final, goal)
        return
    inside = [n for n in final if _accuracy_ok(run, final, n)]
    enc = min(inside or [BASE], key=lambda n: goal.distance(final[n].result))
    encoding: list[PassStep] = next((c.spec.passes for c in st.cands if c.name == enc), [])
    rec["encoding"] = enc
    ctx = _ctx(run, goal)
    grid = width_grid(goal.groups)
    constraints = _constraints(goal, st, session, run, ctx, enc, list(encoding), grid, settings)
    with st.clock.span("budget", "sensitivity"):
        progress(f"host sensitivity of {len(grid)} groups at {sum(map(len, grid.values()))} widths")
        loss = _sensitivity(run, goal, grid)
    rec["sensitivity"] = {"data": "the training data, no fine-tune (host, top-1 points lost)",
                          "loss": {g: {str(w): v for w, v in ws.items()} for g, ws in loss.items()}}
    rec["rounds"] = []
    tried: list[dict[str, int]] = []
    for round_no in range(1, REFINE_ROUNDS + 1):
        p = plan(constraints, loss, goal.groups)
        rnd: dict[str, Any] = {"round": round_no, "targets": {c.quantity: round(c.target, 6) for c in constraints},
                               "plan": p.to_dict()}
        if "latency" in rnd["targets"]:
            rnd["target_ms"] = rnd["targets"]["latency"]
        rec["rounds"].append(rnd)
        if round_no > 1 and st.clock.remaining() <= 0:
            rnd["stopped"] = f"the {st.clock.budget_s:g} s time budget is spent (--time-budget raises it)"
            break
        if not p.widths or p.widths in tried:
            rnd["stopped"] = (f"no group's width buys any {' or '.join(goal.quantities())} on the device: nothing "
                              "to prune" if not p.widths else "the re-planned widths are the ones already measured")
            break
        tried.append(p.widths)
        progress(f"pruning to {p.widths}: predicted " + ", ".join(
            f"{c.quantity} {p.predicted[c.quantity]:.4g} {UNITS[c.quantity]} (target {c.target:.4g})"
            for c in constraints) + f" ({'inside' if p.feasible else 'over'} the targets)")
        rnd["students"] = _race_students(goal, st, session, final, settings, ctx, p, list(encoding), enc, round_no)
        rnd["distillation"] = _distillation_note(rnd["students"])
        points = [x for x in rnd["students"].values() if x and x["p50_ms"]]
        if not points or any(x["meets_budget"] for x in points):
            break
        # a prediction missed: plan again for targets scaled by how far each quantity missed (NetAdapt measures
        # each proposal and steps on from it)
        for c in constraints:
            got = min((x["measured"].get(c.quantity) or float("inf")) for x in points)
            miss = got / max(p.predicted[c.quantity], 1e-12)
            if got > (goal.limits().get(c.quantity) or float("inf")):
                c.target = c.target / max(miss, 1.0 + 1e-3)
    rec["frontier"] = frontier(final, goal)


def _constraints(goal: BudgetGoal, st: Any, session: DeviceSession, run: PreparedRun, ctx: PassContext, enc: str,
                 encoding: list[PassStep], grid: dict[str, list[int]], settings: RunSettings) -> list[Constraint]:
    """Each budgeted quantity's predictor, read where it ships (into ``goal.record``), with its planned target."""
    rec, progress = goal.record, st.progress
    out: list[Constraint] = []
    for b in goal.budgets:
        target = b.limit * PLAN_MARGIN[b.quantity]
        if b.quantity == "latency":
            with st.clock.span("budget", "latency table"):
                table = measure_table(session, run, ctx, encoding_name=enc, encoding=encoding, grid=grid,
                                      settings=settings, progress=progress)
            rec["latency_table"] = table.to_dict()
            out.append(Constraint(table, target))
        elif b.quantity == "memory":
            with st.clock.span("budget", "memory table"):
                mem = measure_memory_table(session, run, ctx, encoding_name=enc, encoding=encoding, grid=grid,
                                           settings=settings, progress=progress)
            rec["memory_table"] = mem.to_dict()
            out.append(Constraint(mem, target))
        else:
            with st.clock.span("budget", "size model"):
                size = size_model(run, ctx, _param_model(run, goal, grid), encoding_name=enc, encoding=encoding,
                                  grid=grid, progress=progress)
            rec["size_model"] = size.to_dict()
            out.append(Constraint(size, target))
    return out


def _param_model(run: PreparedRun, goal: BudgetGoal, grid: dict[str, list[int]]) -> Any:
    from ..passes import _torch as T  # heavy: torch
    from ..passes.prune_latency import Group, param_model

    with T.torch_threads(1):
        model = T.module_from_arch(goal.arch, T.load_program(run.source.artifact), "source")
        return param_model(model, T.example_input(run.source.artifact.io, 1),
                           [Group(g, w, "") for g, w in goal.groups.items()], grid)


def _race_students(goal: BudgetGoal, st: Any, session: DeviceSession, final: dict[str, Measured],
                   settings: RunSettings, ctx: PassContext, p: Plan, encoding: list[PassStep], enc: str,
                   round_no: int) -> dict[str, Any]:
    """Both students of the plan's shape, built and measured; each one's point (None: it was dropped)."""
    run, progress = st.run, st.progress
    students = _students(goal, p, encoding, enc, round_no)
    teacher = "the --teacher" if goal.teacher is not None else "the source model"
    for spec in students:
        cand = Candidate(spec)
        cand.joined = "the budget: pruned to the planned widths, recovered by " + (
            f"distillation from {teacher}" if spec.name.endswith("distilled") else "fine-tuning only")
        st.cands.append(cand)
        with st.clock.span("build", spec.name):
            progress(f"building {spec.name} ({len(final)} points measured)")

            def said(what: str, k: int, n: int, name: str = spec.name) -> None:
                progress(f"{name}: {what} epoch {k}/{n} ({len(final)} points measured)")

            try:
                with epoch_progress(said):
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
    return {s.name: (_point(final[s.name].result, goal, p) if s.name in final else None) for s in students}


def _sensitivity(run: PreparedRun, goal: BudgetGoal, grid: dict[str, list[int]]) -> dict[str, dict[int, float]]:
    from ..passes import _torch as T  # heavy: torch
    from ..passes.prune_latency import Group, group_sensitivity

    with T.torch_threads(1):
        model = T.module_from_arch(goal.arch, T.load_program(run.source.artifact), "source")
        groups = [Group(g, w, "") for g, w in goal.groups.items()]
        assert run.train_ds is not None
        return group_sensitivity(model, T.example_input(run.source.artifact.io, 1), groups, grid, run.train_ds)


def _students(goal: BudgetGoal, p: Plan, encoding: list[PassStep], enc: str, round_no: int) -> list[VariantSpec]:
    """Two students of the planned shape in the shipped encoding: fine-tuned only, and distilled (same epochs)
    from the source model or the --teacher."""
    tag = (f"pruned-{enc}" if enc != BASE else "pruned") + (f"-r{round_no}" if round_no > 1 else "")
    ft = PassStep(name="prune_widths", config={"widths": p.widths, "finetune_epochs": goal.epochs})
    raw = PassStep(name="prune_widths", config={"widths": p.widths, "finetune_epochs": 0})
    kd_cfg: dict[str, Any] = {"epochs": goal.epochs, "temperature": 4.0, "alpha": 0.7}
    if goal.teacher is not None:
        kd_cfg["teacher"] = str(goal.teacher.path)
    kd = PassStep(name="distill", config=kd_cfg)
    return [VariantSpec(name=f"{tag}-finetuned", passes=[ft, *encoding]),
            VariantSpec(name=f"{tag}-distilled", passes=[raw, kd, *encoding])]


def _parity_failure(art: Any) -> str | None:
    bad = [f"parity[{s.name}]: {'; '.join(s.metrics['parity_violations'])}" for s in art.lineage
           if s.kind == "convert" and s.metrics.get("parity_violations")]
    return bad[0] if bad else None


def _distillation_note(students: dict[str, Any]) -> str:
    ft = next((p for n, p in students.items() if n.endswith("finetuned") and p), None)
    kd = next((p for n, p in students.items() if n.endswith("distilled") and p), None)
    if not ft or not kd or ft["accuracy"] is None or kd["accuracy"] is None:
        return "not compared: a student was not measured"
    d = kd["accuracy"] - ft["accuracy"]
    return (f"distillation {'bought' if d > 0 else 'lost'} {abs(d):.3g} points over fine-tuning alone at the same "
            f"shape ({kd['accuracy']:.4g} vs {ft['accuracy']:.4g})")


def _point(v: VariantResult, goal: BudgetGoal, p: Plan | None) -> dict[str, Any]:
    lat = v.latency_ms
    predicted = p.predicted_ms if p is not None and "latency" in p.predicted else None
    return {"name": v.name, "p50_ms": lat.p50 if lat else None, "ci95_ms": list(lat.ci95) if lat else None,
            "p50_ci95_upper_ms": upper(v),
            "predicted_p50_ms": None if predicted is None else round(predicted, 6),
            "prediction_error": (round(lat.p50 / predicted - 1, 4) if lat and predicted else None),
            "predicted": {} if p is None else {q: round(x, 6) for q, x in p.predicted.items()},
            "measured": {q: measured(v, q) for q in goal.quantities()},
            "accuracy": v.accuracy.value if v.accuracy else None, "accuracy_drop": v.accuracy_drop,
            "size_bytes": v.size_bytes, "peak_memory_mb": v.peak_memory_mb, "meets_budget": goal.meets(v)}


def frontier(final: dict[str, Measured], goal: BudgetGoal) -> list[dict[str, Any]]:
    """Every device-measured point (accuracy against latency, size, memory), fastest first, with the budget."""
    pts = [{"name": n, "p50_ms": m.result.latency_ms.p50 if m.result.latency_ms else None,
            "p50_ci95_upper_ms": upper(m.result),
            "accuracy": m.result.accuracy.value if m.result.accuracy else None,
            "accuracy_drop": m.result.accuracy_drop, "size_bytes": m.result.size_bytes,
            "peak_memory_mb": m.result.peak_memory_mb, "meets_budget": goal.meets(m.result)}
           for n, m in final.items()]
    return sorted(pts, key=lambda x: x["p50_ms"] if x["p50_ms"] is not None else float("inf"))


def settle_frontier(goal: BudgetGoal, cands: list[Candidate], shipped: str | None) -> None:
    """After the selection: the shipped point, and why each other point lost (the report's plot labels them)."""
    why = {c.name: c.reason for c in cands if c.reason}
    for x in goal.record.get("frontier") or []:
        x["shipped"] = shipped is not None and (x["name"] == shipped or shipped.startswith(x["name"] + "@"))
        if not x["shipped"]:
            x["lost"] = why.get(x["name"]) or (
                "the reference (float) model" if x["name"] == BASE and x["meets_budget"] else
                _over_point(goal, x) or "inside the budget, but less accurate than the shipped point")


def _over_point(goal: BudgetGoal, x: dict[str, Any]) -> str:
    """The budgets a frontier point misses, in words (from its record)."""
    got = {"latency": x.get("p50_ci95_upper_ms"), "memory": x.get("peak_memory_mb"),
           "size": None if x.get("size_bytes") is None else x["size_bytes"] / 1e6}
    out = []
    for b in goal.budgets:
        v = got[b.quantity]
        if v is None:
            out.append(f"{b.quantity} not measured")
        elif float(v) > b.limit:
            out.append(f"{b.quantity} {float(v):.4g} {UNITS[b.quantity]} over {b.label()}")
    return "; ".join(out)


def no_training_data_note(run: PreparedRun, why_not: dict[str, str]) -> str:
    """Said when a budget was missed by every file and the run could not prune (no training data or no
    architecture)."""
    budgets = budgets_of(run.gate)
    missed = [b for b in budgets if any(b.quantity in w or (b.quantity == "size" and "model_size" in w)
                                        for w in why_not.values())]
    if not missed:
        return ""
    missing = " and ".join(x for x, have in (("training data (--train-data)", run.train_ds is not None),
                                             ("the architecture (--arch)", bool(run.arch))) if not have)
    said = " and ".join(f"{b.limit:g} {UNITS[b.quantity]}{'' if b.quantity == 'latency' else ' ' + b.quantity}"
                        for b in missed)
    return (f"; no encoding meets the {said} budget: {missing} would let the search prune channels until it holds"
            if missing else "")
