"""One report from one run's measurements, for ``deploy`` and ``search`` alike: metric drops with
their paired statistics, speed-ups over the baseline, the baseline-report comparison, the gate and
every warning (unstable latency, a slower "compressed" variant, reused measurements, emulation). It reads
the run (``prepare.PreparedRun``) and its device session, so it sits with the orchestration, above ``report/``."""

from __future__ import annotations

import datetime as _dt
import time
from typing import TYPE_CHECKING, Any

from ..inputs.recipe import GateConfig
from ..metrics.evaluate import EvalPlan, score_drops
from ..report.gate import evaluate_gate, slower_warnings
from ..report.model import DeviceInfo, Gate, Report, SearchSection, VariantResult
from ..report.release import compare_reports
from ..version import __version__

if TYPE_CHECKING:
    from ..devices.session import DeviceSession, Measured
    from ..report.release import ReleaseJudgement
    from .prepare import PreparedRun


def tolerance(cfg: GateConfig, base: VariantResult) -> float | None:
    """The accuracy tolerance in the metric's units (relative: percent of the baseline's value)."""
    if base.accuracy is None:
        return None
    return float(cfg.max_accuracy_drop * (abs(base.accuracy.value) / 100.0 if cfg.relative_accuracy_drop else 1.0))


def score(
    measured: dict[str, "Measured"], plan: EvalPlan, baseline: str, cfg: GateConfig, *, stats: bool = True
) -> list[str]:
    """Fill accuracy drops and speed-ups of every measured variant in place. The paired statistics
    (a bootstrap: thousands of metric evaluations for a non-decomposable metric such as mAP) are
    computed once per measured variant, however often a search asks; ``stats=False`` gives the point
    drop only (screening, unless --strict-stats needs the significance)."""
    base = measured[baseline].result
    if stats:
        todo = {n: m for n, m in measured.items() if n == baseline or m.result.accuracy_stats is None}
        if len(todo) > 1:
            for w in score_drops(
                [m.result for m in todo.values()],
                {n: m.outputs for n, m in todo.items() if m.outputs is not None},
                plan,
                baseline,
                tolerance=tolerance(cfg, base),
            ):
                owner = next((n for n in todo if w.startswith(f"{n}:")), baseline)
                todo[owner].score_warnings.append(w)
    for v in (m.result for m in measured.values()):
        if not stats and v.accuracy is not None and base.accuracy is not None and v.accuracy_drop is None:
            v.accuracy_drop = round(plan.metric.worse_by(base.accuracy.value, v.accuracy.value), 6) + 0.0
        if v.latency_ms and base.latency_ms and v.latency_ms.p50 > 0:
            v.speedup_vs_baseline = round(base.latency_ms.p50 / v.latency_ms.p50, 3)
            wp50, bwp50 = (getattr(x.latency_ms, "weighted_p50", None) for x in (v, base))
            if wp50 and bwp50:  # eval data at several shapes: the speed-up of an average sample of the set
                v.speedup_weighted = round(bwp50 / wp50, 3)
    return [w for m in measured.values() for w in m.score_warnings]


def metric_settings(plan: EvalPlan) -> dict[str, Any]:
    return {
        "name": plan.metric.label(),
        "direction": plan.metric.direction,
        "units": plan.metric.units,
        "outputs": [plan.output_names[i] for i in plan.output_idx],
        "against": plan.against,
        "all_outputs": plan.output_names,
        **({"postprocess": plan.spec.postprocess} if plan.spec.postprocess else {}),
        **({"options": plan.spec.options} if plan.spec.options else {}),
    }


def run_warnings(
    measured: dict[str, "Measured"], baseline: str, session: "DeviceSession", judged: list[str] | None = None
) -> list[str]:
    results = [m.result for m in measured.values()]
    # a search's other rows (finalists, runtime settings) lost: report.decision says why, once
    out = slower_warnings([v for v in results if judged is None or v.name in judged or v.name == baseline], baseline)
    for m in measured.values():
        v = m.result
        if v.latency_ms and not v.latency_ms.stable:
            out.append(
                f"{v.name}: latency is unstable (robust CoV {v.latency_ms.robust_cov or 0:.1%}, "
                f"CoV {v.latency_ms.cov:.1%}); the device may be busy"
            )
        out += [f"{v.name}: {w}" for w in m.doc.get("warnings") or []]
        out += [f"{v.name}: {w}" for w in (v.sustained or {}).get("warnings", [])]
    return out + session.warnings()


def new_report(
    *,
    target: str,
    session: "DeviceSession | None",
    first_doc: dict[str, Any] | None,
    results: list[VariantResult],
    model: dict[str, Any],
    started: float,
    settings: dict[str, Any],
    baseline: str,
    gate: Gate,
    warnings: list[str],
    search: SearchSection | None = None,
    device: DeviceInfo | None = None,
) -> Report:
    """The report every kind of model's run writes: the identity (version, time, target), the device facts
    (from the first measured document and the session, before and after), what the session delivered, the
    run's wall time, and the kind's own model facts, settings, rows, gate and warnings. A run with no device
    session (a microcontroller's: TFLite Micro on this host) passes ``session=None`` and its own ``device``."""
    if session is not None and first_doc:
        device = DeviceInfo.model_validate(session.device_info(first_doc, results))
    delivered = (
        {}
        if session is None
        else {
            "delivery": {
                "files_sent": session.delivery.files_sent,
                "files_reused": session.delivery.files_reused,
                "bytes_sent": session.delivery.bytes_sent,
                "sent_by_kind": dict(session.delivery.sent_by_kind),
            }
        }
    )
    return Report(
        edgekit_version=__version__,
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        target=target,
        device=device or DeviceInfo(),
        model=model,
        settings={
            **settings,
            **delivered,
            "wall_seconds": round(time.perf_counter() - started, 2),
        },
        baseline=baseline,
        variants=results,
        gate=gate,
        warnings=warnings,
        search=search,
    )


def assemble_report(
    run: "PreparedRun",
    measured: dict[str, "Measured"],
    session: "DeviceSession",
    *,
    baseline: str,
    warnings: list[str],
    settings: dict[str, Any] | None = None,
    judged: list[str] | None = None,
    gate: Gate | None = None,
    search: SearchSection | None = None,
    release: "ReleaseJudgement | None" = None,
    scored: bool = False,
) -> Report:
    """``measured``: the variants in report order (the baseline among them). ``judged``: the names
    the gate judges (default: every non-baseline variant). ``gate``: a verdict decided by the caller
    (a search where nothing qualified). ``release``: the A/B or normalized latency judgement."""
    warnings = list(warnings)
    if not scored:
        warnings += score(measured, run.plan, baseline, run.gate)
    warnings += run_warnings(measured, baseline, session, judged)
    results = [m.result for m in measured.values()]
    ds = run.eval_ds
    report = new_report(
        target=run.target.name,
        session=session,
        first_doc=measured[baseline].doc,
        results=results,
        model=run.model_facts(),
        started=run.started,
        settings={
            "measure": run.measure.model_dump(),
            "gate": run.gate.model_dump(),
            "recipe": run.recipe.model_dump(mode="json"),
            "metric": metric_settings(run.plan),
            "eval_data": str(ds.path),
            "eval_samples": ds.total,
            "eval_inputs": list(ds.x_keys),
            **(
                {
                    "eval_shape_buckets": [
                        {"shapes": [list(x) for x in b.shapes], "samples": b.n, "shards": list(b.shard_ids)}
                        for b in ds.buckets
                    ]
                }
                if ds.buckets
                else {}
            ),
            "eval_subset": ds.sample,
            "calib_data": str(run.calib_ds.path) if run.calib_ds else None,
            "train_data": str(run.train_ds.path) if run.train_ds else None,
            **(settings or {}),
        },
        baseline=baseline,
        gate=gate or Gate(passed=False),
        warnings=warnings,
        search=search,
    )
    diff = None
    if run.previous is not None:
        diff = compare_reports(
            report,
            run.previous,
            run.previous_path,
            run.gate,
            judgements=release.judgements if release else None,
            method=release.method if release else "direct",
            method_detail=release.detail if release else None,
        )
    if gate is None:
        report.gate = evaluate_gate(
            results, baseline, run.gate, diff, judged=judged, latency_representative=session.emulation is None
        )
    return report
