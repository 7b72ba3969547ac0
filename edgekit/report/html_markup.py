"""The page's building blocks: the stylesheet, escaping and number formatting, and a readable rendering of a
free-form record (a lineage step's config and metrics, a variant's device state) as nested key/value tables,
so no raw dict text reaches the page."""

from __future__ import annotations

import html
import math
from typing import Any

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1200px;color:#222;
padding:0 16px}
h1{margin:0 0 4px 0}h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:32px}
.verdict{padding:16px 20px;border-radius:8px;font-size:1.4em;font-weight:600;margin:12px 0}
.verdict.pass{background:#e6f4ea;color:#137333;border:2px solid #137333}
.verdict.fail{background:#fce8e6;color:#a50e0e;border:2px solid #a50e0e}
.verdict ul{font-size:.7em;font-weight:400;margin:8px 0 0 0}
table{border-collapse:collapse;font-size:.88em;margin:8px 0}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f5f5f5}td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.fail td{background:#fff4f4}.bad{color:#a50e0e;font-weight:600}.good{color:#137333}
.muted{color:#777}figure{margin:16px 0;border:1px solid #eee;padding:8px}figcaption{color:#555;font-size:.9em}
figure svg{max-width:100%;height:auto}code{background:#f5f5f5;padding:1px 4px;border-radius:3px}
details{margin:6px 0}summary{cursor:pointer;font-weight:600}.scroll{overflow-x:auto}
table.record{font-size:.95em;margin:2px 0}table.record th{font-weight:500;white-space:nowrap}
details.record>summary{font-weight:400;color:#555}table.lineage-steps td:nth-child(3){white-space:nowrap}
"""

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


def esc(x: object) -> str:
    """``x`` as HTML-escaped text (None: empty)."""
    return html.escape("" if x is None else str(x))


def num(x: float | None, fmt: str = "{:.3f}", none: str = "n/a") -> str:
    """A number by ``fmt``; ``none`` for a missing or NaN one."""
    return none if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def _scalar(x: object) -> str:
    if isinstance(x, bool) or x is None:
        return {True: "yes", False: "no", None: "—"}[x]
    if isinstance(x, float):
        return f"{x:.6g}"
    return esc(x)


def _is_empty(x: object) -> bool:
    return x is None or (isinstance(x, (dict, list, tuple, str)) and len(x) == 0)


def record(value: object, *, drop_empty: bool = True, table_class: str = "record") -> str:
    """A free-form value as markup a person reads: a dict as a two-column table (nested dicts nest), a list of
    scalars comma-joined, a list of dicts as one table with a column per key, a scalar as text. ``drop_empty``
    leaves out None, empty strings, lists and dicts (a record's unset fields say nothing)."""
    if isinstance(value, dict):
        items = [(k, v) for k, v in value.items() if not (drop_empty and _is_empty(v))]
        if not items:
            return "<span class=muted>—</span>"
        rows = "".join(f"<tr><th>{esc(k)}</th><td>{record(v, drop_empty=drop_empty)}</td></tr>" for k, v in items)
        return f"<table class={table_class}>{rows}</table>"
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(x, dict) for x in value):
            keys: list[str] = []
            for x in value:
                keys += [str(k) for k in x if str(k) not in keys]
            head = "".join(f"<th>{esc(k)}</th>" for k in keys)
            body = "".join(
                "<tr>" + "".join(f"<td>{record(x.get(k), drop_empty=drop_empty)}</td>" for k in keys) + "</tr>"
                for x in value
            )
            return f"<table class={table_class}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        return ", ".join(record(x, drop_empty=drop_empty) for x in value) or "<span class=muted>—</span>"
    return _scalar(value)


def inline(value: object) -> str:
    """A free-form value on one line: a dict as ``key: value · key: value`` (empty values left out), a list
    comma-joined, a scalar as text."""
    if isinstance(value, dict):
        parts = [f"{esc(k)}: {inline(v)}" for k, v in value.items() if not _is_empty(v)]
        return " · ".join(parts) or "<span class=muted>—</span>"
    if isinstance(value, (list, tuple)):
        return ", ".join(inline(x) for x in value)
    return _scalar(value)


def kv_table(d: dict[str, Any], table_id: str) -> str:
    """One row per key: the key, then its value on one line (a flat table: one fact a row)."""
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{inline(v)}</td></tr>" for k, v in d.items())
    return f"<table id={table_id}>{rows}</table>"
