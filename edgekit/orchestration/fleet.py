"""A fleet run: one release measured on every unit of a pool, in parallel, judged on its worst unit.

``deploy_fleet`` is ``pipeline.deploy`` over several devices: the same preparation (``prepare_run``),
the same variants (built once, ``steps.build_recipe``), one ``DeviceSession`` per unit (each takes its host lock and its
device-side lease), run in threads (the work is on the devices). Eval is replicated (every unit scores
the whole set) or sharded (``shard_eval``: unit i scores the i-th contiguous part; the per-sample
outputs are put back in order and scored as one set, so the metric and its paired statistics are the
ones a single device scoring everything would give). Latency is per unit; across units the fleet
section gives the median of the units' medians, the spread and the worst unit.

The gate judges one unit's report: the worst (default: a unit whose gate fails, else the slowest on
the judged variants) or the median unit (``fleet_gate="median"``), and names it in every check. With
the worst-unit gate, every other failing unit adds a failed ``fleet_unit_gate`` check. A unit that
fails (its link drops, its sshd dies) is reported with its error while the others finish; the
``fleet_units`` check fails with "N of M units unmeasured" unless ``min_devices`` are measured.
When no unit could be measured nothing is written and the run fails as a device error (exit 3).
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..devices.inventory import select_devices
from ..devices.session import DeviceSession, Measured
from ..errors import BadInputError, DeviceError, EdgekitError
from ..inputs.data import Dataset
from ..inputs.recipe import Recipe
from ..inputs.targets import TargetSpec
from ..metrics.evaluate import EvalPlan
from ..report.model import Accuracy, Check, FleetSection, FleetUnit, FleetVariant, Parity, Report
from ..report.release import ReleaseJudgement
from ..report.write import write_report
from ..transport.base import Transport
from .assemble import assemble_report
from .options import DeployOptions
from .prepare import PreparedRun, prepare_run, resolve_recipe, target_spec
from .release import release_judgement
from .steps import build_recipe, measure_all, recorded_settings, run_settings

Progress = Callable[[str], None]


@dataclass
class Unit:
    name: str
    shard: tuple[int, int] | None = None  # [start, stop) of the eval set this unit scores (sharded eval)
    state: str = "pending"  # measured | failed
    error: str | None = None
    error_kind: str | None = None
    exit_code: int | None = None
    seconds: float | None = None
    measured: dict[str, Measured] = field(default_factory=dict)
    session: DeviceSession | None = None
    release: ReleaseJudgement | None = None
    shard_accuracy: dict[str, float | None] = field(default_factory=dict)
    report: Report | None = None

    def measured_session(self) -> DeviceSession:
        """The session a measured unit was measured in."""
        if self.session is None:
            raise RuntimeError(f"fleet unit {self.name} was not measured")
        return self.session

    def judged_report(self) -> Report:
        """A measured unit's report (assembled once every unit finished)."""
        if self.report is None:
            raise RuntimeError(f"fleet unit {self.name} has no report (it was not measured)")
        return self.report

    def eval_slice(self) -> tuple[int, int]:
        """The [start, stop) of the eval set a unit of a sharded fleet scores."""
        if self.shard is None:
            raise RuntimeError(f"fleet unit {self.name} scores no shard (the eval set is not sharded)")
        return self.shard


def shard_bounds(n: int, k: int) -> list[tuple[int, int]]:
    """``k`` contiguous parts of ``n`` samples, sizes differing by at most one."""
    if k > n:
        raise BadInputError(f"--shard-eval over {k} units needs at least {k} eval samples (the set has {n})")
    edges = np.linspace(0, n, k + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


def shard_dataset(ds: Dataset, a: int, b: int) -> Dataset:
    sample = {**(ds.sample or {}), "shard": [a, b], "of_samples": ds.n}
    return replace(ds, xs=tuple(x[a:b] for x in ds.xs), y=None if ds.y is None else ds.y[a:b], shards=None,
                   sample=sample)


def plan_for(plan: EvalPlan, idx: np.ndarray) -> EvalPlan:
    """The eval plan restricted to the samples ``idx`` (labels and float reference outputs)."""
    return replace(plan, labels=None if plan.labels is None else plan.labels[idx],
                   reference=[r[idx] for r in plan.reference])


def deploy_fleet(model: Any, *, eval_data: str | Path, target: str | TargetSpec, device: str | None = None,
                 calib_data: str | Path | None = None, recipe: str | Path | Recipe | None = None,
                 out: str | Path = "edgekit-out", example_inputs: tuple[Any, ...] | None = None,
                 arch: str | None = None, x_key: str | tuple[str, ...] = "x", y_key: str = "y",
                 options: DeployOptions, progress: Progress | None = None,
                 transport: Transport | None = None) -> Report:
    opts, progress = options, progress or (lambda _m: None)
    if device is not None or transport is not None:
        raise BadInputError("a fleet run (--devices/--pool) measures inventory devices: drop --device")
    if opts.fleet_gate not in ("worst", "median"):
        raise BadInputError(f"--fleet-gate {opts.fleet_gate!r} is not one of worst, median")
    spec = target_spec(target)
    entries = select_devices(opts.devices, opts.pool)
    wrong = [f"{e.name} ({e.target})" for e in entries if e.target != spec.name]
    if wrong:
        raise BadInputError(f"fleet units must be '{spec.name}' devices: {', '.join(wrong)} are not",
                            hint=f"pass --target of their class, or a pool of {spec.name} devices")
    m = len(entries)
    need = m if opts.min_devices is None else opts.min_devices
    if not 1 <= need <= m:
        raise BadInputError(f"--min-devices {opts.min_devices} must be between 1 and the {m} units of the fleet")
    rec = resolve_recipe(recipe, spec, calib_data is not None)
    run = prepare_run(model, eval_data=eval_data, target=spec, recipe=rec, opts=opts, calib_data=calib_data, out=out,
                      example_inputs=example_inputs, arch=arch, x_key=x_key, y_key=y_key, progress=progress)
    if opts.shard_eval and run.eval_ds.buckets:  # before any build
        raise BadInputError(f"--shard-eval splits the eval set into contiguous slices, and eval data "
                            f"{run.eval_ds.path.name} holds {len(run.eval_ds.buckets)} shape buckets",
                            hint="drop --shard-eval (every unit scores all of it), or deploy once per shape")
    variants, passes_seconds, warnings = build_recipe(run, progress)
    settings = run_settings(run, opts)
    bounds: list[tuple[int, int] | None] = list(shard_bounds(run.eval_ds.n, m)) if opts.shard_eval else [None] * m
    units = [Unit(e.name, shard=b) for e, b in zip(entries, bounds)]
    judged = [n for n in variants if n != rec.baseline] or [rec.baseline]
    said = threading.Lock()

    def measure_unit(u: Unit) -> None:
        def say(msg: str) -> None:
            with said:
                progress(f"[{u.name}] {msg}")

        started = time.perf_counter()
        ds, plan = run.eval_ds, run.plan
        if u.shard is not None:
            ds, plan = shard_dataset(ds, *u.shard), plan_for(plan, np.arange(*u.shard))
        unit_dir = run.art_dir / "fleet" / u.name
        unit_dir.mkdir(parents=True, exist_ok=True)
        try:
            with DeviceSession(spec, u.name, source_io=run.source.artifact.io, plan=plan, lock_wait=opts.lock_wait,
                               lock_timeout=opts.lock_timeout, remeasure=opts.remeasure, progress=say) as s:
                u.session = s
                s.use_eval(ds, unit_dir)
                s.deliver(variants.values())
                u.measured = measure_all(s, variants, settings, run.measure, say)
                u.release = release_judgement(s, replace(run, plan=plan), u.measured, judged, settings, opts, say)
            u.state = "measured"
        except Exception as exc:  # one unit's failure is its row in the report; the others go on
            u.state, u.measured = "failed", {}
            u.error = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            u.error_kind = getattr(exc, "kind", None) or type(exc).__name__
            u.exit_code = exc.exit_code if isinstance(exc, EdgekitError) else None
            say(f"FAILED: {u.error}")
        u.seconds = round(time.perf_counter() - started, 3)

    progress(f"measuring on {m} units in parallel: {', '.join(u.name for u in units)}")
    with ThreadPoolExecutor(max_workers=m, thread_name_prefix="fleet") as pool:
        list(pool.map(measure_unit, units))
    ok = [u for u in units if u.state == "measured"]
    if not ok:
        raise DeviceError("no unit of the fleet could be measured: "
                          + "; ".join(f"{u.name}: {u.error}" for u in units) + " (no report written)")
    plan = run.plan
    if opts.shard_eval:
        plan = _combine_shards(run.plan, ok)
    progress("writing the report")
    fleet_run = replace(run, plan=plan)
    extra = recorded_settings(run, settings, passes_seconds)
    for u in ok:
        u.report = assemble_report(fleet_run, u.measured, u.measured_session(), baseline=rec.baseline,
                                   warnings=opts.extra_warnings + warnings, release=u.release, settings=extra)
    report = _fleet_report(units, ok, judged, opts, need, run, plan)
    write_report(report, run.out_dir)
    return report


def _combine_shards(plan: EvalPlan, ok: list[Unit]) -> EvalPlan:
    """Every unit's outputs put back in eval order and scored as one set (with the paired statistics
    of assemble_report); a missing shard (its unit failed) leaves those samples out, said in the report."""
    ok = sorted(ok, key=lambda u: u.eval_slice()[0])
    idx = np.concatenate([np.arange(*u.eval_slice()) for u in ok])
    combined = plan_for(plan, idx) if len(idx) < len(plan.labels if plan.labels is not None else plan.reference[0]) \
        else plan
    for name in ok[0].measured:
        parts = [o for u in ok if (o := u.measured[name].outputs) is not None]
        if len(parts) < len(ok):  # a unit kept no outputs for it
            continue
        outputs = [np.concatenate([p[k] for p in parts]) for k in range(len(parts[0]))]
        acc = combined.accuracy_dict(combined.score(outputs))
        par = combined.parity(outputs)
        for u in ok:
            mm = u.measured[name]
            u.shard_accuracy[name] = mm.result.accuracy.value if mm.result.accuracy is not None else None
            mm.outputs = outputs
            # the report's types, validated from the plan's dicts (as the fields' assignment validation did)
            mm.result.accuracy = Accuracy.model_validate(acc)
            first = next(iter(par.values()), None)
            mm.result.parity = Parity.model_validate(first) if first is not None else None
            mm.result.parity_outputs = {k: Parity.model_validate(p) for k, p in par.items()} if len(par) > 1 else None
    return combined


def _judged_p50(u: Unit, judged: list[str]) -> float:
    vals = [lat.p50 for n in judged if n in u.measured and (lat := u.measured[n].result.latency_ms)]
    return max(vals) if vals else 0.0


def _pick(ok: list[Unit], judged: list[str], mode: str) -> Unit:
    if mode == "median":
        ranked = sorted(ok, key=lambda u: _judged_p50(u, judged))
        return ranked[len(ranked) // 2]  # the upper median for an even count: the cautious side
    return max(ok, key=lambda u: (not u.judged_report().gate.passed, _judged_p50(u, judged)))


def _fleet_report(units: list[Unit], ok: list[Unit], judged: list[str], opts: DeployOptions, need: int,
                  run: PreparedRun, plan: EvalPlan) -> Report:
    mode = opts.fleet_gate
    chosen = _pick(ok, judged, mode)
    report = chosen.judged_report()
    m = len(units)
    role = f"{'worst' if mode == 'worst' else 'median'} of {len(ok)} measured"
    checks: list[Check] = []
    for c in report.gate.checks:
        checks.append(c.model_copy(update={"message": f"unit {chosen.name} ({role}): {c.message}",
                                           "unit": chosen.name}))
    if mode == "worst":
        for u in ok:
            if u is not chosen and not u.judged_report().gate.passed:
                bad = "; ".join(f"{c.name}{f' [{c.variant}]' if c.variant else ''}: {c.message}"
                                for c in u.judged_report().gate.failed_checks)
                checks.append(Check(name="fleet_unit_gate", passed=False, unit=u.name,
                                    message=f"unit {u.name} also fails: {bad}"))
    failed = [u for u in units if u.state != "measured"]
    text = (f"{len(ok)} of {m} units measured" if not failed else
            f"{len(failed)} of {m} units unmeasured ({'; '.join(f'{u.name}: {u.error}' for u in failed)})")
    checks.append(Check(name="fleet_units", value=float(len(ok)), limit=float(need), passed=len(ok) >= need,
                        message=text + (f"; --min-devices {need} met" if failed and len(ok) >= need else
                                        f"; {need} needed" if len(ok) < need else "")))
    report.gate = report.gate.model_copy(update={"checks": checks, "passed": all(c.passed for c in checks)})
    report.fleet = fleet = fleet_section(units, judged, opts, need, chosen, run, plan)
    report.settings["fleet"] = {"mode": fleet.mode, "gate": mode, "min_devices": need,
                                "units": [u.name for u in units]}
    spread = [v for v in fleet.variants if v.spread_rel is not None and v.spread_rel > 0.2]
    report.warnings += [f"fleet: {v.name} p50 differs {v.spread_rel:.0%} across units (worst {v.worst_unit} "
                        f"{v.worst_p50:.3f} ms, best {v.best_unit} {v.best_p50:.3f} ms)" for v in spread]
    report.warnings += [f"fleet: unit {u.name} failed: {u.error}" for u in failed]
    if opts.shard_eval and failed:
        report.warnings.append(f"fleet: sharded eval scored {fleet.eval_covered} of {run.eval_ds.n} samples "
                               f"(the shards of {', '.join(u.name for u in failed)} are missing)")
    return report


def fleet_section(units: list[Unit], judged: list[str], opts: DeployOptions, need: int, chosen: Unit,
                  run: PreparedRun, plan: EvalPlan) -> FleetSection:
    names = list(next(u for u in units if u.state == "measured").measured)
    rows = []
    for u in units:
        lat = {n: {k: getattr(mm.result.latency_ms, k) for k in ("p50", "p90", "p99", "mean")}
               for n, mm in u.measured.items() if mm.result.latency_ms is not None}
        dev = u.report.device if u.report is not None else None
        rows.append(FleetUnit(
            name=u.name, state=u.state, error=u.error, error_kind=u.error_kind, exit_code=u.exit_code,
            seconds=u.seconds, shard=list(u.shard) if u.shard else None,
            gate_passed=u.report.gate.passed if u.report is not None else None,
            failed_checks=[c.name + (f" [{c.variant}]" if c.variant else "") for c in u.report.gate.failed_checks]
            if u.report is not None else [],
            latency_ms=lat, transport=dev.transport if dev else None, hostname=dev.hostname if dev else None,
            eval_seconds={n: ((mm.doc or {}).get("eval") or {}).get("seconds") for n, mm in u.measured.items()},
            shard_accuracy=u.shard_accuracy or None))
    variants = []
    for n in names:
        per = {u.name: lm.p50 for u in units
               if n in u.measured and (lm := u.measured[n].result.latency_ms) is not None}
        if not per:
            continue
        med = statistics.median(per.values())
        worst, best = max(per, key=lambda u: per[u]), min(per, key=lambda u: per[u])
        variants.append(FleetVariant(name=n, units=len(per), median_of_medians_ms=med,
                                     spread_ms=per[worst] - per[best],
                                     spread_rel=(per[worst] - per[best]) / med if med > 0 else None,
                                     worst_unit=worst, worst_p50=per[worst], best_unit=best, best_p50=per[best]))
    covered = sum(b - a for u in units if u.state == "measured" and u.shard for a, b in [u.shard])
    return FleetSection(mode="sharded" if opts.shard_eval else "replicated", gate=opts.fleet_gate,
                        judged_unit=chosen.name, judged_variants=judged, min_devices=need,
                        measured=sum(u.state == "measured" for u in units), total=len(units),
                        eval_samples=run.eval_ds.n, eval_covered=covered if opts.shard_eval else run.eval_ds.n,
                        units=rows, variants=variants)

