"""A language model's report (task text-generation): the race of its files on the device (time to first token,
prefill and decode speed with the decode CI, memory, perplexity, KL divergence from the float model, top-1 and
greedy agreement) and each low-bit file's quantization account: what its layers or tensors became, every one
not at the variant's own scheme named with why, padded groups and the recovery ladder's rungs. The same
figures report.md shows, as tables."""

from __future__ import annotations

from typing import Any

from .decode_predictions import HEAD, INTRO, how_close, prediction_rows
from .html_lineage import group_lineages
from .html_markup import esc, num
from .model import Report, VariantResult


def is_language_model(r: Report) -> bool:
    return (r.model or {}).get("task") == "text-generation"


_RACE_HEAD = [
    "variant",
    "format",
    "precision",
    "runtime",
    "size KB",
    "TTFT ms (cold)",
    "prefill tok/s by prompt",
    "decode tok/s (95% CI)",
    "inter-token p50/p95 ms",
    "decode tok/s at a full cache",
    "peak MB",
    "KV MB",
    "perplexity (float)",
    "KLD (95% CI)",
    "top-1 agree",
    "greedy: first divergence",
]


def _race_row(r: Report, v: VariantResult) -> str | None:
    g, q = v.generation, v.quality
    if g is None or q is None:
        return None
    none: list[float | None] = [None, None]
    ci: list[float | None] = list(g.decode_tokens_per_s_ci95 or none)
    kci: list[float | None] = list(q.kld_ci95 or none)
    pre = ", ".join(f"{p.get('tokens')}: {num(p.get('tokens_per_s'), '{:.0f}')}" for p in g.prefill)
    name = (
        esc(v.name)
        + (" <span class=muted>(baseline)</span>" if v.name == r.baseline else "")
        + (" <b>★ selected</b>" if v.selected else "")
    )
    cells = [
        name,
        esc(v.format),
        esc(v.precision),
        esc(v.runtime.label(version=True)),
        num(v.size_bytes / 1024, "{:.1f}"),
        f"{num(g.ttft_ms)} ({num(g.ttft_cold_ms)})",
        esc(pre),
        f"{num(g.decode_tokens_per_s, '{:.1f}')} ({num(ci[0], '{:.1f}')}–{num(ci[1], '{:.1f}')})",
        f"{num(g.inter_token_ms.get('p50'))} / {num(g.inter_token_ms.get('p95'))}",
        num(g.decode_filled.get("tokens_per_s"), "{:.1f}"),
        num(g.peak_rss_mb, "{:.1f}"),
        num(g.kv_cache_mb, "{:.2f}")
        + (f" <span class=muted>({esc(g.kv_cache_source)})</span>" if g.kv_cache_source else ""),
        f"{q.perplexity:.4g} ({q.perplexity_float:.4g})",
        f"{q.kld_mean:.3g} ({num(kci[0], '{:.2g}')}–{num(kci[1], '{:.2g}')})",
        num(q.top1_agreement, "{:.1%}"),
        esc(_greedy_text(q.greedy)),
    ]
    numeric = {4, 5, 7, 8, 9, 10, 11, 12, 13, 14}
    return "<tr>" + "".join(f"<td{' class=n' if i in numeric else ''}>{c}</td>" for i, c in enumerate(cells)) + "</tr>"


def _greedy_text(greedy: dict[str, Any] | None) -> str:
    """Where each prompt's greedy continuation first left the float model's ("same": never, within its tokens)."""
    if not greedy:
        return ""
    div = greedy.get("first_divergence")
    if not isinstance(div, list):
        return ""
    text = ", ".join("same" if d is None else f"token {d}" for d in div)
    n = greedy.get("new_tokens")
    return text + (f" (of {n})" if n else "")


def race_table(r: Report) -> str:
    """One row per language-model variant that was measured and scored on the device."""
    rows = [row for row in (_race_row(r, v) for v in r.variants) if row is not None]
    if not rows:
        return "<p class=muted>No variant was measured on the device.</p>"
    return (
        "<div class=scroll><table id=lm-race><thead><tr>"
        + "".join(f"<th>{esc(h)}</th>" for h in _RACE_HEAD)
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></div>"
    )


def decode_predictions(r: Report) -> str:
    """Each file's decode rate predicted before its build beside the measured one (decode_predictions.py)."""
    rows = prediction_rows(r)
    if not rows:
        return ""
    cells = [
        [
            esc(x.variant),
            f"{num(x.predicted, '{:.1f}')} ({num(x.low, '{:.1f}')}-{num(x.high, '{:.1f}')})",
            num(x.measured, "{:.1f}"),
            num(x.ratio, "{:.2f}"),
            num(x.mb_per_token, "{:.2f}"),
            esc(x.basis),
        ]
        for x in rows
    ]
    return (
        "<h2 id=decode-predictions>Decode predicted before build</h2>"
        + f"<p>{esc(INTRO)}: {esc(how_close(rows))}.</p>"
        + _rows_table("predictions", HEAD, cells)
    )


def _gguf_account(v: VariantResult) -> dict[str, Any] | None:
    """llama-quantize's per-tensor account (edgekit/llm/export_gguf.py): the last step with a tensor list."""
    step = next((s for s in reversed(v.lineage) if isinstance(s.metrics.get("tensors"), list)), None)
    return None if step is None else step.metrics


def _layer_account(v: VariantResult) -> dict[str, Any] | None:
    """The layer plan's account (edgekit/llm/layer_plan.py: ``account``) of the last step that has one."""
    for s in reversed(v.lineage):
        q = s.metrics.get("quantization")
        if isinstance(q, dict) and "layers" in q:
            return q
    return None


def _rows_table(css: str, head: list[str], rows: list[list[str]]) -> str:
    return (
        f"<table class={css}><thead><tr>"
        + "".join(f"<th>{esc(h)}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
        + "</tbody></table>"
    )


def _gguf_html(title: str, metrics: dict[str, Any]) -> str:
    summ = metrics.get("quantization") or {}
    tensors = [t for t in metrics["tensors"] if isinstance(t, dict)]
    types = ", ".join(f"{n} {t}" for t, n in (summ.get("types") or {}).items())
    other = [
        [f"<code>{esc(t.get('name'))}</code>", esc(t.get("actual")), esc(t.get("reason"))]
        for t in tensors
        if t.get("kind") not in ("requested", "float_1d")
    ]
    n1d = sum(t.get("kind") == "float_1d" for t in tensors)
    out = f"<p><b>{title}</b> tensors (asked {esc(summ.get('requested'))}): {esc(types)}.</p>"
    if other:
        out += _rows_table("quant-account", ["tensor", "stored as", "why"], other)
    if n1d:
        out += f"<p class=muted>{n1d} 1-D tensors (norms, biases) stay float: llama-quantize quantizes 2-D weights.</p>"
    return out


def _layer_html(title: str, acc: dict[str, Any]) -> str:
    counts = ", ".join(f"{n} {k}" for k, n in (acc.get("counts") or {}).items())
    out = f"<p><b>{title}</b> layers (headline {esc(acc.get('headline'))}): {esc(counts)}.</p>"
    rows: list[list[str]] = []
    for name, why in (acc.get("not_headline") or {}).items():
        became, _, reason = str(why).partition(": ")
        rows.append([f"<code>{esc(name)}</code>", esc(became), "not at the headline scheme", esc(reason)])
    for name, why in (acc.get("padded") or {}).items():
        rows.append([f"<code>{esc(name)}</code>", esc(acc.get("headline")), "last group padded", esc(why)])
    if rows:
        out += _rows_table("quant-account", ["layer", "stored as", "account", "why"], rows)
    ladder = [
        [
            ", ".join(f"<code>{esc(n)}</code>" for n in rung.get("int8_layers", [])) or "none",
            num(rung.get("host_kld"), "{:.4g}"),
            "within" if rung.get("within") else "<span class=bad>over</span>",
        ]
        for rung in acc.get("ladder", [])
        if isinstance(rung, dict)
    ]
    if ladder:
        out += "<p>The recovery ladder's host checks:</p>" + _rows_table(
            "quant-ladder", ["layers kept at int8", "host KLD", "tolerance"], ladder
        )
    return out


def quantization_accounts(r: Report) -> str:
    """Each low-bit file's account, once a file (the variants measured on it named together); empty when no
    variant carries one."""
    parts: list[str] = []
    for g in group_lineages(r.variants):
        v = g.first
        title = esc(", ".join(x.name for x in g.variants))
        gguf = _gguf_account(v)
        if gguf is not None:
            parts.append(_gguf_html(title, gguf))
            continue
        acc = _layer_account(v)
        if acc is not None:
            parts.append(_layer_html(title, acc))
    return ("<h2 id=quantization-accounts>Quantization accounts</h2>" + "".join(parts)) if parts else ""
