"""The HTML report: one self-contained file (inline CSS, plots as inline SVG, no scripts, no network), a view of
report.json for people. This module is the page (:func:`render_html`, the entry point ``write.py`` calls); each
concern is a module beside it:

- ``html_tables``: the variants, parity per output, gate checks, comparison, per-op profile and fleet tables;
- ``html_language_model``: a language model's race on the device and its quantization accounts;
- ``html_search``: the variant search's candidates and its timeline bar;
- ``html_lineage``: each distinct lineage once (the runtime settings of one file share it), its steps in columns;
- ``html_plots``: the matplotlib figures as inline SVG (``pip install 'edgekit[report]'``);
- ``html_markup``: the stylesheet, escaping, number formatting, records as key/value tables.

Sections, top to bottom: the verdict; the header (target, device, model); the decision; the variants (a
language model's race and its quantization accounts instead, for task text-generation); the gate checks; the
comparison with a baseline report; the variant search; a fleet run; the per-op profiles; the plots; the device
state; each distinct lineage once. Everything taken from the report is HTML-escaped."""

from __future__ import annotations

from .html_budget import budget_section
from .html_language_model import decode_predictions, is_language_model, quantization_accounts, race_table
from .html_lineage import lineage_section
from .html_markup import CSS, esc, kv_table
from .html_plots import pareto_front, parity_hops, plots, sustained_series
from .html_search import search_section
from .html_tables import checks_table, comparison_section, fleet_table, outputs_table, profile_section, variants_table
from .model import Report

__all__ = ["render_html", "pareto_front", "parity_hops", "sustained_series"]


def _header(r: Report) -> str:
    dev = r.device
    selected = [v.name for v in r.variants if v.selected]
    return (
        f"<p>target <b>{esc(r.target)}</b> · device <b>{esc(dev.name)}</b> ({esc(dev.arch)}, "
        f"{esc(dev.cpu or 'cpu n/a')}, {esc(dev.cores)} cores, {esc(dev.transport)}) · "
        f"model <code>{esc(r.model.get('source'))}</code> · baseline variant <b>{esc(r.baseline)}</b>"
        + (f" · selected <b>{esc(', '.join(selected))}</b>" if selected else "")
        + (f" · compared with <code>{esc(r.compared_with.path)}</code>" if r.compared_with else "")
        + f"</p><p id=metric>{esc(r.metric_line())}</p><p class=muted>created {esc(r.created_at)} by edgekit "
        f"{esc(r.edgekit_version)} · report schema {esc(r.schema_version)}</p>"
    )


def _verdict(r: Report) -> str:
    failed = r.gate.failed_checks
    fail_list = (
        (
            "<ul>"
            + "".join(
                f"<li>{esc(c.name)}{' [' + esc(c.variant) + ']' if c.variant else ''}: {esc(c.message)}</li>"
                for c in failed
            )
            + "</ul>"
        )
        if failed
        else ""
    )
    return (
        f'<div id=verdict class="verdict {"pass" if r.gate.passed else "fail"}">'
        f"{'Gate PASSED' if r.gate.passed else 'Gate FAILED'}"
        f" ({len(r.gate.checks) - len(failed)}/{len(r.gate.checks)} checks passed){fail_list}</div>"
    )


def _decision(r: Report) -> str:
    d = r.decision
    if d is None:
        return ""
    return f"<h2>Decision</h2><p><b>Ship:</b> {esc(d.reason if d.ship else 'nothing: ' + d.reason)}</p>" + (
        "<ul>" + "".join(f"<li>not <b>{esc(n)}</b>: {esc(w)}</li>" for n, w in d.lost.items()) + "</ul>"
        if d.lost
        else ""
    )


def _variants(r: Report) -> list[str]:
    if is_language_model(r):
        return [
            "<h2 id=variants-h>Variants: the race on the device</h2>",
            race_table(r),
            decode_predictions(r),
            quantization_accounts(r),
        ]
    reasons = sorted({v.energy_reason for v in r.variants if v.energy_mj_per_inference is None and v.energy_reason})
    energy_note = f"<p class=muted>Energy not measured: {esc('; '.join(reasons))}.</p>" if reasons else ""
    return ["<h2 id=variants-h>Variants</h2>", variants_table(r), energy_note, outputs_table(r)]


def render_html(r: Report) -> str:
    """The whole page for ``r``."""
    verdict_text = "Gate PASSED" if r.gate.passed else "Gate FAILED"
    warnings = (
        "<h2>Warnings</h2><ul>" + "".join(f"<li>{esc(w)}</li>" for w in r.warnings) + "</ul>" if r.warnings else ""
    )
    body = [
        f"<h1>edgekit report: {esc(r.model.get('source') or 'model')} on {esc(r.target)}</h1>",
        _verdict(r),
        _header(r),
        _decision(r),
        *_variants(r),
        "<h2 id=gate>Gate checks</h2>",
        checks_table(r),
        comparison_section(r),
        search_section(r),
        budget_section(r),
        fleet_table(r),
        profile_section(r),
        "<h2 id=plots>Plots</h2>",
        *(plots(r) or ["<p class=muted>No figure applies to this report.</p>"]),
        "<h2 id=device>Device state</h2>",
        kv_table(r.device.model_dump(mode="json", exclude_none=True), "device-table"),
        "<h2 id=lineage>Lineage of each variant</h2>"
        "<p class=muted>One block a file: variants that are one file under several runtime settings share it.</p>",
        lineage_section(r),
        warnings,
    ]
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width, initial-scale=1'>"
        f"<title>edgekit: {verdict_text} - {esc(r.target)}</title><style>{CSS}</style></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )
