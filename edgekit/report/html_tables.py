"""The report's tables for a fixed-graph model and the gate: the variants (latency, memory, energy, accuracy,
parity), parity per output, the gate's checks, the comparison with a baseline report, the per-op profiles and
a fleet run's units."""

from __future__ import annotations

import json

from ..measure.compare import format_p
from .html_markup import esc, num
from .model import ComparedWith, Report, VariantResult


def variants_table(r: Report) -> str:
    """One row per variant: what it is, its latency, memory, energy, accuracy and parity on the device."""
    head = [
        "variant",
        "format",
        "precision",
        "runtime",
        "size KB",
        "p50 ms",
        "p50 95% CI",
        "p90 ms",
        "p99 ms",
        "CoV",
        "runs",
        "peak MB",
        "energy mJ/inf",
        esc(r.metric_label()),
        "drop (paired 95% CI)",
        "max |err|",
        "cosine",
        "top-1 agree",
    ]
    rows: list[str] = []
    for v in r.variants:
        lat, acc, par = v.latency_ms, v.accuracy, v.parity
        name = (
            esc(v.name)
            + (" <span class=muted>(baseline)</span>" if v.name == r.baseline else "")
            + (" <b>★ selected</b>" if v.selected else "")
        )
        energy = (
            num(v.energy_mj_per_inference, "{:.3f}")
            if v.energy_mj_per_inference is not None
            else f'<span class=muted title="{esc(v.energy_reason)}">null</span>'
        )
        cells = [
            name,
            esc(v.format),
            esc(v.precision),
            esc(v.runtime.label(version=True)),
            num(v.size_bytes / 1024, "{:.1f}"),
            num(lat.p50 if lat else None, "{:.4f}"),
            f"{lat.ci95[0]:.4f}–{lat.ci95[1]:.4f}" if lat else "n/a",
            num(lat.p90 if lat else None, "{:.4f}"),
            num(lat.p99 if lat else None, "{:.4f}"),
            (f"{lat.cov:.1%}" + ("" if lat.stable else " <span class=bad>unstable</span>")) if lat else "n/a",
            str(lat.runs) if lat else "n/a",
            num(v.peak_memory_mb, "{:.1f}"),
            energy,
            num(acc.value if acc else None, "{:.4g}"),
            esc(_drop_text(v)),
            num(par.max_abs_err if par else None, "{:.2e}"),
            num(par.cosine if par else None, "{:.6f}"),
            num(par.top1_agreement if par else None, "{:.1%}"),
        ]
        rows.append(
            "<tr>" + "".join(f"<td{' class=n' if i > 3 else ''}>{c}</td>" for i, c in enumerate(cells)) + "</tr>"
        )
    return (
        "<div class=scroll><table id=variants><thead><tr>"
        + "".join(f"<th>{h}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></div>"
    )


def _drop_text(v: VariantResult) -> str:
    if v.accuracy_drop is None:
        return "n/a"
    ci = (v.accuracy_stats or {}).get("ci95")
    return f"{v.accuracy_drop:+.3g}" + (f" [{ci[0]:+.3g}, {ci[1]:+.3g}]" if ci else "")


def outputs_table(r: Report) -> str:
    """Parity of every output of a multi-output model."""
    rows = [(v, name, p) for v in r.variants for name, p in (v.parity_outputs or {}).items()]
    if not rows:
        return ""
    body = "".join(
        f"<tr><td>{esc(v.name)}</td><td>{esc(n)}</td><td class=n>{p.max_abs_err:.2e}</td>"
        f"<td class=n>{p.cosine:.6f}</td><td class=n>{num(p.top1_agreement, '{:.1%}')}</td></tr>"
        for v, n, p in rows
    )
    return (
        "<h2 id=outputs>Parity per output</h2><table id=parity-outputs><thead><tr><th>variant</th><th>output</th>"
        "<th>max |err|</th><th>cosine</th><th>top-1 agree</th></tr></thead><tbody>" + body + "</tbody></table>"
    )


def checks_table(r: Report) -> str:
    """The gate's checks, failed ones marked, each with its value, limit, p-value and message."""
    if not r.gate.checks:
        return "<p class=muted>The gate had no checks to run.</p>"
    rows = []
    for c in r.gate.checks:
        res = "<span class=good>pass</span>" if c.passed else "<span class=bad>FAIL</span>"
        p = "" if c.p_value is None else format_p(c.p_value)
        rows.append(
            f"<tr class={'pass' if c.passed else 'fail'}><td>{esc(c.name)}</td><td>{esc(c.variant)}</td>"
            f"<td class=n>{num(c.value, '{:.4g}', '')}</td><td class=n>{num(c.limit, '{:.4g}', '')}</td>"
            f"<td class=n>{p}</td><td>{res}</td><td>{esc(c.message)}</td></tr>"
        )
    return (
        "<table id=checks><thead><tr><th>check</th><th>variant</th><th>value</th><th>limit</th><th>p-value</th>"
        "<th>result</th><th>message</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )


def comparison_section(r: Report) -> str:
    """The comparison with a baseline report (``--previous``): every metric's change and verdict."""
    comp = r.comparison
    if comp is None:
        return ""
    cw = r.compared_with or ComparedWith.model_validate(comp.baseline.model_dump())
    parts = [
        f"<h2 id=comparison>Compared with the baseline report</h2><p>Baseline: <code>{esc(cw.path)}</code>, "
        f"created {esc(cw.created_at)} by edgekit {esc(cw.edgekit_version)}, model sha256 "
        f"<code>{esc(str(cw.model_sha256)[:12])}</code>. Latency: bootstrap CI of the ratio of medians and "
        f"Mann-Whitney U at alpha {esc(comp.alpha)}, minimum effect {num(comp.min_effect, '{:.0%}')}."
        "</p>"
    ]
    if cw.method is not None:
        detail = (
            f" <code>{esc(json.dumps(cw.method_detail, sort_keys=True, default=str))}</code>"
            if cw.method_detail
            else ""
        )
        parts.append(
            f"<p id=latency-method>Release latency judged by: <b>{esc(cw.method_description())}</b>{detail}</p>"
        )
    rows = []
    for vd in comp.variants:
        for c in vd.changes:
            bad = c.is_regression
            rows.append(
                f"<tr{' class=fail' if bad else ''}><td>{esc(vd.variant)}</td><td>{esc(c.metric)}</td>"
                f"<td class=n>{num(c.before, '{:.4g}')}</td><td class=n>{num(c.after, '{:.4g}')}</td>"
                f"<td class=n>{num(c.change_rel, '{:+.1%}', '')}</td>"
                f"<td class=n>{'' if c.p_value is None else format_p(c.p_value)}</td>"
                f"<td{' class=bad' if bad else ''}>{esc(c.verdict)}</td><td>{esc(c.message)}</td></tr>"
            )
    parts.append(
        "<table id=comparison-table><thead><tr><th>variant</th><th>metric</th><th>before</th><th>after</th>"
        "<th>change</th><th>p-value</th><th>verdict</th><th>detail</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )
    if comp.added:
        parts.append(f"<p>New variants: {esc(', '.join(comp.added))}.</p>")
    if comp.removed:
        parts.append(f"<p>No longer built: {esc(', '.join(comp.removed))}.</p>")
    for w in comp.warnings:
        parts.append(f"<p class=bad>warning: {esc(w)}</p>")
    return "".join(parts)


def profile_section(r: Report, top: int = 10) -> str:
    """Per-op profiles: each profiled variant's top ops with their PyTorch module, and each diff's
    one-line reason."""
    profiled = [v for v in r.variants if v.op_profile is not None]
    if not profiled:
        return ""
    out = ["<h2 id=op-profile>Per-op profile on the device</h2>"]
    out += [
        f"<p class=profile-diff><b>{esc(d.other)} vs {esc(d.base)}</b>: {esc(d.summary)}</p>" for d in r.profile_diffs
    ]
    for v in profiled:
        p = v.op_profile
        if p is None:
            continue
        if not p.available:
            out.append(f"<p><b>{esc(v.name)}</b>: no per-op profile: {esc(p.reason)}</p>")
            continue
        rows = "".join(
            f"<tr><td><code>{esc(o.node)}</code></td><td>{esc(o.op_type)}</td>"
            f"<td>{esc('(model)' if o.module == '' else (o.module or 'n/a'))}</td>"
            f"<td>{esc(o.module_class)}</td>"
            f"<td class=n>{o.ms:.4f}</td><td class=n>{num(o.share, '{:.1%}')}</td></tr>"
            for o in p.top(top)
        )
        out.append(
            f"<details open><summary>{esc(v.name)}: {esc(p.source)}, {p.runs} runs, median run "
            f"{p.run_ms:.3g} ms, {num(p.mapped_share, '{:.0%}')} of op time traced to modules</summary>"
            "<table class=op-profile><thead><tr><th>op</th><th>type</th><th>module</th><th>class</th>"
            "<th>ms/inference</th><th>share</th></tr></thead><tbody>" + rows + "</tbody></table></details>"
        )
    return "".join(out)


def fleet_table(r: Report) -> str:
    """A fleet run: each unit's state, shard, p50 per variant and its own gate."""
    fl = r.fleet
    if fl is None:
        return ""
    names = [v.name for v in fl.variants]
    head = "".join(
        f"<th>{esc(h)}</th>" for h in ["unit", "state", "shard", *[f"{n} p50 ms" for n in names], "unit gate", "error"]
    )
    rows = []
    for u in fl.units:
        bad = u.state != "measured" or u.gate_passed is False
        cells = [
            esc(u.name) + (" <b>(judged)</b>" if u.name == fl.judged_unit else ""),
            esc(u.state),
            esc(f"{u.shard[0]}-{u.shard[1]}" if u.shard else "all"),
            *[f"<td class=n>{num((u.latency_ms.get(n) or {}).get('p50'))}</td>" for n in names],
            esc("n/a" if u.gate_passed is None else "pass" if u.gate_passed else "FAIL " + ", ".join(u.failed_checks)),
            esc(u.error or ""),
        ]
        rows.append(
            f"<tr{' class=fail' if bad else ''}>"
            + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in cells)
            + "</tr>"
        )
    return (
        f"<h2 id=fleet>Fleet</h2><p>{fl.measured} of {fl.total} units measured; eval {esc(fl.mode)}; the gate "
        f"judged the {esc(fl.gate)} unit <b>{esc(fl.judged_unit)}</b>.</p>"
        f"<table id=fleet-table><tr>{head}</tr>{''.join(rows)}</table>"
    )
