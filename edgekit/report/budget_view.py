"""The latency budget as a goal in report.md (issue #46): the plan of each round, every pruned point's predicted
p50 beside its measured one, what distillation bought over fine-tuning alone, and the frontier of device-measured
points. Read from the search section's ``budget`` record (``variant_search/budget.py``), which report.json carries."""

from __future__ import annotations

from typing import Any

from .model import Report


def _ms(x: object) -> str:
    return f"{x:.4g}" if isinstance(x, (int, float)) else "n/a"


def budget_markdown(r: Report) -> list[str]:
    b = r.search.budget if r.search is not None else None
    if not b:
        return []
    out = [
        "",
        "## Latency budget",
        "",
        f"Budget **{_ms(b.get('latency_budget_ms'))} ms**, judged on {b.get('judged_on', 'the p50')}.",
    ]
    if b.get("pruning"):
        out += ["", f"Pruning: {b['pruning']}."]
    table = b.get("latency_table")
    if table:
        out += [
            "",
            f"Latency table: {table.get('encoding')} on {table.get('runtime')} {table.get('runtime_version') or ''}"
            f" (base p50 {_ms(table['base']['p50'])} ms; "
            + ("reused from the cache" if table.get("reused") else "measured in this run")
            + "); a width pays when its paired ratio to the base is clearly below 1.",
        ]
    rounds: list[dict[str, Any]] = b.get("rounds") or []
    if rounds:
        out += [
            "",
            "| round | widths | student | predicted p50 ms | measured p50 ms | CI upper ms | top-1 | meets |",
            "|---:|---|---|---:|---:|---:|---:|---|",
        ]
    for rnd in rounds:
        widths = ", ".join(f"{g}={w}" for g, w in rnd["plan"]["widths"].items()) or "none"
        for name, s in (rnd.get("students") or {}).items():
            if s is None:
                out.append(
                    f"| {rnd['round']} | {widths} | {name} | {_ms(rnd['plan']['predicted_p50_ms'])} | dropped | | | |"
                )
                continue
            out.append(
                f"| {rnd['round']} | {widths} | {name} | {_ms(s['predicted_p50_ms'])} | {_ms(s['p50_ms'])} | "
                f"{_ms(s['p50_ci95_upper_ms'])} | {_ms(s['accuracy'])} | {'yes' if s['meets_budget'] else 'no'} |"
            )
        if rnd.get("stopped"):
            out.append(f"| {rnd['round']} | {widths} | (not built: {rnd['stopped']}) | | | | | |")
    notes = [f"Round {rnd['round']}: {rnd['distillation']}." for rnd in rounds if rnd.get("distillation")]
    unpaid = {g: why for rnd in rounds for g, why in (rnd["plan"].get("left_unpruned") or {}).items()}
    notes += [f"Left whole: {why}." for why in unpaid.values()]
    if notes:
        out += ["", *notes]
    frontier: list[dict[str, Any]] = b.get("frontier") or []
    if frontier:
        out += [
            "",
            "Frontier (every device-measured point, fastest first):",
            "",
            "| variant | p50 ms | CI upper ms | top-1 | drop | size KB | meets the budget |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        out += [
            f"| {p['name']} | {_ms(p['p50_ms'])} | {_ms(p['p50_ci95_upper_ms'])} | {_ms(p['accuracy'])} | "
            f"{_ms(p['accuracy_drop'])} | {_ms((p['size_bytes'] or 0) / 1024)} | "
            f"{'yes' if p['meets_budget'] else 'no'} |"
            for p in frontier
        ]
    return out
