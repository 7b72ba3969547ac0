"""The release gate against a previous report (``deploy --baseline previous/report.json``).

Latency measured a day (or a minute) apart on a shared device differs because the device changed:
other load, clocks, heat. Comparing raw timings across runs therefore cries wolf (an unchanged model
failed 1 run in 3 here). So the latency check is judged, in this order of preference:

* ``ab``: the baseline report's own model file of each judged variant (found at the path it records,
  beside the report, in ``--baseline-artifacts``, or in the pass cache, always checked by sha256) is
  re-measured in this device session, in alternating short blocks with the new one inside one agent
  process (A B, B A, A B ...);
  the ratio is the median of the per-block ratios of medians, with a bootstrap CI over the blocks. Drift hits both
  sides alike and cancels.
* ``normalized``: each variant's p50 divided by the reference variant (the baseline, e.g. fp32)
  measured in the same run, compared with the same ratio in the previous report. Valid only when the
  reference is the same file in both runs (same sha256), else the ratio would hide a change in it.
* ``direct``: the raw timings of the two runs (edgekit.measure.compare); said to be drift-prone.

A regression fails only when it is significant (the CI excludes 1) and above
``max_latency_regression``. The report's ``compared_with.method`` says which method judged it.
This module is the statistics and the checks; finding the baseline's files and re-measuring them in the
device session is ``orchestration/release.py``'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BadInputError
from ..fsutil import sha256_file
from ..inputs.recipe import GateConfig
from ..measure.compare import format_p
from ..measure.stats import BOOTSTRAP_SEED, ABBlocks
from .diff import MetricChange, ReportDiff, diff_reports
from .model import Check, ComparedWith, Report, VariantResult

METHOD_TEXT = {
    "ab": "A/B interleaved re-measurement of the baseline report's model in this session",
    "normalized": "each variant's p50 relative to the reference variant measured in the same run",
    "direct": "raw timings of the two runs compared directly (drift between runs is not removed)",
}


@dataclass(frozen=True)
class LatencyJudgement:
    method: str  # ab | normalized | direct
    ratio: float  # new / old (> 1: slower)
    ci95: tuple[float, float]
    significant: bool
    detail: dict[str, Any]
    p_value: float | None = None
    test: str = ""

    def describe(self) -> str:
        lo, hi = self.ci95
        p = f", {self.test} p={format_p(self.p_value)}" if self.test else ""
        return (
            f"{abs(self.ratio - 1):.1%} {'slower' if self.ratio > 1 else 'faster'} by {self.method} "
            f"(ratio {self.ratio:.3f}, 95% CI {lo:.3f}-{hi:.3f}{p}, "
            f"{'significant' if self.significant else 'not significant'})"
        )


def _bootstrap(
    stat: Callable[..., float],
    arrays: list[np.ndarray[Any, np.dtype[np.float64]]],
    resamples: int = 2000,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    vals = np.empty(resamples)
    for i in range(resamples):
        vals[i] = stat(*[a[rng.integers(0, a.size, a.size)] for a in arrays])
    lo, hi = np.quantile(vals, [0.025, 0.975])
    return float(lo), float(hi)


def judge_ab(blocks: ABBlocks, alpha: float = 0.05) -> LatencyJudgement:
    """B (new) relative to A (the baseline's model): the median of the per-block median ratios,
    bootstrap CI over blocks (a block pair is the unit that shares the device's state)."""
    logs = np.array([math.log(np.median(b) / np.median(a)) for a, b in zip(blocks.a, blocks.b)])
    # the median block ratio: one block disturbed by a burst of other load does not move it
    ratio = float(np.exp(np.median(logs)))
    lo, hi = _bootstrap(lambda x: float(np.exp(np.median(x))), [logs])
    # two tests must agree, as for raw timings: the CI excludes 1 and the block ratios are
    # consistently on one side (exact Wilcoxon signed-rank; 6 block pairs can reach p = 0.031)
    p = _signed_rank_p(logs)
    significant = (lo > 1.0 or hi < 1.0) and p is not None and p < alpha
    return LatencyJudgement(
        "ab",
        ratio,
        (lo, hi),
        significant,
        {
            "blocks": len(logs),
            "block_ratios": [round(float(np.exp(x)), 4) for x in logs],
            "runs_per_block": [len(a) for a in blocks.a],
            "order": "".join(blocks.order).upper(),
        },
        p_value=p,
        test="Wilcoxon signed-rank over blocks",
    )


def _signed_rank_p(logs: np.ndarray[Any, np.dtype[np.float64]]) -> float | None:
    try:
        from scipy.stats import wilcoxon  # heavy (scipy, optional): keeps importing the report light
    except ImportError:
        return None
    if len(logs) < 2 or np.all(logs == 0):
        return 1.0
    return float(wilcoxon(logs, alternative="two-sided", method="exact" if len(logs) <= 25 else "auto").pvalue)


def judge_normalized(
    old_v: VariantResult, old_ref: VariantResult, new_v: VariantResult, new_ref: VariantResult
) -> LatencyJudgement | None:
    raws = [
        np.asarray(r.latency_ms.raw, dtype=np.float64)
        for r in (old_v, old_ref, new_v, new_ref)
        if r.latency_ms and r.latency_ms.raw
    ]
    if len(raws) < 4 or any(r.size < 5 for r in raws):
        return None

    def stat(
        ov: np.ndarray[Any, Any], oref: np.ndarray[Any, Any], nv: np.ndarray[Any, Any], nref: np.ndarray[Any, Any]
    ) -> float:
        return float((np.median(nv) / np.median(nref)) / (np.median(ov) / np.median(oref)))

    ratio = float(stat(*raws))
    lo, hi = _bootstrap(stat, raws, resamples=1000)
    return LatencyJudgement(
        "normalized",
        ratio,
        (lo, hi),
        lo > 1.0 or hi < 1.0,
        {
            "reference": new_ref.name,
            "reference_sha256": new_ref.sha256[:16],
            "reference_ratio_raw": round(float(np.median(raws[3]) / np.median(raws[1])), 4),
        },
        test="",
    )


def choose_method(
    requested: str,
    previous: Report,
    judged: list[VariantResult],
    ab_files: dict[str, Path],
    reference: VariantResult | None,
    counterparts: dict[str, VariantResult] | None = None,
) -> str:
    """``counterparts``: judged name -> the baseline report's variant it is judged against (default: by name)."""
    counterparts = counterparts if counterparts is not None else {v.name: v for v in previous.variants}
    comparable = [v for v in judged if v.name in counterparts]
    ab_ok = bool(comparable) and all(v.name in ab_files for v in comparable)
    old_ref = next((o for o in previous.variants if reference is not None and o.name == reference.name), None)
    norm_ok = (
        reference is not None
        and old_ref is not None
        and old_ref.sha256 == reference.sha256
        and all(v.name != reference.name for v in comparable)
    )
    if requested == "auto":
        return "ab" if ab_ok else ("normalized" if norm_ok else "direct")
    if requested == "ab" and not ab_ok:
        missing = [v.name for v in comparable if v.name not in ab_files]
        raise BadInputError(
            f"--release-method ab needs the baseline report's model files; not found for: "
            f"{', '.join(missing) or '(no variant in common)'}",
            hint="pass --baseline-artifacts DIR (the baseline run's out/artifacts), or --release-method auto",
        )
    if requested == "normalized" and not norm_ok:
        raise BadInputError(
            "--release-method normalized needs the same reference variant (same sha256) in both "
            "reports, and a judged variant other than the reference",
            hint="use --release-method auto",
        )
    return requested


def latency_change(j: LatencyJudgement, old: VariantResult, new: VariantResult, min_effect: float) -> MetricChange:
    if j.significant and j.ratio >= 1 + min_effect:
        verdict = "slower"
    elif j.significant and j.ratio <= 1 / (1 + min_effect):
        verdict = "faster"
    else:
        verdict = "below threshold" if j.significant else "no significant change"
    before = old.latency_ms.p50 if old.latency_ms else None
    after = new.latency_ms.p50 if new.latency_ms else None
    return MetricChange(
        metric="latency_p50_ms",
        before=before,
        after=after,
        change=(after - before) if before is not None and after is not None else None,
        change_rel=j.ratio - 1.0,
        significant=j.significant,
        ratio_ci95=list(j.ci95),
        p_value=j.p_value,
        test=METHOD_TEXT[j.method],
        verdict=verdict,
        message=j.describe(),
    )


@dataclass
class ReleaseJudgement:
    method: str
    judgements: dict[str, LatencyJudgement]
    detail: dict[str, Any]


def release_checks(variant: str, diff: ReportDiff, cfg: GateConfig) -> list[Check]:
    """The checks of one variant against its counterpart in the previous release's report (its
    namesake, or for the shipped variant the previously shipped one: ``diff.counterpart``)."""
    vd = diff.variant(variant)
    if vd is None:
        return [
            Check(
                name="release_baseline",
                variant=variant,
                passed=True,
                message="no variant of this name in the baseline report, and it is not the shipped one: "
                "nothing to compare",
            )
        ]
    checks: list[Check] = []
    lat = vd.get("latency_p50_ms")
    if cfg.max_latency_regression is not None and lat is not None:
        limit = cfg.max_latency_regression
        if lat.change_rel is None:
            checks.append(
                Check(
                    name="latency_regression",
                    variant=variant,
                    limit=limit,
                    passed=False,
                    message=f"cannot be compared: {lat.message}",
                )
            )
        else:
            bad = bool(lat.significant) and lat.change_rel > limit
            msg = f"significant regression above {limit:.0%}: {lat.message}" if bad else lat.message
            checks.append(
                Check(
                    name="latency_regression",
                    variant=variant,
                    value=round(lat.change_rel, 4),
                    limit=limit,
                    passed=not bad,
                    message=msg,
                    p_value=lat.p_value,
                    ratio_ci95=lat.ratio_ci95,
                    significant=lat.significant,
                )
            )
    acc = vd.get("accuracy")
    acc_limit = cfg.max_release_accuracy_drop if cfg.max_release_accuracy_drop is not None else cfg.max_accuracy_drop
    if acc is not None:
        if acc.change is None:
            checks.append(
                Check(
                    name="release_accuracy_drop",
                    variant=variant,
                    limit=acc_limit,
                    passed=False,
                    message=f"cannot be compared: {acc.message}",
                )
            )
        else:
            drop = (acc.worse_by if acc.worse_by is not None else -acc.change) + 0.0  # no "-0.00"
            ok = drop <= acc_limit + 1e-9
            checks.append(
                Check(
                    name="release_accuracy_drop",
                    variant=variant,
                    value=round(drop, 4),
                    limit=acc_limit,
                    passed=ok,
                    p_value=acc.p_value,
                    message=f"worse by {drop:+.4g} {'<=' if ok else '>'} {acc_limit:g} vs the baseline "
                    f"report: {acc.message}",
                )
            )
    for name, metric, max_increase in (
        ("memory_increase", "peak_memory_mb", cfg.max_memory_increase),
        ("size_increase", "size_bytes", cfg.max_size_increase),
    ):
        ch = vd.get(metric)
        if max_increase is None or ch is None:
            continue
        limit = max_increase
        if ch.change_rel is None:
            # memory the device could not report in one of the runs: say so, do not guess
            checks.append(
                Check(
                    name=name,
                    variant=variant,
                    limit=limit,
                    passed=ch.before is None and ch.after is None,
                    message=f"cannot be compared: {ch.message}",
                )
            )
            continue
        ok = ch.change_rel <= limit + 1e-12
        checks.append(
            Check(
                name=name,
                variant=variant,
                value=round(ch.change_rel, 4),
                limit=limit,
                passed=ok,
                message=f"{ch.change_rel:+.1%} {'<=' if ok else '>'} {limit:.0%}: {ch.message}",
            )
        )
    return checks


def compare_reports(
    report: Report,
    previous: Report,
    previous_path: str | Path | None,
    cfg: GateConfig,
    *,
    judgements: dict[str, LatencyJudgement] | None = None,
    method: str = "direct",
    method_detail: dict[str, Any] | None = None,
) -> ReportDiff:
    """Diff ``report`` against ``previous`` and record it (``compared_with``, ``comparison``); the
    latency change of each variant in ``judgements`` is the method's, not the raw cross-run one."""
    min_effect = cfg.max_latency_regression if cfg.max_latency_regression is not None else 0.10
    d = diff_reports(previous, report, alpha=cfg.significance_alpha, min_effect=min_effect)
    old = {v.name: v for v in previous.variants}
    new = {v.name: v for v in report.variants}
    for vd in d.variants:
        j = (judgements or {}).get(vd.variant)
        if j is not None:
            vd.changes = [
                latency_change(j, old[vd.baseline_variant or vd.variant], new[vd.variant], min_effect)
                if c.metric == "latency_p50_ms"
                else c
                for c in vd.changes
            ]
    for name, det in (method_detail or {}).items():
        if isinstance(det, dict) and det.get("ab_failed"):
            d.warnings.append(
                f"{name}: the A/B re-measurement of the baseline's model failed ({det['ab_failed']}); "
                "its latency was compared across the two runs directly"
            )
        for w in (det.get("ab_warnings") or []) if isinstance(det, dict) else []:
            d.warnings.append(f"{name}: A/B re-measurement (A: the baseline's model, B: this one): {w}")
    if method == "direct" and any(vd.get("latency_p50_ms") for vd in d.variants):
        d.warnings.append(
            "latency was compared across two runs directly (no baseline model files to re-measure, "
            "no common reference variant): a busy device can make this a false alarm; pass "
            "--baseline-artifacts to re-measure the baseline A/B in the same session"
        )
    report.compared_with = ComparedWith.model_validate(
        {
            "path": str(previous_path) if previous_path else None,
            "sha256": sha256_file(Path(previous_path)) if previous_path else None,
            **d.baseline.model_dump(),
            "method": method,
            "method_text": METHOD_TEXT[method],
            "method_detail": method_detail,
        }
    )
    report.comparison = ReportDiff.model_validate(d.model_dump(mode="json"))
    report.warnings.extend(f"baseline comparison: {w}" for w in d.warnings)
    return d
