"""The variant search (``deploy --search``): what was chosen, by which objective, every candidate with the stage
and reason it was dropped at, and where the search's time went (one stacked bar, inline SVG without a plotting
library)."""

from __future__ import annotations

from ..timeline import stage_totals, timeline_line
from .html_markup import esc, num
from .model import Report, SearchSection


def search_section(r: Report) -> str:
    """The variant search (``deploy --search``): what was chosen, by which objective, and every candidate
    with the stage and reason it was dropped at."""
    search = r.search
    if search is None:
        return ""
    shipped = search.shipped.file if search.shipped else None
    head = (
        f"<h2 id=search>Variant search</h2><p>objective <b>{esc(search.objective)}</b> · selected "
        f"<b>{esc(search.selected or 'nothing')}</b>"
        + (f" · shipping file <code>{esc(shipped)}</code>" if shipped else "")
        + f" · {num(search.seconds, '{:.0f}')} s of a {num(search.time_budget_s, '{:.0f}')} s budget</p>"
    )
    head += _timeline_bar(search)
    rows: list[str] = []
    for c in search.candidates:
        p50 = c.screening.p50 if c.screening else None
        dropped = c.status == "dropped"
        rows.append(
            f"<tr{' class=fail' if dropped else ''}><td>{esc(c.name)}</td><td>{esc(c.status)}</td>"
            f"<td>{esc(c.dropped_at)}</td><td>{esc(c.format)}</td><td>{esc(c.precision)}</td>"
            f"<td class=n>{num(c.size_bytes / 1024 if c.size_bytes else None, '{:.1f}', '')}</td>"
            f"<td class=n>{num(c.host_accuracy, '{:.2f}', '')}</td>"
            f"<td class=n>{num(p50, '{:.4f}', '')}</td><td>{esc(c.reason)}</td></tr>"
        )
    return (
        head + "<div class=scroll><table id=search-candidates><thead><tr><th>candidate</th><th>status</th>"
        "<th>dropped at</th><th>format</th><th>precision</th><th>size KB</th><th>host accuracy %</th>"
        "<th>screening p50 ms</th><th>reason</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table></div>"
    )


_STAGE_COLOURS = {
    "preparation": "#8e8cd8",
    "build": "#e8a33d",
    "host_filter": "#c9b458",
    "lock_wait": "#bbbbbb",
    "connect": "#9fc5e8",
    "delivery": "#6fa8dc",
    "screening": "#4a9e6b",
    "finals": "#2b7a4b",
    "tuning": "#b45f9e",
    "release": "#a05252",
    "profile": "#7f7f7f",
    "report": "#555555",
}


def _timeline_bar(search: SearchSection) -> str:
    """Where the search's time went: one stacked bar (inline SVG, no plotting library), the stages in
    pipeline order, and the budget's end marked."""
    tl = search.timeline
    if tl is None or not tl.spans or not tl.wall_s:
        return ""
    totals = [t for t in stage_totals(tl.spans) if t[1] > 0]
    span = max(tl.wall_s, (tl.budget_s or 0) + tl.lock_wait_s)
    width, x = 1000.0, 0.0
    rects: list[str] = []
    legend: list[str] = []
    for stage, secs, n in totals:
        w = width * secs / span
        colour = _STAGE_COLOURS.get(stage, "#999999")
        rects.append(
            f"<rect x='{x:.1f}' y='0' width='{max(w, 0.5):.1f}' height='22' fill='{colour}'>"
            f"<title>{esc(stage)}: {secs:.1f} s{f' ({n})' if n > 1 else ''}</title></rect>"
        )
        legend.append(f"<span style='color:{colour}'>&#9632;</span> {esc(stage)} {secs:.1f} s")
        x += w
    if tl.budget_s:
        bx = width * (tl.budget_s + tl.lock_wait_s) / span
        rects.append(
            f"<line x1='{bx:.1f}' x2='{bx:.1f}' y1='0' y2='28' stroke='#a50e0e' stroke-width='2'>"
            "<title>end of the time budget (lock wait excluded)</title></line>"
        )
    svg = (
        f"<svg id=search-timeline viewBox='0 0 {width:.0f} 30' width='100%' height='30' "
        f"xmlns='http://www.w3.org/2000/svg'>{''.join(rects)}</svg>"
    )
    host = (search.host or {}).get("summary")
    return (
        f"<figure>{svg}<figcaption>{esc(timeline_line(tl))}"
        + (f"<br>{esc(host)}" if host else "")
        + f"<br>{' · '.join(legend)}</figcaption></figure>"
    )
