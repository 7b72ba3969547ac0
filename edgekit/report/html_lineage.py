"""Each variant's lineage, readable: the steps that produced its file, one row a step with its kind, hop, the
precision it produced, its parity against the reference and its time in columns, the full record (config,
metrics, hashes) collapsed beside it as key/value tables, never as raw dict text.

Variants that are one file measured under several runtime settings (threads, delegate, runtime options) share
one lineage: it is shown once, naming the settings that share it, instead of once a setting."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .html_markup import esc, inline, num, record
from .model import LineageStep, Report, VariantResult


@dataclass
class LineageGroup:
    """One file's lineage and the variants (runtime settings) measured on that file."""

    steps: list[LineageStep]
    variants: list[VariantResult] = field(default_factory=list)

    @property
    def first(self) -> VariantResult:
        return self.variants[0]


def _key(v: VariantResult) -> str:
    # the file (its hash) and its whole history: equal keys are one artifact, whatever it was measured with
    return json.dumps(
        [v.sha256, v.format, v.precision, [s.model_dump(mode="json") for s in v.lineage]], sort_keys=True, default=str
    )


def group_lineages(variants: list[VariantResult]) -> list[LineageGroup]:
    """The distinct lineages in report order, each with every variant that shares it."""
    groups: dict[str, LineageGroup] = {}
    for v in variants:
        groups.setdefault(_key(v), LineageGroup(steps=list(v.lineage))).variants.append(v)
    return list(groups.values())


def step_precision(step: LineageStep, produced: str | None = None) -> str:
    """What the step produced, as recorded: the step's own ``precision`` (metrics, then config), a quantization
    account's headline or requested type; else ``produced`` (the variant's precision, for its last step)."""
    for src in (step.metrics, step.config):
        p = src.get("precision")
        if isinstance(p, str) and p:
            return p
    q = step.metrics.get("quantization")
    if isinstance(q, dict):
        for k in ("headline", "requested"):
            if isinstance(q.get(k), str) and q[k]:
                return str(q[k])
    return produced or ""


def _float(x: object) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _cache_parity_cell(cp: dict[str, Any]) -> str:
    """A language-model export's proof (edgekit/llm/parity.py): the full forward against PyTorch, then decoding
    through the KV cache against the full forward, within its tolerance."""
    cosine, top1 = _float(cp.get("prefill_cosine")), _float(cp.get("top1_agreement"))
    figures = [f"max |err| {num(_float(cp.get('prefill_max_abs_err')), '{:.2e}')}"]
    if cosine is not None:
        figures.append(f"cosine {cosine:.6f}")
    if top1 is not None:
        figures.append(f"top-1 {top1:.1%}")
    cache = (
        f"through the KV cache: max |err| {num(_float(cp.get('cache_max_abs_err')), '{:.2e}')} "
        f"(tolerance {num(_float(cp.get('tolerance')), '{:.2e}')})"
    )
    return esc(" · ".join(figures)) + " <span class=muted>vs pytorch</span><br>" + esc(cache)


def _parity_cell(step: LineageStep) -> str:
    par = step.parity
    if par is None:
        cp = step.metrics.get("cache_parity")
        return _cache_parity_cell(cp) if isinstance(cp, dict) else ""
    figures = [f"max |err| {num(par.max_abs_err, '{:.2e}')}"]
    if par.cosine is not None:
        figures.append(f"cosine {par.cosine:.6f}")
    if par.top1_agreement is not None:
        figures.append(f"top-1 {par.top1_agreement:.1%}")
    if par.exact_agreement is not None:
        figures.append(f"exact {par.exact_agreement:.1%}")
    text = esc(" · ".join(figures)) + (f" <span class=muted>vs {esc(par.reference)}</span>" if par.reference else "")
    bad = step.parity_violations
    if bad:
        text += "<br><span class=bad>" + esc("; ".join(bad)) + "</span>"
    elif bad is not None:
        text += " <span class=good>within tolerance</span>"
    return text


def _time_cell(step: LineageStep) -> str:
    cache = step.metrics.get("cache")
    text = num(step.seconds, "{:.2f} s", "")
    if isinstance(cache, dict) and cache.get("hit"):
        built = cache.get("original_seconds")
        text += (
            " <span class=muted>(cache hit"
            + (f"; built in {built:.2f} s" if isinstance(built, (int, float)) else "")
            + ")</span>"
        )
    return text


def _record_cell(step: LineageStep) -> str:
    full: dict[str, Any] = {
        "config": step.config,
        "metrics": step.metrics,
        "input sha256": step.input_sha256,
        "output sha256": step.output_sha256,
        **(step.model_extra or {}),
    }
    if not any(v not in (None, {}, [], "") for v in full.values()):
        return ""
    return f"<details class=record><summary>config, metrics</summary>{record(full)}</details>"


def steps_table(g: LineageGroup) -> str:
    """The steps of one lineage: #, kind, hop, precision, parity, time, the full record collapsed."""
    rows: list[str] = []
    last = len(g.steps) - 1
    for i, s in enumerate(g.steps):
        rows.append(
            f"<tr><td class=n>{i}</td><td>{esc(s.kind)}</td><td>{esc(s.name)}</td>"
            f"<td>{esc(step_precision(s, g.first.precision if i == last else None))}</td>"
            f"<td>{_parity_cell(s)}</td><td class=n>{_time_cell(s)}</td><td>{_record_cell(s)}</td></tr>"
        )
    return (
        "<table class=lineage-steps><thead><tr><th>#</th><th>kind</th><th>hop</th><th>precision</th>"
        "<th>parity</th><th>time</th><th>record</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )


def _runtime_text(v: VariantResult) -> str:
    rt = v.runtime
    parts = [
        f"{rt.name} {rt.version or ''}".strip(),
        f"{rt.threads} thread{'s' if rt.threads != 1 else ''}" if rt.threads is not None else "",
        f"delegate {rt.delegate}" if rt.delegate else "",
    ]
    return esc(", ".join(p for p in parts if p)) + (f" · options {inline(rt.options)}" if rt.options else "")


def _settings(g: LineageGroup) -> str:
    """The runtime settings measured on this file, and the device state during each (once when all agree)."""
    out = ""
    if len(g.variants) > 1:
        rows = "".join(f"<tr><td>{esc(v.name)}</td><td>{_runtime_text(v)}</td></tr>" for v in g.variants)
        out += (
            "<table class=lineage-settings><thead><tr><th>setting</th><th>runtime</th></tr></thead><tbody>"
            + rows
            + "</tbody></table>"
        )
    else:
        out += f"<p class=muted>runtime: {_runtime_text(g.first)}</p>"
    states = [(v.name, v.device_state) for v in g.variants if v.device_state]
    if not states:
        return out
    distinct = {json.dumps(s, sort_keys=True, default=str) for _, s in states}
    if len(distinct) == 1:
        body = f"<p>{inline(states[0][1])}</p>"
    else:
        body = (
            "<table class=device-states><thead><tr><th>setting</th><th>device state</th></tr></thead><tbody>"
            + "".join(f"<tr><td>{esc(n)}</td><td>{inline(s)}</td></tr>" for n, s in states)
            + "</tbody></table>"
        )
    return out + f"<details class=record><summary>device state during the measurement</summary>{body}</details>"


def lineage_section(r: Report) -> str:
    """Every distinct lineage once: a summary naming the file and the settings that share it, the settings,
    then its steps."""
    out: list[str] = []
    for g in group_lineages(r.variants):
        v = g.first
        names = [x.name for x in g.variants]
        shared = f" · shared by {len(names)} settings: {esc(', '.join(names))}" if len(names) > 1 else ""
        out.append(
            f"<details class=lineage open><summary>{esc(v.name)}: {esc(v.format)} {esc(v.precision)}, "
            f"sha256 <code>{esc(v.sha256[:12])}</code>{shared}</summary>{_settings(g)}{steps_table(g)}"
            "</details>"
        )
    return "".join(out)
