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

One gate for every kind of model (:func:`variant_checks`): a fixed graph is judged on its metric against the
baseline, a generator (a language model, ``llm/``) on its quality from the device's own log-probabilities; the
memory and size budgets apply to both.

A generator's checks (``GateConfig.max_kld``, ``max_perplexity_increase``); their defaults, and why:

- ``max_kld`` (default 0.05 nats a token): between what llama.cpp's own KL measurements call good and lossy
  4-bit on Llama-3-8B (Q4_K_M 0.031, Q4_0 0.072; Q8_0 0.0014): the best 4-bit formats pass, the lossy ones do
  not, and 8-bit passes with a wide margin. Judged on the mean KLD's point value; the report gives its CI.
- ``max_perplexity_increase`` (default 0.05: 5% over the float model's perplexity on the same text): the
  order of Q4_K_M's increase on 7-8B models; tiny models lose more and are right to fail it.
- the KLD must be judgeable: the device returns log-probabilities at the float model's most likely tokens only,
  so the KLD is a lower bound that leaves out the float model's mass outside them. By default each position's
  tokens are sized to hold 99.5% of that mass (``KLD_COVERAGE``), so on a trained model the bound is tight
  (a 15.5M Qwen2 trained here had only 85% inside a fixed top-256: every file, the baseline too, failed then).
  Where the mass left out still averages over ``MAX_TAIL_MASS`` (5%), only possible when a distribution is too
  flat for the transfer cap, the KLD is reported but not judged, and the other checks decide; with a fixed
  ``--top-k`` the check fails instead, asking for a larger K (on random-weight models the top-256 held 3% of
  the mass and the bound read 25-35x below the full KLD).
- degeneration can never pass: a variant whose greedy continuation repeats one token for more than half of
  its tokens where the float model's does not (``MAX_REPEAT_SHARE``), or whose KLD is more than 20x the bar.
"""

from __future__ import annotations

from pathlib import Path

from ..inputs.recipe import GateConfig
from .diff import ReportDiff
from .model import Check, Gate, LMQuality, Report, VariantResult
from .profile_diff import is_slower, measured_p50s, profile_diff
from .release import compare_reports, release_checks

DEFAULT_MAX_KLD = 0.05
DEFAULT_MAX_PPL_INCREASE = 0.05
MAX_REPEAT_SHARE = 0.5
MAX_TAIL_MASS = 0.05
# the float model's mass a position's scored tokens hold by default (llm/quality.py sizes them to it), so that the
# KLD's lower bound is tight enough to judge
KLD_COVERAGE = 0.995


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
        checks += variant_checks(v, cfg, base, latency_representative=latency_representative)
    if diff is not None:
        for v in judged_v:
            checks.extend(release_checks(v.name, diff, cfg))
    return Gate(passed=all(c.passed for c in checks), checks=checks)


def variant_checks(
    v: VariantResult,
    cfg: GateConfig,
    base: VariantResult | None = None,
    *,
    generation: bool | None = None,
    latency_representative: bool = True,
) -> list[Check]:
    """What one variant that could ship must meet. A generator (``generation``; default: it has generation or
    quality figures): its quality on the eval text (KLD, perplexity, degeneration); a fixed graph: its metric
    against ``base`` (not when it is the base), its latency budgets (not applicable on an emulated device) and
    ``min_speedup``. Both: the peak-memory and file-size budgets."""
    checks: list[Check] = []
    if generation if generation is not None else (v.generation is not None or v.quality is not None):
        checks += _generation_checks(v, cfg)
    else:
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
    return checks


def kld_check(v: VariantResult, q: LMQuality, cfg: GateConfig) -> Check:
    """The KLD against the limit, when the scored tokens held enough of the float model's mass to judge it.

    By default each position's tokens are sized to hold ``KLD_COVERAGE`` of the float mass, so the bound is
    tight; only a distribution too flat for the transfer cap leaves more than ``MAX_TAIL_MASS`` out, and then
    the KLD is not judged (reported, skipped, the perplexity and degeneration checks decide). A fixed
    ``--top-k`` that leaves it out fails instead: the user chose the loose bound, and a larger K fixes it."""
    tail = q.float_tail_mass_mean or 0.0
    loose = q.kld_bound == "lower" and tail > MAX_TAIL_MASS
    bound = f" (a lower bound: {tail:.1%} of the float mass outside the scored tokens)" if tail > 1e-6 else ""
    verdict = (
        f"mean KL divergence from the float model {q.kld_mean:.4g} nats/token (95% CI {_ci(q.kld_ci95)}) "
        f"vs limit {cfg.max_kld}{bound}"
    )
    passed, skipped, message = q.kld_mean <= cfg.max_kld, False, verdict
    if loose and q.coverage_target is not None:
        passed, skipped = True, True
        message = (
            f"KLD not judged: the float model's distribution is too flat on this text for the transfer "
            f"cap ({q.scored_ids} ids a variant, the flattest positions cut to {q.top_k_capped_at} tokens): the "
            f"scored tokens hold {1 - tail:.0%} of its mass, so {q.kld_mean:.4g} nats/token is only a lower "
            f"bound; the perplexity and degeneration checks decide (--top-k K scores K tokens everywhere)"
        )
    elif loose:
        passed = False
        message = (
            f"KLD not judgeable: the float model's top-{q.top_k} tokens hold only {1 - tail:.0%} of "
            f"its probability mass on this text, so {q.kld_mean:.4g} nats/token is a lower bound "
            f"that could hide a loss (drop --top-k: by default each position's tokens hold "
            f"{KLD_COVERAGE:.1%} of the mass; or a larger --top-k, up to the vocabulary)"
        )
    return Check(
        name="kld", variant=v.name, value=q.kld_mean, limit=cfg.max_kld, passed=passed, skipped=skipped, message=message
    )


def _generation_checks(v: VariantResult, cfg: GateConfig) -> list[Check]:
    q = v.quality
    if q is None:
        return [Check(name="quality", variant=v.name, passed=False, message="no quality measured on the eval text")]
    # the baseline too: it is the float model on the device's runtime, compared with PyTorch's (never with itself)
    checks = [kld_check(v, q, cfg)]
    checks += [
        Check(
            name="perplexity_increase",
            variant=v.name,
            value=q.perplexity_increase,
            limit=cfg.max_perplexity_increase,
            passed=q.perplexity_increase <= cfg.max_perplexity_increase,
            message=f"perplexity {q.perplexity:.4g} vs float {q.perplexity_float:.4g}: "
            f"{q.perplexity_increase:+.2%} (95% CI {_ci(q.perplexity_increase_ci95, pct=True)}) "
            f"vs limit {cfg.max_perplexity_increase:+.0%}",
        ),
    ]
    rep = (q.greedy or {}).get("repeat_share")
    rep_f = (q.greedy or {}).get("repeat_share_float", 0.0) or 0.0
    collapsed = rep is not None and rep > MAX_REPEAT_SHARE and rep > rep_f + 0.25
    far = q.kld_mean > 20 * cfg.max_kld
    checks.append(
        Check(
            name="degenerate",
            variant=v.name,
            value=rep,
            limit=MAX_REPEAT_SHARE,
            passed=not (collapsed or far),
            message=(
                f"greedy output repeats one token for {rep:.0%} of its tokens (float model: {rep_f:.0%})"
                if collapsed
                else f"KLD {q.kld_mean:.3g} is over 20x the limit: the model's distribution is destroyed"
                if far
                else "generates like the float model (no collapse onto one token)"
            ),
        )
    )
    return checks


def _ci(ci: list[float] | None, pct: bool = False) -> str:
    if not ci:
        return "n/a"
    return f"[{ci[0]:+.2%}, {ci[1]:+.2%}]" if pct else f"[{ci[0]:.3g}, {ci[1]:.3g}]"


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
