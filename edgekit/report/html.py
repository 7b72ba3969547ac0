"""The HTML report: one self-contained file (inline CSS, plots as inline SVG, no scripts, no network).

Sections, top to bottom: the verdict; the variants table; the gate checks; the comparison with a
baseline report (when one was given); the plots (latency distribution per variant; accuracy vs
latency vs size with the Pareto front and the selected variant; latency over time when a sustained
series is present; parity per conversion hop; the latency ratio vs the baseline report); the device
state; each variant's lineage.

Plots need matplotlib (``pip install 'edgekit[report]'``); without it the page says so and keeps
every table. Everything taken from the report is HTML-escaped.
"""

from __future__ import annotations

import html
import io
import json
import math
from typing import Any

import numpy as np

from ..measure.compare import format_p
from ..timeline import stage_totals, timeline_line
from .model import ComparedWith, HopParity, Report, VariantResult

_CSS = """
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
"""

_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
            "#17becf"]


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _f(x: float | None, fmt: str = "{:.3f}", none: str = "n/a") -> str:
    return none if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


# --- plots ------------------------------------------------------------------------------------------
def _svg(fig, salt: str) -> str:
    """The figure as inline SVG. A per-plot hash salt keeps element ids unique within the page."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": salt, "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _figure(figsize=(8, 3.6)):
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=100)
    return fig, fig.add_subplot(1, 1, 1)


def _raw(v: VariantResult) -> np.ndarray | None:
    lat = v.latency_ms
    if lat is None or not lat.raw:
        return None
    x = np.asarray(lat.raw, dtype=np.float64)
    x = x[np.isfinite(x) & (x > 0)]
    return x if x.size else None


def plot_latency_distribution(r: Report) -> str | None:
    vs = [v for v in r.variants if v.latency_ms is not None]
    if not vs:
        return None
    fig, ax = _figure((8, 0.9 + 0.75 * len(vs)))
    for i, v in enumerate(vs):
        lat, y = v.latency_ms, len(vs) - 1 - i
        raw = _raw(v)
        color = _PALETTE[i % len(_PALETTE)]
        if raw is not None and raw.size >= 5 and np.ptp(raw) > 0:
            # log-scale violin: on-device timings are right-skewed with a long tail
            logs = np.log10(np.clip(raw, None, np.quantile(raw, 0.995)))
            parts = ax.violinplot([logs], positions=[y], vert=False, widths=0.8, showextrema=False)
            for body in parts["bodies"]:
                body.set_facecolor(color)
                body.set_alpha(0.35)
        ax.plot([math.log10(lat.ci95[0]), math.log10(lat.ci95[1])], [y, y], color=color, lw=5, solid_capstyle="butt")
        ax.plot([math.log10(lat.p50)], [y], "o", color="black", ms=4)
        for q, mk in ((lat.p90, "|"), (lat.p99, "x")):
            ax.plot([math.log10(q)], [y], mk, color=color, ms=9)
    ax.set_yticks(range(len(vs)))
    ax.set_yticklabels([v.name for v in reversed(vs)])
    lo, hi = ax.get_xlim()
    ticks = [t for t in _nice_log_ticks(10 ** lo, 10 ** hi)]
    ax.set_xticks([math.log10(t) for t in ticks])
    ax.set_xticklabels([f"{t:g}" for t in ticks])
    ax.set_xlabel("latency per inference, ms (log scale)")
    ax.set_title("Latency distribution: dot p50, bar 95% CI of p50, | p90, x p99", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return _svg(fig, "latency-distribution")


def _nice_log_ticks(lo: float, hi: float) -> list[float]:
    for mantissas in ((1, 2, 5), (1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9)):  # finer when the range is narrow
        out = []
        for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1):
            for m in mantissas:
                t = float(f"{m * 10 ** e:.6g}")
                if lo <= t <= hi:
                    out.append(t)
        if len(out) >= 3:
            return out
    return out or [lo, hi]


def pareto_front(points: list[tuple[float, float, float]]) -> list[int]:
    """Indices of the points no other point dominates, for (latency: lower, accuracy: higher, size: lower)."""
    front = []
    for i, (li, ai, si) in enumerate(points):
        dominated = any(lj <= li and aj >= ai and sj <= si and (lj, aj, sj) != (li, ai, si)
                        for j, (lj, aj, sj) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return front


def plot_pareto(r: Report) -> str | None:
    vs = [v for v in r.variants if v.latency_ms is not None and v.accuracy is not None]
    if not vs:
        return None
    pts = [(v.latency_ms.p50, v.accuracy.value, float(v.size_bytes)) for v in vs]
    lower = vs[0].accuracy.direction == "lower"  # e.g. mse: the front wants the smallest error
    front = set(pareto_front([(a, -b if lower else b, c) for a, b, c in pts]))
    fig, ax = _figure((8, 4.2))
    smax = max(p[2] for p in pts) or 1.0
    for i, (v, (lat, acc, size)) in enumerate(zip(vs, pts)):
        area = 60 + 900 * size / smax  # marker area follows model size
        ax.scatter([lat], [acc], s=area, color=_PALETTE[i % len(_PALETTE)], alpha=0.55,
                   edgecolors="black" if i in front else "none", linewidths=2 if i in front else 0, zorder=3)
        if v.selected:
            ax.scatter([lat], [acc], s=260, marker="*", color="gold", edgecolors="black", zorder=4)
        label = f"{v.name}\n{size / 1024:.0f} KB" + (" (baseline)" if v.name == r.baseline else "") + \
                (" SELECTED" if v.selected else "")
        # alternate above/below so close variants (e.g. fp32 and int8 at equal accuracy) stay readable
        ax.annotate(label, (lat, acc), textcoords="offset points", xytext=(10, 6 if i % 2 == 0 else -24), fontsize=8)
    fr = sorted((pts[i][0], pts[i][1]) for i in front)
    if len(fr) > 1:
        ax.step([p[0] for p in fr], [p[1] for p in fr], where="post", color="black", ls="--", lw=1, zorder=2,
                label="Pareto front (latency, accuracy, size)")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("p50 latency, ms")
    ax.set_ylabel(f"{vs[0].accuracy.metric}" + (f", {vs[0].accuracy.units}" if vs[0].accuracy.units else "")
                  + (" (lower is better)" if lower else ""))
    ax.set_title("Accuracy vs latency; marker area = model size; black ring = on the Pareto front"
                 + ("; star = selected" if any(v.selected for v in vs) else ""), fontsize=10)
    ax.grid(alpha=0.3)
    ax.margins(x=0.25)
    accs = [p[1] for p in pts]
    pad = max(1.0, 0.3 * (max(accs) - min(accs)))
    pad = pad if vs[0].accuracy.units in ("%", "dB") else 0.3 * (max(accs) - min(accs)) or abs(max(accs)) * 0.1 or 1e-6
    top = max(accs) + pad
    ax.set_ylim(min(accs) - pad, min(top, 100.5) if vs[0].accuracy.units == "%" else top)
    return _svg(fig, "pareto")


def sustained_series(v: VariantResult) -> tuple[list[float], list[float]] | None:
    """A sustained-mode latency series (seconds, ms) if the report carries one: the agent's
    ``{"bins": [{"t_end_s", "p50", ...}...]}``, or ``{"series": [{"t_s", "p50_ms"|"latency_ms"|"ms"}...]}``, ``{"t_s": [...], "latency_ms": [...]}`` or a
    list of ``[t_s, ms]`` pairs, under the variant's ``sustained`` or ``latency_ms.sustained``; else None."""
    extra = dict(v.model_extra or {})
    lat_extra = dict((v.latency_ms.model_extra or {}) if v.latency_ms else {})
    s = getattr(v, "sustained", None) or extra.get("sustained") or lat_extra.get("sustained")
    if not s:
        return None
    if isinstance(s, dict) and isinstance(s.get("bins"), list):
        # the agent's sustained summary (edgekit.measure.sustained): one p50 per time bin, at the bin's end
        pts = [(b.get("t_end_s"), b.get("p50")) for b in s["bins"] if isinstance(b, dict)]
        pts = [(float(t), float(y)) for t, y in pts if t is not None and y is not None]
        return ([p[0] for p in pts], [p[1] for p in pts]) if pts else None
    if isinstance(s, dict) and "series" in s:
        s = s["series"]
    t: list[float] = []
    y: list[float] = []
    try:
        if isinstance(s, dict):
            tk = next(k for k in ("t_s", "t", "time_s", "seconds") if k in s)
            yk = next(k for k in ("p50_ms", "latency_ms", "ms", "median_ms") if k in s)
            t, y = [float(a) for a in s[tk]], [float(b) for b in s[yk]]
        elif isinstance(s, list):
            for item in s:
                if isinstance(item, dict):
                    tk = next(k for k in ("t_s", "t", "time_s", "seconds") if k in item)
                    yk = next(k for k in ("p50_ms", "latency_ms", "ms", "median_ms") if k in item)
                    t.append(float(item[tk]))
                    y.append(float(item[yk]))
                else:
                    t.append(float(item[0]))
                    y.append(float(item[1]))
    except (StopIteration, TypeError, ValueError, IndexError, KeyError):
        return None
    return (t, y) if t and len(t) == len(y) else None


def plot_sustained(r: Report) -> str | None:
    series = [(v, sustained_series(v)) for v in r.variants]
    series = [(v, s) for v, s in series if s is not None]
    if not series:
        return None
    fig, ax = _figure((8, 3.4))
    tax = None
    for i, (v, (t, y)) in enumerate(series):
        color = _PALETTE[i % len(_PALETTE)]
        ax.plot(t, y, "-", color=color, label=v.name, lw=1.4)
        # the device's temperature per bin, when it has a sensor: throttling shows as both lines rising
        bins = (getattr(v, "sustained", None) or {}).get("bins") if isinstance(getattr(v, "sustained", None), dict) else None
        temps = [(b.get("t_end_s"), b.get("temperature_c")) for b in bins or [] if isinstance(b, dict)]
        temps = [(float(a), float(c)) for a, c in temps if a is not None and c is not None]
        if temps:
            tax = tax or ax.twinx()
            tax.plot([a for a, _ in temps], [c for _, c in temps], ":", color=color, lw=1.2)
            tax.set_ylabel("temperature, °C (dotted)")
    ax.set_xlabel("time since the start of the sustained run, s")
    ax.set_ylabel("latency, ms")
    ax.set_title("Latency over time (sustained mode): a rising line means thermal throttling", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _svg(fig, "sustained")


def parity_hops(v: VariantResult) -> list[tuple[str, HopParity]]:
    """(hop, parity) along the variant's chain: each lineage step that measured parity, then the device."""
    hops = []
    for step in v.lineage:
        par = step.parity
        if par is not None and par.max_abs_err is not None:
            hops.append((step.name, par))
    if v.parity is not None:
        hops.append((f"on device ({v.runtime.name})", HopParity.model_validate(v.parity.model_dump())))
    return hops


def plot_parity(r: Report) -> str | None:
    chains = [(v, parity_hops(v)) for v in r.variants]
    chains = [(v, h) for v, h in chains if h]
    if not chains:
        return None
    hop_names: list[str] = []
    for _, hops in chains:
        for name, _ in hops:
            if name not in hop_names:
                hop_names.append(name)
    fig, ax = _figure((8, 3.8))
    width = 0.8 / len(chains)
    floor = 1e-9  # a perfect hop (0 error) is drawn at the floor of the log axis
    for i, (v, hops) in enumerate(chains):
        d = dict(hops)
        xs = [j + (i - (len(chains) - 1) / 2) * width for j, n in enumerate(hop_names) if n in d]
        ys = [max(float(d[n].max_abs_err), floor) for n in hop_names if n in d]
        ax.bar(xs, ys, width=width, color=_PALETTE[i % len(_PALETTE)], label=v.name)
        for x, n in zip(xs, [n for n in hop_names if n in d]):
            t1 = d[n].top1_agreement
            if t1 is not None:
                ax.annotate(f"{t1:.0%}", (x, max(float(d[n].max_abs_err), floor)), textcoords="offset points",
                            xytext=(0, 2), ha="center", fontsize=7)
    ax.set_yscale("log")
    ax.set_xticks(range(len(hop_names)))
    ax.set_xticklabels(hop_names, fontsize=8)
    ax.set_ylabel("max |error| vs PyTorch (log)")
    ax.set_title("Parity along the chain, per hop (label: top-1 agreement)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _svg(fig, "parity")


def plot_comparison(r: Report) -> str | None:
    comp = r.comparison
    if comp is None:
        return None
    rows = []
    for vd in comp.variants:
        for c in vd.changes:
            if c.metric == "latency_p50_ms" and c.before and c.after:
                ci = c.ratio_ci95 or [None, None]
                rows.append((vd.variant, c.after / c.before, ci, c.verdict))
    if not rows:
        return None
    fig, ax = _figure((8, 0.9 + 0.6 * len(rows)))
    for i, (name, ratio, ci, verdict) in enumerate(rows):
        y = len(rows) - 1 - i
        color = "#a50e0e" if verdict == "slower" else ("#137333" if verdict == "faster" else "#555")
        if ci[0] is not None and not any(math.isnan(x) for x in ci):
            ax.plot(ci, [y, y], color=color, lw=4, alpha=0.6)
        ax.plot([ratio], [y], "o", color=color)
        ax.annotate(verdict, (ratio, y), textcoords="offset points", xytext=(8, 4), fontsize=8, color=color)
    ax.axvline(1.0, color="black", lw=1)
    thr = comp.min_effect
    if thr:
        ax.axvline(1 + thr, color="#a50e0e", lw=1, ls="--", label=f"regression threshold +{thr:.0%}")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r_[0] for r_ in reversed(rows)])
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel("p50 latency ratio, this report / baseline report (bar: 95% bootstrap CI)")
    ax.set_title("Latency vs the baseline report", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.margins(x=0.3)
    return _svg(fig, "comparison")


def plot_fleet(r: Report) -> str | None:
    """p50 per unit (bars, one group per variant), the judged unit marked; failed units named."""
    fl = r.fleet
    if fl is None or not fl.variants:
        return None
    units = [u for u in fl.units if u.state == "measured"]
    fig, ax = _figure((8, 1.2 + 0.35 * len(units) * len(fl.variants)))
    y, labels = 0, []
    for vi, v in enumerate(fl.variants):
        for u in units:
            p50 = (u.latency_ms.get(v.name) or {}).get("p50")
            if p50 is None:
                continue
            ax.barh(y, p50, color=_PALETTE[vi % len(_PALETTE)], edgecolor="black" if u.name == fl.judged_unit else None,
                    linewidth=2 if u.name == fl.judged_unit else 0)
            labels.append(f"{v.name} · {u.name}")
            y += 1
        ax.axvline(v.median_of_medians_ms, color=_PALETTE[vi % len(_PALETTE)], ls="--", lw=1)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set_xlabel("p50 latency per inference, ms (dashed: median of the units' p50s)")
    bad = [u.name for u in fl.units if u.state != "measured"]
    ax.set_title(f"Per-unit latency: judged unit {fl.judged_unit} outlined"
                 + (f"; unmeasured: {', '.join(bad)}" if bad else ""), fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return _svg(fig, "fleet-units")


def plot_op_profile(r: Report, top: int = 10) -> str | None:
    """Per diff: the top op types' time per inference, baseline vs variant (horizontal bars); op
    types, not nodes, so a quantized graph's added and replaced nodes line up with the float one's."""
    diffs = [d for d in r.profile_diffs if d.rows][:3]
    if not diffs:
        return None
    from matplotlib.figure import Figure

    rows = [sorted(d.rows, key=lambda x: -max(x.base_ms, x.other_ms))[:top] for d in diffs]
    fig = Figure(figsize=(8, sum(0.9 + 0.36 * len(x) for x in rows)), dpi=100)
    axes = fig.subplots(len(diffs), 1, squeeze=False,
                        gridspec_kw={"height_ratios": [max(len(x), 1) + 2 for x in rows]})[:, 0]
    for ax, d, rs in zip(axes, diffs, rows):
        ys = np.arange(len(rs))
        ax.barh(ys - 0.2, [x.base_ms for x in rs], height=0.4, color=_PALETTE[0], label=f"{d.base} (baseline)")
        ax.barh(ys + 0.2, [x.other_ms for x in rs], height=0.4, color=_PALETTE[1], label=d.other)
        ax.set_yticks(ys)
        ax.set_yticklabels([f"{x.op_type} ({x.base_nodes}/{x.other_nodes})" for x in rs], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("ms per inference under the profiler (median call x calls per run)")
        ax.set_title(f"{d.other} vs {d.base}: {'+' if (d.delta_ms or 0) >= 0 else ''}{d.delta_ms or 0:.3g} ms a run"
                     + ("" if d.same_runtime else " (different runtimes: op types only)"), fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return _svg(fig, "op-profile")


_PLOTS = [
    ("plot-latency", "Latency distribution", plot_latency_distribution,
     "Each variant's raw on-device timings (violin, log scale), its p50 with the bootstrap 95% CI, p90 and p99."),
    ("plot-pareto", "Accuracy vs latency vs size", plot_pareto,
     "Accuracy against p50 latency; marker area is the model size; ringed variants are on the Pareto front "
     "(no other variant is at once faster, smaller and at least as accurate); a star marks the selected variant."),
    ("plot-sustained", "Latency over time", plot_sustained,
     "Latency during the sustained run; a rising line means the device throttled."),
    ("plot-parity", "Parity per hop", plot_parity,
     "Maximum absolute output error against PyTorch after each conversion hop and on the device; "
     "labels are top-1 agreement."),
    ("plot-comparison", "Against the baseline report", plot_comparison,
     "Ratio of p50 latency to the baseline report's, with the 95% bootstrap CI; right of the dashed line "
     "and significant = a regression."),
    ("plot-fleet", "Per-unit latency (fleet run)", plot_fleet,
     "p50 of each variant on each unit of the fleet; the unit the gate judged is outlined."),
    ("plot-op-profile", "Per-op profile: baseline vs variant", plot_op_profile,
     "Time per inference of the top op types from the device runtime's own profiler, baseline vs each profiled "
     "variant (labels: nodes in each); see the per-op section for the nodes and their PyTorch modules."),
]


def _plots(r: Report) -> list[str]:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return ["<p class=muted>Plots need matplotlib: <code>pip install 'edgekit[report]'</code>. "
                "Every figure is in the tables above.</p>"]
    out = []
    for pid, title, fn, caption in _PLOTS:
        svg = fn(r)
        if svg is None:
            continue
        out.append(f'<figure id="{pid}" class="plot"><figcaption><b>{_e(title)}.</b> {_e(caption)}</figcaption>'
                   f"{svg}</figure>")
    return out


# --- tables -----------------------------------------------------------------------------------------
def _variants_table(r: Report) -> str:
    head = ["variant", "format", "precision", "runtime", "size KB", "p50 ms", "p50 95% CI", "p90 ms", "p99 ms",
            "CoV", "runs", "peak MB", "energy mJ/inf", _e(r.metric_label()), "drop (paired 95% CI)", "max |err|",
            "cosine", "top-1 agree"]
    rows = []
    for v in r.variants:
        lat, acc, par = v.latency_ms, v.accuracy, v.parity
        name = _e(v.name) + (" <span class=muted>(baseline)</span>" if v.name == r.baseline else "") + \
            (" <b>★ selected</b>" if v.selected else "")
        energy = _f(v.energy_mj_per_inference, "{:.3f}") if v.energy_mj_per_inference is not None else \
            f'<span class=muted title="{_e(v.energy_reason)}">null</span>'
        cells = [name, _e(v.format), _e(v.precision),
                 _e(f"{v.runtime.name} {v.runtime.version or ''} x{v.runtime.threads}"),
                 _f(v.size_bytes / 1024, "{:.1f}"), _f(lat and lat.p50, "{:.4f}"),
                 f"{lat.ci95[0]:.4f}–{lat.ci95[1]:.4f}" if lat else "n/a", _f(lat and lat.p90, "{:.4f}"),
                 _f(lat and lat.p99, "{:.4f}"),
                 (f"{lat.cov:.1%}" + ("" if lat.stable else " <span class=bad>unstable</span>")) if lat else "n/a",
                 str(lat.runs) if lat else "n/a", _f(v.peak_memory_mb, "{:.1f}"), energy,
                 _f(acc and acc.value, "{:.4g}"), _e(_drop_text(v)),
                 _f(par and par.max_abs_err, "{:.2e}"), _f(par and par.cosine, "{:.6f}"),
                 _f(par and par.top1_agreement, "{:.1%}")]
        rows.append("<tr>" + "".join(f"<td{' class=n' if i > 3 else ''}>{c}</td>"
                                     for i, c in enumerate(cells)) + "</tr>")
    return ("<div class=scroll><table id=variants><thead><tr>" + "".join(f"<th>{h}</th>" for h in head)
            + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table></div>")


def _drop_text(v) -> str:
    if v.accuracy_drop is None:
        return "n/a"
    ci = (v.accuracy_stats or {}).get("ci95")
    return f"{v.accuracy_drop:+.3g}" + (f" [{ci[0]:+.3g}, {ci[1]:+.3g}]" if ci else "")


def _outputs_table(r: Report) -> str:
    """Parity of every output of a multi-output model."""
    rows = [(v, name, p) for v in r.variants for name, p in (v.parity_outputs or {}).items()]
    if not rows:
        return ""
    body = "".join(f"<tr><td>{_e(v.name)}</td><td>{_e(n)}</td><td class=n>{p.max_abs_err:.2e}</td>"
                   f"<td class=n>{p.cosine:.6f}</td><td class=n>{_f(p.top1_agreement, '{:.1%}')}</td></tr>"
                   for v, n, p in rows)
    return ("<h2 id=outputs>Parity per output</h2><table id=parity-outputs><thead><tr><th>variant</th><th>output</th>"
            "<th>max |err|</th><th>cosine</th><th>top-1 agree</th></tr></thead><tbody>" + body + "</tbody></table>")


def _checks_table(r: Report) -> str:
    if not r.gate.checks:
        return "<p class=muted>The gate had no checks to run.</p>"
    rows = []
    for c in r.gate.checks:
        res = "<span class=good>pass</span>" if c.passed else "<span class=bad>FAIL</span>"
        p = "" if c.p_value is None else format_p(c.p_value)
        rows.append(f"<tr class={'pass' if c.passed else 'fail'}><td>{_e(c.name)}</td><td>{_e(c.variant)}</td>"
                    f"<td class=n>{_f(c.value, '{:.4g}', '')}</td><td class=n>{_f(c.limit, '{:.4g}', '')}</td>"
                    f"<td class=n>{p}</td><td>{res}</td><td>{_e(c.message)}</td></tr>")
    return ("<table id=checks><thead><tr><th>check</th><th>variant</th><th>value</th><th>limit</th><th>p-value</th>"
            "<th>result</th><th>message</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def _comparison_section(r: Report) -> str:
    comp = r.comparison
    if comp is None:
        return ""
    cw = r.compared_with or ComparedWith.model_validate(comp.baseline.model_dump())
    parts = [f"<h2 id=comparison>Compared with the baseline report</h2><p>Baseline: <code>{_e(cw.path)}</code>, "
             f"created {_e(cw.created_at)} by edgekit {_e(cw.edgekit_version)}, model sha256 "
             f"<code>{_e(str(cw.model_sha256)[:12])}</code>. Latency: bootstrap CI of the ratio of medians and "
             f"Mann-Whitney U at alpha {_e(comp.alpha)}, minimum effect {_f(comp.min_effect, '{:.0%}')}."
             "</p>"]
    if cw.method is not None:
        detail = (f" <code>{_e(json.dumps(cw.method_detail, sort_keys=True, default=str))}</code>"
                  if cw.method_detail else "")
        parts.append(f"<p id=latency-method>Release latency judged by: <b>{_e(cw.method_description())}</b>{detail}</p>")
    rows = []
    for vd in comp.variants:
        for c in vd.changes:
            bad = c.is_regression
            rows.append(f"<tr{' class=fail' if bad else ''}><td>{_e(vd.variant)}</td><td>{_e(c.metric)}</td>"
                        f"<td class=n>{_f(c.before, '{:.4g}')}</td><td class=n>{_f(c.after, '{:.4g}')}</td>"
                        f"<td class=n>{_f(c.change_rel, '{:+.1%}', '')}</td>"
                        f"<td class=n>{'' if c.p_value is None else format_p(c.p_value)}</td>"
                        f"<td{' class=bad' if bad else ''}>{_e(c.verdict)}</td><td>{_e(c.message)}</td></tr>")
    parts.append("<table id=comparison-table><thead><tr><th>variant</th><th>metric</th><th>before</th><th>after</th>"
                 "<th>change</th><th>p-value</th><th>verdict</th><th>detail</th></tr></thead><tbody>"
                 + "".join(rows) + "</tbody></table>")
    if comp.added:
        parts.append(f"<p>New variants: {_e(', '.join(comp.added))}.</p>")
    if comp.removed:
        parts.append(f"<p>No longer built: {_e(', '.join(comp.removed))}.</p>")
    for w in comp.warnings:
        parts.append(f"<p class=bad>warning: {_e(w)}</p>")
    return "".join(parts)


def _search_section(r: Report) -> str:
    """The variant search (``deploy --search``): what was chosen, by which objective, and every candidate
    with the stage and reason it was dropped at."""
    search = r.search
    if search is None:
        return ""
    shipped = search.shipped.file if search.shipped else None
    head = (f"<h2 id=search>Variant search</h2><p>objective <b>{_e(search.objective)}</b> · selected "
            f"<b>{_e(search.selected or 'nothing')}</b>"
            + (f" · shipping file <code>{_e(shipped)}</code>" if shipped else "")
            + f" · {_f(search.seconds, '{:.0f}')} s of a {_f(search.time_budget_s, '{:.0f}')} s budget</p>")
    head += _timeline_bar(search)
    rows = []
    for c in search.candidates:
        p50 = c.screening.p50 if c.screening else None
        dropped = c.status == "dropped"
        rows.append(f"<tr{' class=fail' if dropped else ''}><td>{_e(c.name)}</td><td>{_e(c.status)}</td>"
                    f"<td>{_e(c.dropped_at)}</td><td>{_e(c.format)}</td><td>{_e(c.precision)}</td>"
                    f"<td class=n>{_f(c.size_bytes / 1024 if c.size_bytes else None, '{:.1f}', '')}</td>"
                    f"<td class=n>{_f(c.host_accuracy, '{:.2f}', '')}</td>"
                    f"<td class=n>{_f(p50, '{:.4f}', '')}</td><td>{_e(c.reason)}</td></tr>")
    return (head + "<div class=scroll><table id=search-candidates><thead><tr><th>candidate</th><th>status</th>"
            "<th>dropped at</th><th>format</th><th>precision</th><th>size KB</th><th>host accuracy %</th>"
            "<th>screening p50 ms</th><th>reason</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table></div>")


_STAGE_COLOURS = {"preparation": "#8e8cd8", "build": "#e8a33d", "host_filter": "#c9b458", "lock_wait": "#bbbbbb",
                  "connect": "#9fc5e8", "delivery": "#6fa8dc", "screening": "#4a9e6b", "finals": "#2b7a4b",
                  "tuning": "#b45f9e", "release": "#a05252", "profile": "#7f7f7f", "report": "#555555"}


def _timeline_bar(search) -> str:
    """Where the search's time went: one stacked bar (inline SVG, no plotting library), the stages in
    pipeline order, and the budget's end marked."""
    tl = search.timeline
    if tl is None or not tl.spans or not tl.wall_s:
        return ""
    totals = [t for t in stage_totals(tl.spans) if t[1] > 0]
    span = max(tl.wall_s, (tl.budget_s or 0) + tl.lock_wait_s)
    width, x, rects, legend = 1000.0, 0.0, [], []
    for stage, secs, n in totals:
        w = width * secs / span
        colour = _STAGE_COLOURS.get(stage, "#999999")
        rects.append(f"<rect x='{x:.1f}' y='0' width='{max(w, 0.5):.1f}' height='22' fill='{colour}'>"
                     f"<title>{_e(stage)}: {secs:.1f} s{f' ({n})' if n > 1 else ''}</title></rect>")
        legend.append(f"<span style='color:{colour}'>&#9632;</span> {_e(stage)} {secs:.1f} s")
        x += w
    if tl.budget_s:
        bx = width * (tl.budget_s + tl.lock_wait_s) / span
        rects.append(f"<line x1='{bx:.1f}' x2='{bx:.1f}' y1='0' y2='28' stroke='#a50e0e' stroke-width='2'>"
                     "<title>end of the time budget (lock wait excluded)</title></line>")
    svg = (f"<svg id=search-timeline viewBox='0 0 {width:.0f} 30' width='100%' height='30' "
           f"xmlns='http://www.w3.org/2000/svg'>{''.join(rects)}</svg>")
    host = (search.host or {}).get("summary")
    return (f"<figure>{svg}<figcaption>{_e(timeline_line(tl))}"
            + (f"<br>{_e(host)}" if host else "") + f"<br>{' · '.join(legend)}</figcaption></figure>")


def _profile_section(r: Report, top: int = 10) -> str:
    """Per-op profiles: each profiled variant's top ops with their PyTorch module, and each diff's
    one-line reason."""
    profiled = [v for v in r.variants if v.op_profile is not None]
    if not profiled:
        return ""
    out = ["<h2 id=op-profile>Per-op profile on the device</h2>"]
    out += [f"<p class=profile-diff><b>{_e(d.other)} vs {_e(d.base)}</b>: {_e(d.summary)}</p>" for d in r.profile_diffs]
    for v in profiled:
        p = v.op_profile
        if not p.available:
            out.append(f"<p><b>{_e(v.name)}</b>: no per-op profile: {_e(p.reason)}</p>")
            continue
        rows = "".join(f"<tr><td><code>{_e(o.node)}</code></td><td>{_e(o.op_type)}</td>"
                       f"<td>{_e('(model)' if o.module == '' else (o.module or 'n/a'))}</td><td>{_e(o.module_class)}</td>"
                       f"<td class=n>{o.ms:.4f}</td><td class=n>{_f(o.share, '{:.1%}')}</td></tr>" for o in p.top(top))
        out.append(f"<details open><summary>{_e(v.name)}: {_e(p.source)}, {p.runs} runs, median run "
                   f"{p.run_ms:.3g} ms, {_f(p.mapped_share, '{:.0%}')} of op time traced to modules</summary>"
                   "<table class=op-profile><thead><tr><th>op</th><th>type</th><th>module</th><th>class</th>"
                   "<th>ms/inference</th><th>share</th></tr></thead><tbody>" + rows + "</tbody></table></details>")
    return "".join(out)


def _fleet_table(r: Report) -> str:
    fl = r.fleet
    if fl is None:
        return ""
    names = [v.name for v in fl.variants]
    head = "".join(f"<th>{_e(h)}</th>" for h in ["unit", "state", "shard", *[f"{n} p50 ms" for n in names],
                                                  "unit gate", "error"])
    rows = []
    for u in fl.units:
        bad = u.state != "measured" or u.gate_passed is False
        cells = [_e(u.name) + (" <b>(judged)</b>" if u.name == fl.judged_unit else ""), _e(u.state),
                 _e(f"{u.shard[0]}-{u.shard[1]}" if u.shard else "all"),
                 *[f"<td class=n>{_f((u.latency_ms.get(n) or {}).get('p50'))}</td>" for n in names],
                 _e("n/a" if u.gate_passed is None else "pass" if u.gate_passed else "FAIL " + ", ".join(u.failed_checks)),
                 _e(u.error or "")]
        rows.append(f"<tr{' class=fail' if bad else ''}>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>"
                                                                     for c in cells) + "</tr>")
    return (f"<h2 id=fleet>Fleet</h2><p>{fl.measured} of {fl.total} units measured; eval {_e(fl.mode)}; the gate "
            f"judged the {_e(fl.gate)} unit <b>{_e(fl.judged_unit)}</b>.</p>"
            f"<table id=fleet-table><tr>{head}</tr>{''.join(rows)}</table>")


def _kv_table(d: dict, table_id: str) -> str:
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v if not isinstance(v, (dict, list)) else json.dumps(v))}</td></tr>"
                   for k, v in d.items())
    return f"<table id={table_id}>{rows}</table>"


def _lineage(r: Report) -> str:
    out = []
    for v in r.variants:
        rows = []
        for i, s in enumerate(v.lineage):
            rows.append(f"<tr><td class=n>{i}</td><td>{_e(s.kind)}</td><td>{_e(s.name)}</td>"
                        f"<td><code>{_e(json.dumps(s.config, sort_keys=True, default=str))}</code></td>"
                        f"<td><code>{_e(json.dumps(s.metrics, sort_keys=True, default=str))}</code></td>"
                        f"<td class=n>{_f(s.seconds, '{:.2f}', '')}</td></tr>")
        state = v.device_state or {}
        out.append(f"<details class=lineage open><summary>{_e(v.name)}: {_e(v.format)} {_e(v.precision)}, sha256 "
                   f"<code>{_e(v.sha256[:12])}</code></summary><table><thead><tr><th>#</th><th>kind</th><th>step</th>"
                   f"<th>config</th><th>metrics</th><th>s</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
                   + (f"<p class=muted>device state during this variant: <code>{_e(json.dumps(state, default=str))}"
                      "</code></p>" if state else "") + "</details>")
    return "".join(out)


def render_html(r: Report) -> str:
    passed = r.gate.passed
    failed = r.gate.failed_checks
    verdict_text = "Gate PASSED" if passed else "Gate FAILED"
    selected = [v.name for v in r.variants if v.selected]
    fail_list = ("<ul>" + "".join(f"<li>{_e(c.name)}{' [' + _e(c.variant) + ']' if c.variant else ''}: "
                                  f"{_e(c.message)}</li>" for c in failed) + "</ul>") if failed else ""
    dev = r.device
    header = (f"<p>target <b>{_e(r.target)}</b> · device <b>{_e(dev.name)}</b> ({_e(dev.arch)}, "
              f"{_e(dev.cpu or 'cpu n/a')}, {_e(dev.cores)} cores, {_e(dev.transport)}) · "
              f"model <code>{_e(r.model.get('source'))}</code> · baseline variant <b>{_e(r.baseline)}</b>"
              + (f" · selected <b>{_e(', '.join(selected))}</b>" if selected else "")
              + (f" · compared with <code>{_e(r.compared_with.path)}</code>" if r.compared_with else "")
              + f"</p><p id=metric>{_e(r.metric_line())}</p><p class=muted>created {_e(r.created_at)} by edgekit {_e(r.edgekit_version)} · report schema "
              f"{_e(r.schema_version)}</p>")
    d = r.decision
    decision = ("" if d is None else f"<h2>Decision</h2><p><b>Ship:</b> {_e(d.reason if d.ship else 'nothing: ' + d.reason)}</p>"
                + ("<ul>" + "".join(f"<li>not <b>{_e(n)}</b>: {_e(w)}</li>" for n, w in d.lost.items()) + "</ul>"
                   if d.lost else ""))
    warnings = ("<h2>Warnings</h2><ul>" + "".join(f"<li>{_e(w)}</li>" for w in r.warnings) + "</ul>") if r.warnings else ""
    energy_reasons = sorted({v.energy_reason for v in r.variants if v.energy_mj_per_inference is None and v.energy_reason})
    energy_note = f"<p class=muted>Energy not measured: {_e('; '.join(energy_reasons))}.</p>" if energy_reasons else ""
    body = [
        f"<h1>edgekit report: {_e(r.model.get('source') or 'model')} on {_e(r.target)}</h1>",
        f'<div id=verdict class="verdict {"pass" if passed else "fail"}">{verdict_text}'
        f" ({len(r.gate.checks) - len(failed)}/{len(r.gate.checks)} checks passed){fail_list}</div>",
        header,
        decision, "<h2 id=variants-h>Variants</h2>", _variants_table(r), energy_note, _outputs_table(r),
        "<h2 id=gate>Gate checks</h2>", _checks_table(r),
        _comparison_section(r),
        _search_section(r), _fleet_table(r), _profile_section(r),
        "<h2 id=plots>Plots</h2>", *_plots(r),
        "<h2 id=device>Device state</h2>", _kv_table(dev.model_dump(mode="json", exclude_none=True), "device-table"),
        "<h2 id=lineage>Lineage of each variant</h2>", _lineage(r),
        warnings,
    ]
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            "<meta name=viewport content='width=device-width, initial-scale=1'>"
            f"<title>edgekit: {verdict_text} - {_e(r.target)}</title><style>{_CSS}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")
