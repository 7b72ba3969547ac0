"""The report's figures, drawn with matplotlib as inline SVG (no scripts, no network): the latency
distribution per variant; accuracy vs latency vs size with the Pareto front and the selected variant; latency
over time when a sustained series is present; parity per conversion hop; the latency ratio vs the baseline
report; per-unit latency of a fleet run; the per-op profile diff. :func:`plots` returns each as a captioned
``<figure>``; without matplotlib (``pip install 'edgekit[report]'``) one line says so and the tables stay."""

from __future__ import annotations

import io
import math
from typing import TYPE_CHECKING, Any, Callable, cast

import numpy as np

from .html_markup import PALETTE, esc
from .model import HopParity, Report, VariantResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _svg(fig: Figure, salt: str) -> str:
    """The figure as inline SVG. A per-plot hash salt keeps element ids unique within the page."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": salt, "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _figure(figsize: tuple[float, float] = (8, 3.6)) -> tuple[Figure, Axes]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=100)
    return fig, fig.add_subplot(1, 1, 1)


def _raw(v: VariantResult) -> np.ndarray[Any, np.dtype[np.float64]] | None:
    lat = v.latency_ms
    if lat is None or not lat.raw:
        return None
    x = np.asarray(lat.raw, dtype=np.float64)
    x = x[np.isfinite(x) & (x > 0)]
    return x if x.size else None


def plot_latency_distribution(r: Report) -> str | None:
    timed = [(v, v.latency_ms) for v in r.variants if v.latency_ms is not None]
    vs = [v for v, _ in timed]
    if not vs:
        return None
    fig, ax = _figure((8, 0.9 + 0.75 * len(vs)))
    for i, (v, lat) in enumerate(timed):
        y = len(vs) - 1 - i
        raw = _raw(v)
        color = PALETTE[i % len(PALETTE)]
        if raw is not None and raw.size >= 5 and np.ptp(raw) > 0:
            # log-scale violin: on-device timings are right-skewed with a long tail
            logs = np.log10(np.clip(raw, None, np.quantile(raw, 0.995)))
            parts = ax.violinplot([logs], positions=[y], vert=False, widths=0.8, showextrema=False)
            for body in cast("list[Any]", parts["bodies"]):
                body.set_facecolor(color)
                body.set_alpha(0.35)
        ax.plot([math.log10(lat.ci95[0]), math.log10(lat.ci95[1])], [y, y], color=color, lw=5, solid_capstyle="butt")
        ax.plot([math.log10(lat.p50)], [y], "o", color="black", ms=4)
        for q, mk in ((lat.p90, "|"), (lat.p99, "x")):
            ax.plot([math.log10(q)], [y], mk, color=color, ms=9)
    ax.set_yticks(range(len(vs)))
    ax.set_yticklabels([v.name for v in reversed(vs)])
    lo, hi = ax.get_xlim()
    ticks = [t for t in _nice_log_ticks(10**lo, 10**hi)]
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
                t = float(f"{m * 10**e:.6g}")
                if lo <= t <= hi:
                    out.append(t)
        if len(out) >= 3:
            return out
    return out or [lo, hi]


def pareto_front(points: list[tuple[float, float, float]]) -> list[int]:
    """Indices of the points no other point dominates, for (latency: lower, accuracy: higher, size: lower)."""
    front = []
    for i, (li, ai, si) in enumerate(points):
        dominated = any(
            lj <= li and aj >= ai and sj <= si and (lj, aj, sj) != (li, ai, si)
            for j, (lj, aj, sj) in enumerate(points)
            if j != i
        )
        if not dominated:
            front.append(i)
    return front


def plot_pareto(r: Report) -> str | None:
    scored = [(v, v.latency_ms, v.accuracy) for v in r.variants if v.latency_ms is not None and v.accuracy is not None]
    if not scored:
        return None
    vs = [v for v, _, _ in scored]
    pts = [(lat.p50, acc.value, float(v.size_bytes)) for v, lat, acc in scored]
    first = scored[0][2]
    lower = first.direction == "lower"  # e.g. mse: the front wants the smallest error
    front = set(pareto_front([(a, -b if lower else b, c) for a, b, c in pts]))
    fig, ax = _figure((8, 4.2))
    smax = max(p[2] for p in pts) or 1.0
    for i, (v, (lat, acc, size)) in enumerate(zip(vs, pts)):
        area = 60 + 900 * size / smax  # marker area follows model size
        ax.scatter(
            [lat],
            [acc],
            s=area,
            color=PALETTE[i % len(PALETTE)],
            alpha=0.55,
            edgecolors="black" if i in front else "none",
            linewidths=2 if i in front else 0,
            zorder=3,
        )
        if v.selected:
            ax.scatter([lat], [acc], s=260, marker="*", color="gold", edgecolors="black", zorder=4)
        label = (
            f"{v.name}\n{size / 1024:.0f} KB"
            + (" (baseline)" if v.name == r.baseline else "")
            + (" SELECTED" if v.selected else "")
        )
        # alternate above/below so close variants (e.g. fp32 and int8 at equal accuracy) stay readable
        ax.annotate(label, (lat, acc), textcoords="offset points", xytext=(10, 6 if i % 2 == 0 else -24), fontsize=8)
    fr = sorted((pts[i][0], pts[i][1]) for i in front)
    if len(fr) > 1:
        ax.step(
            [p[0] for p in fr],
            [p[1] for p in fr],
            where="post",
            color="black",
            ls="--",
            lw=1,
            zorder=2,
            label="Pareto front (latency, accuracy, size)",
        )
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("p50 latency, ms")
    ax.set_ylabel(
        f"{first.metric}" + (f", {first.units}" if first.units else "") + (" (lower is better)" if lower else "")
    )
    ax.set_title(
        "Accuracy vs latency; marker area = model size; black ring = on the Pareto front"
        + ("; star = selected" if any(v.selected for v in vs) else ""),
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.margins(x=0.25)
    accs = [p[1] for p in pts]
    pad = max(1.0, 0.3 * (max(accs) - min(accs)))
    pad = pad if first.units in ("%", "dB") else 0.3 * (max(accs) - min(accs)) or abs(max(accs)) * 0.1 or 1e-6
    top = max(accs) + pad
    ax.set_ylim(min(accs) - pad, min(top, 100.5) if first.units == "%" else top)
    return _svg(fig, "pareto")


def sustained_series(v: VariantResult) -> tuple[list[float], list[float]] | None:
    """A sustained-mode latency series (seconds, ms) if the report carries one: the agent's
    ``{"bins": [{"t_end_s", "p50", ...}...]}``, or ``{"series": [{"t_s", "p50_ms"|"latency_ms"|"ms"}...]}``,
    ``{"t_s": [...], "latency_ms": [...]}`` or a list of ``[t_s, ms]`` pairs, under the variant's ``sustained``
    or ``latency_ms.sustained``; else None."""
    extra = dict(v.model_extra or {})
    lat_extra = dict((v.latency_ms.model_extra or {}) if v.latency_ms else {})
    s = getattr(v, "sustained", None) or extra.get("sustained") or lat_extra.get("sustained")
    if not s:
        return None
    if isinstance(s, dict) and isinstance(s.get("bins"), list):
        # the agent's sustained summary (edgekit.measure.sustained): one p50 per time bin, at the bin's end
        raw_pts = [(b.get("t_end_s"), b.get("p50")) for b in s["bins"] if isinstance(b, dict)]
        pts = [(float(t), float(y)) for t, y in raw_pts if t is not None and y is not None]
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
    series: list[tuple[VariantResult, tuple[list[float], list[float]]]] = []
    for v in r.variants:
        s = sustained_series(v)
        if s is not None:
            series.append((v, s))
    if not series:
        return None
    fig, ax = _figure((8, 3.4))
    tax: Axes | None = None
    for i, (v, (t, y)) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        ax.plot(t, y, "-", color=color, label=v.name, lw=1.4)
        # the device's temperature per bin, when it has a sensor: throttling shows as both lines rising
        bins = v.sustained.get("bins") if isinstance(v.sustained, dict) else None
        raw_temps = [(b.get("t_end_s"), b.get("temperature_c")) for b in bins or [] if isinstance(b, dict)]
        temps = [(float(a), float(c)) for a, c in raw_temps if a is not None and c is not None]
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
    hops: list[tuple[str, HopParity]] = []
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
        ys = [max(d[n].max_abs_err or 0.0, floor) for n in hop_names if n in d]
        ax.bar(xs, ys, width=width, color=PALETTE[i % len(PALETTE)], label=v.name)
        for x, n in zip(xs, [n for n in hop_names if n in d]):
            t1 = d[n].top1_agreement
            if t1 is not None:
                ax.annotate(
                    f"{t1:.0%}",
                    (x, max(d[n].max_abs_err or 0.0, floor)),
                    textcoords="offset points",
                    xytext=(0, 2),
                    ha="center",
                    fontsize=7,
                )
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
    rows: list[tuple[str, float, list[float] | None, str]] = []
    for vd in comp.variants:
        for c in vd.changes:
            if c.metric == "latency_p50_ms" and c.before and c.after:
                ci = c.ratio_ci95
                rows.append((vd.variant, c.after / c.before, ci, c.verdict))
    if not rows:
        return None
    fig, ax = _figure((8, 0.9 + 0.6 * len(rows)))
    for i, (_name, ratio, ci, verdict) in enumerate(rows):
        y = len(rows) - 1 - i
        color = "#a50e0e" if verdict == "slower" else ("#137333" if verdict == "faster" else "#555")
        if ci is not None and len(ci) == 2 and not any(math.isnan(x) for x in ci):
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
            ax.barh(
                y,
                p50,
                color=PALETTE[vi % len(PALETTE)],
                edgecolor="black" if u.name == fl.judged_unit else None,
                linewidth=2 if u.name == fl.judged_unit else 0,
            )
            labels.append(f"{v.name} · {u.name}")
            y += 1
        ax.axvline(v.median_of_medians_ms, color=PALETTE[vi % len(PALETTE)], ls="--", lw=1)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set_xlabel("p50 latency per inference, ms (dashed: median of the units' p50s)")
    bad = [u.name for u in fl.units if u.state != "measured"]
    ax.set_title(
        f"Per-unit latency: judged unit {fl.judged_unit} outlined" + (f"; unmeasured: {', '.join(bad)}" if bad else ""),
        fontsize=10,
    )
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
    axes = fig.subplots(
        len(diffs), 1, squeeze=False, gridspec_kw={"height_ratios": [max(len(x), 1) + 2 for x in rows]}
    )[:, 0]
    for ax, d, rs in zip(axes, diffs, rows):
        ys = np.arange(len(rs))
        ax.barh(ys - 0.2, [x.base_ms for x in rs], height=0.4, color=PALETTE[0], label=f"{d.base} (baseline)")
        ax.barh(ys + 0.2, [x.other_ms for x in rs], height=0.4, color=PALETTE[1], label=d.other)
        ax.set_yticks(ys)
        ax.set_yticklabels([f"{x.op_type} ({x.base_nodes}/{x.other_nodes})" for x in rs], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("ms per inference under the profiler (median call x calls per run)")
        ax.set_title(
            f"{d.other} vs {d.base}: {'+' if (d.delta_ms or 0) >= 0 else ''}{d.delta_ms or 0:.3g} ms a run"
            + ("" if d.same_runtime else " (different runtimes: op types only)"),
            fontsize=10,
        )
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return _svg(fig, "op-profile")


_PLOTS: list[tuple[str, str, Callable[[Report], str | None], str]] = [
    (
        "plot-latency",
        "Latency distribution",
        plot_latency_distribution,
        "Each variant's raw on-device timings (violin, log scale), its p50 with the bootstrap 95% CI, p90 and p99.",
    ),
    (
        "plot-pareto",
        "Accuracy vs latency vs size",
        plot_pareto,
        "Accuracy against p50 latency; marker area is the model size; ringed variants are on the Pareto front "
        "(no other variant is at once faster, smaller and at least as accurate); a star marks the selected variant.",
    ),
    (
        "plot-sustained",
        "Latency over time",
        plot_sustained,
        "Latency during the sustained run; a rising line means the device throttled.",
    ),
    (
        "plot-parity",
        "Parity per hop",
        plot_parity,
        "Maximum absolute output error against PyTorch after each conversion hop and on the device; "
        "labels are top-1 agreement.",
    ),
    (
        "plot-comparison",
        "Against the baseline report",
        plot_comparison,
        "Ratio of p50 latency to the baseline report's, with the 95% bootstrap CI; right of the dashed line "
        "and significant = a regression.",
    ),
    (
        "plot-fleet",
        "Per-unit latency (fleet run)",
        plot_fleet,
        "p50 of each variant on each unit of the fleet; the unit the gate judged is outlined.",
    ),
    (
        "plot-op-profile",
        "Per-op profile: baseline vs variant",
        plot_op_profile,
        "Time per inference of the top op types from the device runtime's own profiler, baseline vs each profiled "
        "variant (labels: nodes in each); see the per-op section for the nodes and their PyTorch modules.",
    ),
]


def plots(r: Report) -> list[str]:
    """Every figure the report has data for, each a captioned ``<figure>``; one note instead without matplotlib."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return [
            "<p class=muted>Plots need matplotlib: <code>pip install 'edgekit[report]'</code>. "
            "Every figure is in the tables above.</p>"
        ]
    out: list[str] = []
    for pid, title, fn, caption in _PLOTS:
        svg = fn(r)
        if svg is None:
            continue
        out.append(
            f'<figure id="{pid}" class="plot"><figcaption><b>{esc(title)}.</b> {esc(caption)}</figcaption>'
            f"{svg}</figure>"
        )
    return out
