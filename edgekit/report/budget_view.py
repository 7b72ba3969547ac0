"""The budget (latency, memory, size) as a goal in report.md (issue #46): the plan of each round, every pruned
point's predicted p50 (memory, size) beside its measured one, what distillation bought over fine-tuning alone, and
the frontier of device-measured points. Read from the search section's ``budget`` record
(``variant_search/budget.py``), which report.json carries."""

from __future__ import annotations

from typing import Any

from .model import Report


def _ms(x: object) -> str:
    return f"{x:.4g}" if isinstance(x, (int, float)) else "n/a"


def budget_markdown(r: Report) -> list[str]:
    b = r.search.budget if r.search is not None else None
    if not b:
        return []
    budgets: dict[str, Any] = b.get("budgets") or {"latency": {"limit": b.get("latency_budget_ms"), "unit": "ms"}}
    title = " and ".join(budgets).capitalize() + " budget"
    out = [
        "",
        f"## {title}",
        "",
        "Budget "
        + ", ".join(f"{q} **{_ms(x.get('limit'))} {x.get('unit', '')}**" for q, x in budgets.items())
        + f", judged on {b.get('judged_on', 'the p50')}.",
    ]
    if b.get("teacher"):
        out += ["", f"Distillation teacher: {b['teacher'].get('path')} (--teacher)."]
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
    mem = b.get("memory_table")
    if mem:
        out += [
            "",
            f"Memory table: {mem.get('encoding')}, base peak {_ms(mem.get('base_peak_mb'))} MB measured on the device; "
            f"a width pays when it saves more than {_ms(mem.get('min_saving_mb'))} MB.",
        ]
    size = b.get("size_model")
    if size:
        out += [
            "",
            f"Size model: {size.get('encoding')}, {_ms(size.get('bytes_per_param'))} bytes a parameter plus "
            f"{_ms(size.get('overhead_bytes'))} bytes, from the exact parameter count of each width (no device).",
        ]
    others = [q for q in budgets if q != "latency"]
    rounds: list[dict[str, Any]] = b.get("rounds") or []
    if rounds:
        extra_head = "".join(f" predicted {q} MB | measured {q} MB |" for q in others)
        out += [
            "",
            "| round | widths | student | predicted p50 ms | measured p50 ms | CI upper ms |"
            + extra_head
            + " top-1 | meets |",
            "|---:|---|---|---:|---:|---:|" + "---:|---:|" * len(others) + "---:|---|",
        ]
    blank = " |" * (2 * len(others))
    for rnd in rounds:
        widths = ", ".join(f"{g}={w}" for g, w in rnd["plan"]["widths"].items()) or "none"
        for name, s in (rnd.get("students") or {}).items():
            if s is None:
                out.append(
                    f"| {rnd['round']} | {widths} | {name} | {_ms(rnd['plan'].get('predicted_p50_ms'))} | dropped | |"
                    f"{blank} | |"
                )
                continue
            extra = "".join(
                f" {_ms((s.get('predicted') or {}).get(q))} | {_ms((s.get('measured') or {}).get(q))} |" for q in others
            )
            out.append(
                f"| {rnd['round']} | {widths} | {name} | {_ms(s['predicted_p50_ms'])} | {_ms(s['p50_ms'])} | "
                f"{_ms(s['p50_ci95_upper_ms'])} |{extra} {_ms(s['accuracy'])} | "
                f"{'yes' if s['meets_budget'] else 'no'} |"
            )
        if rnd.get("stopped"):
            out.append(f"| {rnd['round']} | {widths} | (not built: {rnd['stopped']}) | | | |{blank} | |")
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
            "| variant | p50 ms | CI upper ms | top-1 | drop | size KB | peak MB | meets the budget | outcome |",
            "|---|---:|---:|---:|---:|---:|---:|---|---|",
        ]
        out += [
            f"| {p['name']} | {_ms(p['p50_ms'])} | {_ms(p['p50_ci95_upper_ms'])} | {_ms(p['accuracy'])} | "
            f"{_ms(p['accuracy_drop'])} | {_ms((p['size_bytes'] or 0) / 1024)} | {_ms(p.get('peak_memory_mb'))} | "
            f"{'yes' if p['meets_budget'] else 'no'} | "
            + ("shipped" if p.get("shipped") else str(p.get("lost") or "")).replace("|", "/")
            + " |"
            for p in frontier
        ]
    return out
