"""Baseline comparison: what changed between a previous report (a release) and this one, per variant
and metric, with the significance of each latency change.

Variants are matched by name. Latency changes come from the raw timings (bootstrap CI of the ratio
of medians + Mann-Whitney, see ``edgekit.measure.compare``); a report without raw timings falls back
to comparing the medians' confidence intervals. Size, memory and energy are single figures: their
change is reported as is, without a significance claim. An accuracy change carries a two-proportion
p-value for information; the gate judges accuracy in points.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..measure.compare import (
    DEFAULT_ALPHA,
    DEFAULT_MIN_EFFECT,
    compare_summaries,
    compare_timings,
    format_p,
    two_proportion_p,
)

# The diff's models are the report's ``comparison`` section, so they live in the schema (model.py);
# they are re-exported here, where they have always been imported from.
from .model import MetricChange, Report, ReportDiff, ReportIdentity, VariantDiff, VariantResult, provides


def _report_identity(r: Report) -> ReportIdentity:
    return ReportIdentity(
        created_at=r.created_at,
        edgekit_version=r.edgekit_version,
        target=r.target,
        device=r.device.name,
        model_sha256=r.model.get("sha256"),
        model=r.model.get("source"),
    )


def _raw(v: VariantResult) -> np.ndarray | None:
    lat = v.latency_ms
    if lat is None:
        return None
    if lat.raw:
        return np.asarray(lat.raw, dtype=np.float64)
    if lat.raw_path and Path(lat.raw_path).is_file():
        p = Path(lat.raw_path)
        try:
            return np.load(p) if p.suffix == ".npy" else np.asarray(json.loads(p.read_text()), dtype=np.float64)
        except (OSError, ValueError):
            return None
    return None


def _latency_change(a: VariantResult, b: VariantResult, alpha: float, min_effect: float) -> MetricChange:
    if a.latency_ms is None or b.latency_ms is None:
        return MetricChange(
            metric="latency_p50_ms",
            before=a.latency_ms.p50 if a.latency_ms else None,
            after=b.latency_ms.p50 if b.latency_ms else None,
            verdict="not measured",
            message="latency missing in one of the reports",
        )
    ra, rb = _raw(a), _raw(b)
    if ra is not None and rb is not None:
        cmp = compare_timings(ra, rb, alpha=alpha, min_effect=min_effect)
    else:
        (a_lo, a_hi), (b_lo, b_hi) = a.latency_ms.ci95[:2], b.latency_ms.ci95[:2]
        cmp = compare_summaries(
            a.latency_ms.p50, (a_lo, a_hi), b.latency_ms.p50, (b_lo, b_hi), alpha=alpha, min_effect=min_effect
        )
    before, after = a.latency_ms.p50, b.latency_ms.p50
    return MetricChange(
        metric="latency_p50_ms",
        before=before,
        after=after,
        change=after - before,
        change_rel=cmp.change,
        significant=cmp.significant,
        p_value=cmp.p_value,
        ratio_ci95=list(cmp.ratio_ci95),
        test=cmp.test,
        verdict=cmp.verdict,
        message=cmp.describe(),
    )


def _plain(
    metric: str, before: float | None, after: float | None, *, unit: str, up: str, down: str, tolerance: float = 0.0
) -> MetricChange:
    """A single-figure metric: the change as is (``tolerance`` is the relative change called unchanged)."""
    if before is None or after is None:
        return MetricChange(
            metric=metric,
            before=before,
            after=after,
            verdict="not measured",
            message=f"{metric} not measured in {'the baseline' if before is None else 'this'} report",
        )
    change = after - before
    rel = change / before if before else None
    if rel is not None and abs(rel) <= tolerance or change == 0:
        verdict = "unchanged"
    else:
        verdict = up if change > 0 else down
    rel_s = f" ({rel:+.1%})" if rel is not None else ""
    return MetricChange(
        metric=metric,
        before=before,
        after=after,
        change=change,
        change_rel=rel,
        verdict=verdict,
        message=f"{before:.4g} -> {after:.4g} {unit}{rel_s}: {verdict}",
    )


def _accuracy_change(a: VariantResult, b: VariantResult) -> MetricChange:
    """The task metric's change (direction-aware: for an error metric, a rise is worse). The two-proportion
    p-value applies to percentages of samples (top-k accuracy) only."""
    if a.accuracy is None or b.accuracy is None:
        return MetricChange(
            metric="accuracy",
            before=a.accuracy.value if a.accuracy else None,
            after=b.accuracy.value if b.accuracy else None,
            verdict="not measured",
            message="accuracy missing in one of the reports",
        )
    if a.accuracy.metric != b.accuracy.metric:
        return MetricChange(
            metric="accuracy",
            before=a.accuracy.value,
            after=b.accuracy.value,
            verdict="not comparable",
            message=f"the reports score different metrics ({a.accuracy.metric} vs {b.accuracy.metric})",
        )
    before, after = a.accuracy.value, b.accuracy.value
    lower = b.accuracy.direction == "lower"
    change = after - before
    worse = -change if not lower else change
    proportion = b.accuracy.metric.startswith("top")
    p = two_proportion_p(before, a.accuracy.n, after, b.accuracy.n) if proportion else None
    verdict = "unchanged" if abs(change) < 1e-9 else ("worse" if worse > 0 else "better")
    note = "" if a.accuracy.n == b.accuracy.n else f" (eval sets differ: n {a.accuracy.n} vs {b.accuracy.n})"
    units = " pts" if b.accuracy.units == "%" else (f" {b.accuracy.units}" if b.accuracy.units else "")
    test = f", two-proportion p={format_p(p)}" if proportion else ""
    return MetricChange(
        metric="accuracy",
        before=before,
        after=after,
        change=change,
        change_rel=change / before if before else None,
        p_value=p,
        test="two-proportion z-test" if proportion else None,
        significant=None if p is None else p < DEFAULT_ALPHA,
        verdict=verdict,
        worse_by=worse,
        message=(f"{before:.2f}% -> {after:.2f}%" if units == " pts" else f"{before:.4g} -> {after:.4g}")
        + f" {b.accuracy.metric} ({change:+.4g}{units}{test}){note}: {verdict}",
    )


def diff_variant(
    a: VariantResult, b: VariantResult, *, alpha: float = DEFAULT_ALPHA, min_effect: float = DEFAULT_MIN_EFFECT
) -> VariantDiff:
    """Changes of variant ``b`` relative to variant ``a``."""
    changes = [_latency_change(a, b, alpha, min_effect)]
    for q in ("p90", "p99"):
        changes.append(
            _plain(
                f"latency_{q}_ms",
                getattr(a.latency_ms, q) if a.latency_ms else None,
                getattr(b.latency_ms, q) if b.latency_ms else None,
                unit="ms",
                up="slower",
                down="faster",
                tolerance=min_effect,
            )
        )
        # tail percentiles are noisy and untested: they inform, the gate uses p50
        changes[-1].verdict = changes[-1].verdict.replace("slower", "higher").replace("faster", "lower")
        changes[-1].message = changes[-1].message.replace("slower", "higher").replace("faster", "lower")
    changes.append(_accuracy_change(a, b))
    changes.append(
        _plain(
            "peak_memory_mb",
            a.peak_memory_mb,
            b.peak_memory_mb,
            unit="MB",
            up="larger",
            down="smaller",
            tolerance=min_effect,
        )
    )
    changes.append(
        _plain("size_bytes", float(a.size_bytes), float(b.size_bytes), unit="bytes", up="larger", down="smaller")
    )
    if a.energy_mj_per_inference is not None or b.energy_mj_per_inference is not None:
        changes.append(
            _plain(
                "energy_mj",
                a.energy_mj_per_inference,
                b.energy_mj_per_inference,
                unit="mJ",
                up="higher",
                down="lower",
                tolerance=min_effect,
            )
        )
    return VariantDiff(variant=b.name, changes=changes)


def shipped_name(r: Report) -> str | None:
    """The variant a report ships: the search's choice, or the deploy's decision, else the one marked selected."""
    if r.search is not None and r.search.selected:
        return r.search.selected
    if r.decision is not None and r.decision.ship:
        return r.decision.ship
    return next((v.name for v in r.variants if v.selected), None)


def counterpart(previous: Report, name: str, shipped: str | None = None) -> VariantResult | None:
    """The previous report's variant that ``name`` is judged against: its namesake; else, for the
    variant this run ships (``shipped``), the one the previous run shipped. A search's choice can
    change between releases (tflite-int8, then ort-int8-mixed, or a tuned ``@t2`` row): the release
    is still judged, file shipped against file shipped, not waved through for want of a name."""
    old = {v.name: v for v in previous.variants}
    if name in old:
        return old[name]
    prev = shipped_name(previous) if shipped is not None and name == shipped else None
    return old.get(prev) if prev else None


@provides  # Report.diff
def diff_reports(
    baseline: Report, current: Report, *, alpha: float = DEFAULT_ALPHA, min_effect: float = DEFAULT_MIN_EFFECT
) -> ReportDiff:
    """What changed in ``current`` relative to ``baseline`` (e.g. the last release's report). Variants
    pair by name, and the shipped one with the previously shipped one (``counterpart``)."""
    old = {v.name: v for v in baseline.variants}
    new = {v.name: v for v in current.variants}
    shipped = shipped_name(current)
    pairs = {n: counterpart(baseline, n, shipped) for n in new}
    paired_old = {o.name for o in pairs.values() if o is not None}
    d = ReportDiff(
        baseline=_report_identity(baseline),
        current=_report_identity(current),
        alpha=alpha,
        min_effect=min_effect,
        added=[n for n in new if pairs[n] is None],
        removed=[n for n in old if n not in new and n not in paired_old],
    )
    for name, v in new.items():
        was = pairs[name]
        if was is not None:
            vd = diff_variant(was, v, alpha=alpha, min_effect=min_effect)
            if was.name != name:
                vd.baseline_variant = was.name
            d.variants.append(vd)
    if baseline.target != current.target:
        d.warnings.append(f"targets differ ({baseline.target} vs {current.target}): latency is not comparable")
    if baseline.device.name != current.device.name:
        d.warnings.append(
            f"devices differ ({baseline.device.name} vs {current.device.name}): "
            "latency changes may come from the device, not the model"
        )
    for name, v in new.items():
        reused = v.measurement.get("reused")
        old_lat = old[name].latency_ms if name in old else None
        if reused and v.latency_ms and old_lat and v.latency_ms.raw == old_lat.raw:
            d.warnings.append(
                f"{name}: this run reused the baseline's own measurement from the measurement cache, so "
                "latency cannot have changed; pass --remeasure to measure again"
            )
        if name in old and old[name].runtime.threads != v.runtime.threads:
            d.warnings.append(f"{name}: thread counts differ ({old[name].runtime.threads} vs {v.runtime.threads})")
    return d


def render_diff_markdown(d: ReportDiff) -> str:
    b = d.baseline
    lines = [
        f"Compared with the report of {b.created_at} (edgekit {b.edgekit_version}, "
        f"model sha256 `{str(b.model_sha256)[:12]}`); latency threshold {d.min_effect:.0%}, "
        f"alpha {d.alpha:g}.",
        "",
        "| variant | metric | before | after | change | significance | verdict |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for v in d.variants:
        for c in v.changes:
            rel = "" if c.change_rel is None else f"{c.change_rel:+.1%}"
            sig = (
                "n/a"
                if c.significant is None and c.p_value is None
                else (f"p={format_p(c.p_value)}" if c.p_value is not None else "CI")
                + (" (sig.)" if c.significant else "")
            )
            name = v.variant + (f" (vs {v.baseline_variant})" if v.baseline_variant else "")
            lines.append(
                f"| {name} | {c.metric} | {_num(c.before)} | {_num(c.after)} | {rel} | {sig} | "
                f"{'**' + c.verdict + '**' if c.is_regression else c.verdict} |"
            )
    if d.added:
        lines += ["", f"New variants (nothing to compare): {', '.join(d.added)}."]
    if d.removed:
        lines += ["", f"Variants no longer built: {', '.join(d.removed)}."]
    lines += [f"- warning: {w}" for w in d.warnings]
    return "\n".join(lines) + "\n"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


__all__ = [
    "MetricChange",
    "ReportDiff",
    "ReportIdentity",
    "VariantDiff",
    "diff_reports",
    "diff_variant",
    "render_diff_markdown",
]
