"""The release gate: every variant that could ship must stay inside the accuracy tolerance, the
latency/memory/size budgets, and (for float hops) its parity tolerance.

Which variants are judged: the non-baseline variants (what compression produced) when there are
any, else the baseline itself. A budget that is None is not checked.

With a previous release's report (``diff``, see ``diff.py``), each judged variant is also checked
against its namesake there (``release.release_checks``; release.py knows nothing of this gate): a
significant p50 latency regression above ``max_latency_regression``, an accuracy drop above
``max_release_accuracy_drop`` points, a peak memory or size increase above its fraction. A latency
change fails only when it is both statistically significant and above the threshold, so run-to-run
noise on a busy device does not fail a release.
"""

from __future__ import annotations

from pathlib import Path

from ..inputs.recipe import GateConfig
from .diff import ReportDiff
from .model import Check, Gate, Report, VariantResult
from .profile_diff import is_slower, measured_p50s, profile_diff
from .release import compare_reports, release_checks


def evaluate_gate(
    variants: list[VariantResult],
    baseline: str,
    cfg: GateConfig,
    diff: ReportDiff | None = None,
    *,
    latency_representative: bool = True,
    judged: list[str] | None = None,
) -> Gate:
    """``latency_representative=False`` (an emulated device): latency budgets are not applicable and
    say so, instead of failing a release on emulation speed. ``judged``: the names of the variants
    that could ship (default: every non-baseline variant, else the baseline); a search judges only
    the one it selected."""
    checks: list[Check] = []
    base = next((v for v in variants if v.name == baseline), None)
    if judged is not None:
        judged_v = [v for v in variants if v.name in set(judged)]
    else:
        judged_v = [v for v in variants if v.name != baseline] or ([base] if base else [])

    if cfg.check_parity:
        seen: set[tuple[str, str | None, str]] = set()
        for v in variants:
            for step in v.lineage:
                violations = step.parity_violations
                # one check per distinct hop: the same input converted at another precision is another hop
                key = (step.name, step.input_sha256, step.config_key())
                if step.kind == "convert" and violations is not None and key not in seen:
                    seen.add(key)
                    checks.append(
                        Check(
                            name=f"parity[{step.name}]",
                            variant=v.name,
                            passed=not violations,
                            message="within tolerance" if not violations else "; ".join(violations),
                        )
                    )

    for v in judged_v:
        if base is not None and v is not base:
            checks.append(_accuracy_check(v, base, cfg))
        for name, q, lim in (
            ("latency_p50_budget", "p50", cfg.latency_ms_p50),
            ("latency_p90_budget", "p90", cfg.latency_ms_p90),
        ):
            if lim is not None and not latency_representative:
                checks.append(
                    Check(
                        name=name,
                        variant=v.name,
                        limit=lim,
                        passed=True,
                        skipped=True,
                        message="not applicable: the device is emulated, its latency is not "
                        "representative of real hardware (run on the real board to check it)",
                    )
                )
                continue
            _budget(checks, v, name, getattr(v.latency_ms, q) if v.latency_ms else None, lim, "ms")
        if cfg.min_speedup is not None and base is not None and v is not base:
            checks.append(_speedup_check(v, cfg.min_speedup, latency_representative, base))
        _budget(checks, v, "peak_memory_budget", v.peak_memory_mb, cfg.peak_memory_mb, "MB")
        _budget(checks, v, "model_size_budget", v.size_bytes / 1e6, cfg.model_size_mb, "MB")
    if diff is not None:
        for v in judged_v:
            checks.extend(release_checks(v.name, diff, cfg))
    return Gate(passed=all(c.passed for c in checks), checks=checks)


def _accuracy_check(v: VariantResult, base: VariantResult, cfg: GateConfig) -> Check:
    """The metric may get at most ``max_accuracy_drop`` worse (its units and direction). With
    ``strict_stats`` the check fails only when the drop is also significant on the paired samples."""
    if v.accuracy is None or base.accuracy is None:
        return Check(
            name="accuracy_drop",
            variant=v.name,
            limit=cfg.max_accuracy_drop,
            passed=False,
            message="the metric was not measured (no eval outputs came back)",
        )
    a, b = v.accuracy, base.accuracy
    lower = a.direction == "lower"
    drop = v.accuracy_drop if v.accuracy_drop is not None else ((a.value - b.value) if lower else (b.value - a.value))
    limit = cfg.max_accuracy_drop * (abs(b.value) / 100.0 if cfg.relative_accuracy_drop else 1.0)
    over = drop > limit + 1e-9
    st = v.accuracy_stats or {}
    ci = st.get("ci95")
    stat_txt = f" (paired 95% CI [{ci[0]:+.3g}, {ci[1]:+.3g}], p={st.get('p_value', float('nan')):.3g})" if ci else ""
    ok = not over
    if over and cfg.strict_stats:
        ok = not st.get("significant", True)  # no statistics: judged on the point estimate
    units = "pts" if a.units == "%" else (a.units or "")

    def fmt(x: float) -> str:
        return f"{x:.2f}{'%' if a.units == '%' else ''}" if a.units in ("%", "dB") else f"{x:.4g}"

    msg = (
        f"{a.metric} {fmt(a.value)} vs baseline {fmt(b.value)} ({'lower' if lower else 'higher'} is better): "
        f"{('worse' if drop > 0 else 'better') + f' by {abs(drop):.4g} {units}' if drop else 'no change'}"
        f"{stat_txt} {'>' if over else '<='} "
        f"{limit:.4g}" + (" (relative)" if cfg.relative_accuracy_drop else "")
    )
    if over and cfg.strict_stats:
        msg += "; strict statistics: significant, fails" if not ok else "; strict statistics: within noise, passes"
    return Check(
        name="accuracy_drop",
        variant=v.name,
        value=round(drop, 6),
        limit=round(limit, 6),
        passed=ok,
        message=msg,
        p_value=st.get("p_value"),
        significant=st.get("significant"),
    )


def _speedup_check(v: VariantResult, limit: float, representative: bool, base: VariantResult | None = None) -> Check:
    if not representative:
        return Check(
            name="min_speedup",
            variant=v.name,
            limit=limit,
            passed=True,
            skipped=True,
            message="not applicable: the device is emulated, its latency is not representative",
        )
    sp = v.speedup_vs_baseline
    if sp is None:
        return Check(
            name="min_speedup",
            variant=v.name,
            limit=limit,
            passed=False,
            message="latency was not measured, so the speed-up cannot be shown",
        )
    ok = sp >= limit
    why = ""
    if not ok and base is not None and v.op_profile is not None and base.op_profile is not None:
        why = (
            "; per-op profile: "
            + profile_diff(base.op_profile, v.op_profile, base.name, v.name, measured_p50s(base, v)).summary
        )
    return Check(
        name="min_speedup",
        variant=v.name,
        value=sp,
        limit=limit,
        passed=ok,
        message=f"{sp:.2f}x the baseline's speed on the device {'>=' if ok else '<'} {limit:g}x{why}",
    )


def slower_warnings(variants: list[VariantResult], baseline: str) -> list[str]:
    """A compressed variant that is slower than the baseline on the device is said, never silent:
    p50 95% CIs separated (the variant's lower bound above the baseline's upper bound), with the
    per-op profiles' reason when both were profiled."""
    base = next((v for v in variants if v.name == baseline), None)
    out: list[str] = []
    if base is None or base.latency_ms is None:
        return out
    for v in variants:
        if is_slower(v, base) and v.latency_ms is not None:
            why = ""
            if v.op_profile is not None and base.op_profile is not None:
                why = (
                    "; per-op profile: "
                    + profile_diff(base.op_profile, v.op_profile, baseline, v.name, measured_p50s(base, v)).summary
                )
            out.append(
                f"{v.name} is SLOWER than {baseline} on the device: p50 {v.latency_ms.p50:.4g} ms vs "
                f"{base.latency_ms.p50:.4g} ms ({v.speedup_vs_baseline or 0:.2f}x); compression did not pay "
                f"here (--min-speedup 1 makes this a failing check){why}"
            )
    return out


def _budget(
    checks: list[Check], v: VariantResult, name: str, value: float | None, limit: float | None, unit: str
) -> None:
    if limit is None:
        return
    if value is None:
        checks.append(
            Check(
                name=name,
                variant=v.name,
                limit=limit,
                passed=False,
                message=f"not measured, so the {limit:g} {unit} budget cannot be shown to hold",
            )
        )
        return
    ok = value <= limit
    checks.append(
        Check(
            name=name,
            variant=v.name,
            value=round(value, 4),
            limit=limit,
            passed=ok,
            message=f"{value:.3f} {unit} {'<=' if ok else '>'} budget {limit:g} {unit}",
        )
    )


def compare_with_baseline(report: Report, baseline_report: Report, baseline_path: str | Path, cfg: GateConfig) -> None:
    """Compare ``report`` with a previous report (direct method), record which one, and re-judge
    the gate with the release checks, on the variants the gate judged before."""
    d = compare_reports(report, baseline_report, baseline_path, cfg)
    judged = sorted({c.variant for c in report.gate.checks if c.variant and not c.name.startswith("parity[")}) or None
    report.gate = evaluate_gate(
        report.variants,
        report.baseline,
        cfg,
        d,
        judged=judged,
        latency_representative=report.device.is_latency_representative,
    )
