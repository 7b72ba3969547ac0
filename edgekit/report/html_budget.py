"""The budget as a goal in report.html (issue #46): every device-measured point of accuracy against latency (or, with
no latency budget, against the first budgeted quantity: peak memory or file size), the budget line, the shipped
point marked and each losing point numbered with why it lost. Inline SVG drawn here (no plotting library, no
script: edgekit's report is read offline), from the search section's ``budget`` record."""

from __future__ import annotations

from typing import Any

from .html_markup import esc
from .model import Report

W, H = 720.0, 320.0
LEFT, RIGHT, TOP, BOTTOM = 64.0, 24.0, 16.0, 44.0
AXES = {
    "latency": ("p50_ms", "p50 latency, ms (device)"),
    "memory": ("peak_memory_mb", "peak memory, MB (device)"),
    "size": ("size_mb", "file size, MB"),
}


def _x(p: dict[str, Any], key: str) -> float | None:
    if key == "size_mb":
        return None if p.get("size_bytes") is None else float(p["size_bytes"]) / 1e6
    v = p.get(key)
    return None if v is None else float(v)


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    step = (hi - lo) / n if hi > lo else 1.0
    return [lo + i * step for i in range(n + 1)]


def frontier_svg(budget: dict[str, Any]) -> str:
    """The frontier plot (an ``<figure>`` holding the SVG and its numbered key), or "" without measured points."""
    budgets: dict[str, Any] = budget.get("budgets") or (
        {"latency": {"limit": budget["latency_budget_ms"]}} if budget.get("latency_budget_ms") is not None else {}
    )
    quantity = "latency" if "latency" in budgets or not budgets else next(iter(budgets))
    key, label = AXES[quantity]
    pts = [
        (p, x, float(p["accuracy"]))
        for p in budget.get("frontier") or []
        if (x := _x(p, key)) is not None and p.get("accuracy") is not None
    ]
    if not pts:
        return ""
    limit = (budgets.get(quantity) or {}).get("limit")
    xs = [x for _p, x, _a in pts] + ([float(limit)] if limit is not None else [])
    ys = [a for _p, _x, a in pts]
    x0, x1 = 0.0, max(xs) * 1.08
    y0, y1 = min(ys), max(ys)
    pad = max((y1 - y0) * 0.1, 0.5)
    y0, y1 = y0 - pad, y1 + pad

    def sx(x: float) -> float:
        return LEFT + (W - LEFT - RIGHT) * (x - x0) / (x1 - x0 or 1.0)

    def sy(y: float) -> float:
        return TOP + (H - TOP - BOTTOM) * (1 - (y - y0) / (y1 - y0 or 1.0))

    parts = [
        f"<rect x='{LEFT}' y='{TOP}' width='{W - LEFT - RIGHT}' height='{H - TOP - BOTTOM}' fill='none' stroke='#999'/>"
    ]
    for t in _ticks(x0, x1):
        parts.append(
            f"<text x='{sx(t):.1f}' y='{H - BOTTOM + 16:.1f}' font-size='11' text-anchor='middle'>{t:.3g}</text>"
        )
    for t in _ticks(y0, y1, 4):
        parts.append(f"<text x='{LEFT - 6:.1f}' y='{sy(t) + 4:.1f}' font-size='11' text-anchor='end'>{t:.3g}</text>")
    parts.append(
        f"<text x='{(LEFT + W - RIGHT) / 2:.1f}' y='{H - 6:.1f}' font-size='12' text-anchor='middle'>"
        f"{esc(label)}</text>"
    )
    parts.append(
        f"<text x='14' y='{(TOP + H - BOTTOM) / 2:.1f}' font-size='12' text-anchor='middle' "
        f"transform='rotate(-90 14 {(TOP + H - BOTTOM) / 2:.1f})'>accuracy</text>"
    )
    if limit is not None:
        bx = sx(float(limit))
        parts.append(
            f"<line class=budget-line x1='{bx:.1f}' x2='{bx:.1f}' y1='{TOP}' y2='{H - BOTTOM}' "
            f"stroke='#a50e0e' stroke-width='2' stroke-dasharray='6 4'><title>the {float(limit):g} "
            f"{esc((budgets.get(quantity) or {}).get('unit', ''))} {quantity} budget</title></line>"
        )
        parts.append(
            f"<text x='{bx + 4:.1f}' y='{TOP + 12:.1f}' font-size='11' fill='#a50e0e'>budget {float(limit):g}</text>"
        )
    key_rows: list[str] = []
    for i, (p, x, a) in enumerate(sorted(pts, key=lambda t: t[1]), 1):
        name = str(p.get("name"))
        if p.get("shipped"):
            why, colour, r = "shipped", "#1a7f37", 7
        else:
            why, colour, r = str(p.get("lost") or "lost"), "#777777" if p.get("meets_budget") else "#d4622a", 5
        cx, cy = sx(x), sy(a)
        parts.append(
            f"<circle class='{'shipped' if p.get('shipped') else 'lost'}' cx='{cx:.1f}' cy='{cy:.1f}' "
            f"r='{r}' fill='{colour}'><title>{esc(name)}: {x:.4g}, accuracy {a:.4g}; {esc(why)}</title>"
            "</circle>"
        )
        parts.append(
            f"<text x='{cx + 8:.1f}' y='{cy - 6:.1f}' font-size='11' fill='{colour}'>"
            f"{i}{' shipped' if p.get('shipped') else ''}</text>"
        )
        key_rows.append(f"<li value={i}><b>{esc(name)}</b>: {x:.4g} · accuracy {a:.4g} · {esc(why)}</li>")
    svg = (
        f"<svg id=budget-frontier viewBox='0 0 {W:.0f} {H:.0f}' width='100%' xmlns='http://www.w3.org/2000/svg'>"
        + "".join(parts)
        + "</svg>"
    )
    return (
        f"<figure>{svg}<figcaption>Every device-measured point: accuracy against {esc(label)}; the dashed line "
        "is the budget, green the shipped point, orange the points over the budget, grey the points inside it "
        f"that lost.<ol>{''.join(key_rows)}</ol></figcaption></figure>"
    )


def budget_section(r: Report) -> str:
    """The budget's section of report.html: its heading, what pruning did, and the frontier plot."""
    b = r.search.budget if r.search is not None else None
    if not b:
        return ""
    budgets: dict[str, Any] = b.get("budgets") or {"latency": {"limit": b.get("latency_budget_ms"), "unit": "ms"}}
    head = (
        f"<h2 id=budget>{esc(' and '.join(budgets).capitalize())} budget</h2><p>"
        + " · ".join(f"{esc(q)} <b>{x.get('limit')} {esc(x.get('unit', ''))}</b>" for q, x in budgets.items())
        + (f" · pruning: {esc(b['pruning'])}" if b.get("pruning") else "")
        + "</p>"
    )
    return head + frontier_svg(b)
