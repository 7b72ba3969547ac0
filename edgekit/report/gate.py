"""The release gate: every variant that could ship must stay inside the accuracy tolerance, the
latency/memory/size budgets, and (for float hops) its parity tolerance.

Which variants are judged: the non-baseline variants (what compression produced) when there are
any, else the baseline itself. A budget that is None is not checked.
"""

from __future__ import annotations

from ..recipe import GateConfig
from .model import Check, Gate, VariantResult


def evaluate_gate(variants: list[VariantResult], baseline: str, cfg: GateConfig) -> Gate:
    checks: list[Check] = []
    base = next((v for v in variants if v.name == baseline), None)
    judged = [v for v in variants if v.name != baseline] or ([base] if base else [])

    if cfg.check_parity:
        seen: set[tuple] = set()
        for v in variants:
            for step in v.lineage:
                violations = (step.get("metrics") or {}).get("parity_violations")
                key = (step.get("name"), step.get("input_sha256"))
                if step.get("kind") == "convert" and violations is not None and key not in seen:
                    seen.add(key)
                    checks.append(Check(name=f"parity[{step['name']}]", variant=v.name, passed=not violations,
                                        message="within tolerance" if not violations else "; ".join(violations)))

    for v in judged:
        if base is not None and v is not base:
            if v.accuracy is None or base.accuracy is None:
                checks.append(Check(name="accuracy_drop", variant=v.name, limit=cfg.max_accuracy_drop, passed=False,
                                    message="accuracy was not measured (eval data without labels?)"))
            else:
                drop = base.accuracy.value - v.accuracy.value
                limit = cfg.max_accuracy_drop * (base.accuracy.value / 100.0 if cfg.relative_accuracy_drop else 1.0)
                ok = drop <= limit + 1e-9
                checks.append(Check(
                    name="accuracy_drop", variant=v.name, value=round(drop, 4), limit=round(limit, 4), passed=ok,
                    message=(f"{v.accuracy.value:.2f}% vs baseline {base.accuracy.value:.2f}%: drop {drop:+.2f} pts "
                             f"{'<=' if ok else '>'} {limit:.2f}" + (" (relative)" if cfg.relative_accuracy_drop else ""))))
        _budget(checks, v, "latency_p50_budget", v.latency_ms.p50 if v.latency_ms else None, cfg.latency_ms_p50, "ms")
        _budget(checks, v, "latency_p90_budget", v.latency_ms.p90 if v.latency_ms else None, cfg.latency_ms_p90, "ms")
        _budget(checks, v, "peak_memory_budget", v.peak_memory_mb, cfg.peak_memory_mb, "MB")
        _budget(checks, v, "model_size_budget", v.size_bytes / 1e6, cfg.model_size_mb, "MB")
    return Gate(passed=all(c.passed for c in checks), checks=checks)


def _budget(checks: list[Check], v: VariantResult, name: str, value: float | None, limit: float | None, unit: str):
    if limit is None:
        return
    if value is None:
        checks.append(Check(name=name, variant=v.name, limit=limit, passed=False,
                            message=f"not measured, so the {limit:g} {unit} budget cannot be shown to hold"))
        return
    ok = value <= limit
    checks.append(Check(name=name, variant=v.name, value=round(value, 4), limit=limit, passed=ok,
                        message=f"{value:.3f} {unit} {'<=' if ok else '>'} budget {limit:g} {unit}"))
