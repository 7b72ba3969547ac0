"""`edgekit deploy --search` / `edgekit.search(...)`: for this model on this device, ship THIS file.

Stages, cheapest first:
 1. build every candidate the target can run (a failed build drops that candidate, with its error);
 2. host filter: accuracy on the eval set with the same runtime on the host (the agent's own code,
    run in-process); a candidate whose host drop exceeds the tolerance by more than ``host_slack``
    points is dropped before it costs device time;
 3. screening on the device: a short measurement of every survivor (latency, memory, accuracy);
    candidates outside the tolerance or the memory budget are dropped, and so are those whose latency
    is clearly slower than the best (racing: CIs separated);
 4. finals: the full measurement (the target's settings) of the survivors and the fp32 baseline;
 5. selection by the objective (p50 by default). Among finalists statistically indistinguishable
    from the best (overlapping 95% CIs), the smallest file wins, so a re-measurement does not flip
    the choice on noise.
The chosen file is written to ``out/ship/`` with its lineage; the report lists every candidate.
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .. import __version__
from ..agent.bundle import BundleDeployer, agent_source
from ..agent.protocol import build_request, run_request
from ..artifact import Artifact
from ..data import check_fits, load_npz
from ..errors import BadInputError, EdgekitError
from ..formats import Format
from ..fsutil import atomic_path, atomic_write_text, ensure_writable_dir
from ..passes.base import PassContext
from ..passes.registry import get_pass
from ..recipe import Recipe, VariantSpec
from ..report.gate import evaluate_gate
from ..report.model import Check, Gate, Report, VariantResult
from ..source import load_source
from ..targets import MeasureDefaults, load_target
from .candidates import candidate_variants
from .racing import clearly_slower, race_entry

Objective = Literal["p50", "p99", "energy", "size"]


@dataclass
class SearchOptions:
    objective: Objective = "p50"
    time_budget_s: float = 900.0  # total wall time; candidates not reached are dropped with that reason
    screening_runs: int = 30
    race_margin: float = 0.05
    host_filter: bool = True
    host_slack: float = 0.5  # accuracy points of leeway for host-vs-device differences
    candidates: list[VariantSpec] | None = None  # None = every candidate the target can run
    remeasure: bool = False  # False: reuse measurements from the cache (same model, settings, device, agent)
    measure: MeasureDefaults | None = None  # final measurement settings (None = the target's)


@dataclass
class Candidate:
    spec: VariantSpec
    status: str = "pending"  # built | dropped | finalist | selected
    stage: str | None = None
    reason: str | None = None
    artifact: Artifact | None = None
    host_accuracy: float | None = None
    screening: dict[str, Any] = field(default_factory=dict)

    def drop(self, stage: str, reason: str) -> None:
        self.status, self.stage, self.reason = "dropped", stage, reason

    def summary(self) -> dict[str, Any]:
        a = self.artifact
        return {"name": self.spec.name, "passes": [p.model_dump() for p in self.spec.passes], "status": self.status,
                "dropped_at": self.stage if self.status == "dropped" else None, "reason": self.reason,
                "format": a.format.value if a else None, "precision": a.precision if a else None,
                "size_bytes": a.size_bytes if a else None, "host_accuracy": self.host_accuracy,
                "screening": self.screening or None}


def _objective_value(v: VariantResult, objective: Objective) -> float | None:
    if objective == "size":
        return float(v.size_bytes)
    if objective == "energy":
        return v.energy_mj_per_inference
    if v.latency_ms is None:
        return None
    return v.latency_ms.p50 if objective == "p50" else v.latency_ms.p99


def _load_agent_module():
    spec = importlib.util.spec_from_file_location("edgekit_agent_host", agent_source())
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _host_accuracy(agent, art: Artifact, source_io, eval_ds, eval_file, plan, workdir: Path) -> float | None:
    """The metric with the candidate's runtime on this host, through the agent's own code."""
    from ..agent.protocol import load_outputs
    from ..formats import RUNTIME_FOR_FORMAT

    if RUNTIME_FOR_FORMAT.get(art.format) not in agent.RUNNERS:
        return None
    out = workdir / f".host-{art.sha256[:12]}.npz"
    req = build_request(variant="host", artifact=art, model_remote=str(art.path), source_io=source_io,
                        measure=MeasureDefaults(warmup=0, runs=1, min_seconds=0.0),
                        eval_remote=str(eval_file) if isinstance(eval_file, Path) else
                        [{k: str(f) for k, f in sh.items()} for sh in eval_file],
                        x_keys=eval_ds.x_keys, y_key=eval_ds.y_key, outputs_remote=str(out))
    try:
        agent.measure(req)
        return plan.score(load_outputs(out)).value
    except agent.AgentFailure as exc:
        if exc.kind == "runtime_missing":
            return None
        raise
    finally:
        out.unlink(missing_ok=True)


def search(model: Any, *, eval_data: str | Path, calib_data: str | Path | None = None, target: str = "local",
           device: str | None = None, out: str | Path = "edgekit-out", max_accuracy_drop: float = 1.0,
           options: SearchOptions | None = None, example_inputs: tuple | None = None, arch: str | None = None,
           x_key: str | tuple[str, ...] = "x", y_key: str = "y", transport=None, progress=None,
           baseline_report: str | Path | None = None, metric=None, eval_samples: int | None = None) -> Report:
    """``metric``: a MetricSpec (or a metric name) scoring the eval pass; default top1 on the first output."""
    from ..metrics import MetricSpec
    from ..metrics.evaluate import eval_plan, score_drops
    from ..pipeline import (DeployOptions, _device_info, _emulation, _eval_bundle_file, _metric_settings,
                            _variant_result, eval_files, eval_remote, open_transport, resolve_gate)

    opts = options or SearchOptions()
    progress = progress or (lambda _m: None)
    started = time.perf_counter()
    deadline = started + opts.time_budget_s
    if not 0 <= max_accuracy_drop <= 100:
        raise BadInputError(f"--max-accuracy-drop {max_accuracy_drop} is outside 0..100 (accuracy points)")

    spec = load_target(target)
    out_dir = ensure_writable_dir(out)
    previous = Report.load(baseline_report) if baseline_report is not None else None
    metric_spec = MetricSpec(name=metric) if isinstance(metric, str) else metric
    from ..metrics import resolve_metric

    resolve_metric(metric_spec)  # an unknown metric fails before any work
    from ..data import take_subset

    eval_ds = take_subset(load_npz(eval_data, x_key=x_key, y_key=y_key, require_labels=False, role="eval"),
                          eval_samples)
    calib_ds = load_npz(calib_data, x_key=x_key, y_key=None, require_labels=False, role="calib") if calib_data else None
    art_dir = out_dir / "artifacts"
    art_dir.mkdir(exist_ok=True)
    recipe = Recipe(gate={"max_accuracy_drop": max_accuracy_drop})
    gate_cfg = resolve_gate(spec, recipe, DeployOptions())
    measure = opts.measure or spec.measure
    screen = MeasureDefaults(**{**measure.model_dump(), "runs": min(opts.screening_runs, measure.runs),
                                "min_seconds": 0.0, "max_runs": min(opts.screening_runs, measure.runs)})

    # --- 1. build -------------------------------------------------------------------------------
    progress("loading the model")
    source = load_source(model, example_inputs=example_inputs or tuple(x[0:1] for x in eval_ds.xs), arch=arch,
                         workdir=art_dir)
    eval_ds = check_fits(eval_ds, source.artifact.io, "eval")
    if calib_ds is not None:
        calib_ds = check_fits(calib_ds, source.artifact.io, "calib")
    progress("computing reference outputs (and checking the metric fits them)")
    plan = eval_plan(metric_spec, source, eval_ds)
    if source.artifact.format == Format.TORCH:
        from ..convert.torch_to_onnx import export_onnx

        progress("exporting to ONNX")
        fp32 = export_onnx(source, art_dir / "fp32.onnx", list(eval_ds.xs))
    else:
        fp32 = source.artifact
    specs, skipped = (opts.candidates, []) if opts.candidates is not None else \
        candidate_variants(spec, has_calib=calib_ds is not None)
    cands = [Candidate(s) for s in specs]
    skipped_summ = [{"name": n, "status": "skipped", "reason": r} for n, r in skipped]
    ctx = PassContext(workdir=art_dir, calib=calib_ds, eval=eval_ds, extras={"source": source, "metric_plan": plan})
    for c in cands:
        if time.perf_counter() > deadline:
            c.drop("build", "time budget exhausted before this candidate was built")
            continue
        progress(f"building candidate {c.spec.name}")
        try:
            art = fp32
            for i, step in enumerate(c.spec.passes):
                art = get_pass(step.name)(art, step.config, ctx, out_name=f"{c.spec.name}-{i}-{step.name}")
            c.artifact, c.status = art, "built"
        except EdgekitError as exc:
            c.drop("build", f"build failed: {exc.message}")

    # --- 2. host filter -------------------------------------------------------------------------
    agent = _load_agent_module()
    eval_file = _eval_bundle_file(eval_ds, art_dir)  # what the device (and the host check) reads
    score_metric = plan.metric
    base_host = _host_accuracy(agent, fp32, source.artifact.io, eval_ds, eval_file, plan, art_dir) if opts.host_filter else None
    if opts.host_filter and base_host is not None:
        for c in [c for c in cands if c.status == "built"]:
            progress(f"host {score_metric.label()} of {c.spec.name}")
            try:
                c.host_accuracy = _host_accuracy(agent, c.artifact, source.artifact.io, eval_ds, eval_file, plan, art_dir)
            except Exception as exc:  # a candidate that cannot run on the host is measured on the device
                c.reason = f"host check skipped: {str(exc)[:200]}"
                continue
            if c.host_accuracy is not None and score_metric.worse_by(base_host, c.host_accuracy) > max_accuracy_drop + opts.host_slack:
                c.drop("host", f"host {score_metric.label()} {c.host_accuracy:.4g} vs fp32 {base_host:.4g}: worse by "
                               f"{score_metric.worse_by(base_host, c.host_accuracy):.4g} > tolerance {max_accuracy_drop:g} "
                               f"(+{opts.host_slack:g} slack)")

    # --- 3/4. device: screening, racing, finals -------------------------------------------------
    own = transport is None
    t = transport or open_transport(spec, device)
    final: dict[str, VariantResult] = {}
    docs: dict[str, dict] = {}
    final_outputs: dict[str, list] = {}
    try:
        deployer = BundleDeployer(t)
        from ..measure.cache import open_device_measurements

        measurements = open_device_measurements(deployer, device_name=device, remeasure=opts.remeasure)
        alive = [c for c in cands if c.status == "built"]
        remotes = deployer.deliver([*eval_files(eval_file), fp32.path, *{c.artifact.path for c in alive}])

        def measure_one(name: str, art: Artifact, m: MeasureDefaults) -> VariantResult:
            req = build_request(variant=name, artifact=art, model_remote=remotes[art.path],
                                source_io=source.artifact.io, measure=m, eval_remote=eval_remote(eval_file, remotes),
                                x_keys=eval_ds.x_keys, y_key=eval_ds.y_key,
                                outputs_remote=t.remote_path(f"results/{name}-{art.sha256[:12]}.npz"),
                                energy_sources=spec.energy_sources)
            res = measurements.measure(req, lambda: run_request(deployer, req))
            docs[name] = res.doc
            if m is measure and res.outputs is not None:
                final_outputs[name] = res.outputs
            return _variant_result(name, art, res, plan)

        progress("screening the fp32 baseline on the device")
        base_screen = measure_one("fp32", fp32, screen)
        base_acc = base_screen.accuracy.value if base_screen.accuracy else None
        entries = [race_entry("fp32", base_screen.latency_ms.raw or [])] if opts.objective in ("p50", "p99") else []
        for c in alive:
            if time.perf_counter() > deadline:
                c.drop("screening", "time budget exhausted before screening")
                continue
            progress(f"screening {c.spec.name} on the device ({opts.screening_runs} runs)")
            try:
                r = measure_one(c.spec.name, c.artifact, screen)
            except EdgekitError as exc:
                if exc.exit_code == 3 and "agent failed" not in exc.message:
                    raise  # the device or the link failed: not this candidate's fault
                c.drop("screening", f"failed on the device: {exc.message}")
                continue
            acc = r.accuracy.value if r.accuracy else None
            c.screening = {"p50": r.latency_ms.p50, "ci95": r.latency_ms.ci95, "accuracy": acc,
                           "peak_memory_mb": r.peak_memory_mb, "energy_mj_per_inference": r.energy_mj_per_inference}
            if acc is None or base_acc is None or score_metric.worse_by(base_acc, acc) > max_accuracy_drop + 1e-9:
                c.drop("screening", f"device {score_metric.label()} {acc} vs fp32 {base_acc}: outside the "
                                    f"{max_accuracy_drop:g} tolerance ({score_metric.direction} is better)")
                continue
            if gate_cfg.peak_memory_mb is not None and r.peak_memory_mb and r.peak_memory_mb > gate_cfg.peak_memory_mb:
                c.drop("screening", f"peak memory {r.peak_memory_mb:.1f} MB > budget {gate_cfg.peak_memory_mb:g} MB")
                continue
            if opts.objective in ("p50", "p99"):
                entries.append(race_entry(c.spec.name, r.latency_ms.raw or []))
        for name, why in clearly_slower(entries, opts.race_margin).items():
            if name != "fp32":  # the baseline is measured in the finals anyway: it is the reference
                next(c for c in cands if c.spec.name == name).drop("racing", why)

        progress("final measurement of the fp32 baseline")
        final["fp32"] = measure_one("fp32", fp32, measure)
        for c in [c for c in cands if c.status == "built"]:
            progress(f"final measurement of {c.spec.name}")
            final[c.spec.name] = measure_one(c.spec.name, c.artifact, measure)
            c.status = "finalist"
    finally:
        if own:
            t.close()

    # --- 5. select -----------------------------------------------------------------------------
    base = final["fp32"]
    stat_warnings = score_drops(list(final.values()), final_outputs, plan, "fp32", tolerance=max_accuracy_drop)
    for v in final.values():
        if v.latency_ms and base.latency_ms and v.latency_ms.p50 > 0:
            v.speedup_vs_baseline = round(base.latency_ms.p50 / v.latency_ms.p50, 3)
    # the fp32 baseline may ship too: when nothing compressed beats it, it is the honest answer
    finalists = [v for n, v in final.items() if v.accuracy_drop is not None and v.accuracy_drop <= max_accuracy_drop + 1e-9]
    for v in final.values():
        if v.name != "fp32" and v not in finalists:
            c = next(c for c in cands if c.spec.name == v.name)
            c.drop("finals", f"final {score_metric.label()} worse by {v.accuracy_drop} > {max_accuracy_drop:g}")
    if opts.objective == "energy" and finalists and all(v.energy_mj_per_inference is None for v in finalists):
        raise BadInputError(f"the energy objective needs an energy reading, and this device has none "
                            f"({finalists[0].energy_reason})", hint="use --objective p50, or add an energy source")
    chosen = _choose(finalists, opts.objective)
    warnings: list[str] = ([measurements.warning()] if measurements.warning() else []) + stat_warnings
    if chosen is not None:
        chosen.selected = True
        chosen_art = fp32
        for c in cands:
            if c.spec.name == chosen.name:
                c.status, chosen_art = "selected", c.artifact
        ship = _write_ship(out_dir, chosen, chosen_art)
        gate = evaluate_gate([base, chosen] if chosen is not base else [base], "fp32", gate_cfg,
                             latency_representative=_emulation(device) is None)
    else:
        best = max((v for n, v in final.items() if n != "fp32"), key=lambda v: -(v.accuracy_drop or 1e9), default=None)
        msg = f"no candidate stays inside the {score_metric.label()} tolerance and the budgets"
        if best is not None:
            msg += f"; the best found was {best.name}, worse by {best.accuracy_drop}"
        gate = Gate(passed=False, checks=[Check(name="search", passed=False, limit=max_accuracy_drop, message=msg)])
        ship = None
    variants = [base] + sorted((v for n, v in final.items() if n != "fp32"), key=lambda v: v.name)
    report = Report(
        edgekit_version=__version__,
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        target=spec.name,
        device=_device_info(docs["fp32"], t, device, spec, variants, _emulation(device)),
        model={"source": str(model), "sha256": source.artifact.sha256, "format": source.artifact.format.value},
        settings={"measure": measure.model_dump(), "screening": screen.model_dump(), "gate": gate_cfg.model_dump(),
                  "metric": _metric_settings(plan), "eval_inputs": list(eval_ds.x_keys),
                  "eval_data": str(eval_ds.path), "eval_samples": eval_ds.n, "eval_subset": eval_ds.sample, "calib_data": str(calib_ds.path) if calib_ds else None},
        baseline="fp32",
        variants=variants,
        gate=gate,
        warnings=warnings,
    )
    report.search = {  # type: ignore[attr-defined]  (Report keeps extra fields)
        "objective": opts.objective, "selected": chosen.name if chosen else None, "shipped": ship,
        "seconds": round(time.perf_counter() - started, 2), "time_budget_s": opts.time_budget_s,
        "candidates": [{"name": "fp32", "status": "selected" if chosen is base else "baseline",
                        "format": fp32.format.value, "precision": "fp32", "size_bytes": fp32.size_bytes,
                        "screening": {"p50": base_screen.latency_ms.p50, "ci95": base_screen.latency_ms.ci95}}]
                      + [c.summary() for c in cands] + skipped_summ,
    }
    if previous is not None and chosen is not None:
        from ..report.gate import compare_with_baseline

        compare_with_baseline(report, previous, baseline_report, gate_cfg)
    report.write(out_dir)
    return report


def _choose(finalists: list[VariantResult], objective: Objective) -> VariantResult | None:
    scored = [(v, _objective_value(v, objective)) for v in finalists]
    scored = [(v, s) for v, s in scored if s is not None]
    if not scored:
        return None
    best, best_s = min(scored, key=lambda p: (p[1], p[0].name))
    if objective not in ("p50", "p99"):
        return best
    # statistically indistinguishable from the best (overlapping CIs): the smallest file wins
    lo, hi = best.latency_ms.ci95
    ties = [v for v, _ in scored if v.latency_ms.ci95[0] <= hi and v.latency_ms.ci95[1] >= lo]
    return min(ties, key=lambda v: (v.size_bytes, v.name))


def _write_ship(out_dir: Path, v: VariantResult, art: Artifact) -> dict:
    ship_dir = out_dir / "ship"
    ship_dir.mkdir(exist_ok=True)
    dest = ship_dir / f"{v.name}{Path(art.path).suffix}"
    with atomic_path(dest) as tmp:
        shutil.copyfile(art.path, tmp)
    meta = {"variant": v.name, "file": str(dest), "sha256": art.sha256, "format": art.format.value,
            "precision": art.precision, "lineage": art.lineage_dicts(),
            "measured": {"p50_ms": v.latency_ms.p50 if v.latency_ms else None,
                         "accuracy": v.accuracy.value if v.accuracy else None, "accuracy_drop": v.accuracy_drop}}
    atomic_write_text(ship_dir / "ship.json", json.dumps(meta, indent=2))
    return {"file": str(dest), "sha256": art.sha256}


__all__ = ["SearchOptions", "search"]
