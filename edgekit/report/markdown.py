"""Markdown summary of a report (a pull-request comment or a CI step summary)."""

from __future__ import annotations

from ..timeline import timeline_line
from .budget_view import budget_markdown
from .decode_predictions import HEAD, INTRO, how_close, prediction_rows
from .diff import render_diff_markdown
from .model import Report, SearchSection, VariantResult


def _f(x: object, fmt: str = "{:.3f}", none: str = "n/a") -> str:
    return none if x is None else fmt.format(x)


def _drop(v: VariantResult) -> str:
    if v.accuracy_drop is None:
        return "n/a"
    ci = (v.accuracy_stats or {}).get("ci95")
    return f"{v.accuracy_drop:+.3g}" + (f" [{ci[0]:+.3g}, {ci[1]:+.3g}]" if ci else "")


def _outputs_section(r: Report) -> list[str]:
    """Parity of every output, for multi-output models."""
    rows = [(v, name, p) for v in r.variants for name, p in (v.parity_outputs or {}).items()]
    if not rows:
        return []
    lines = [
        "",
        "## Parity per output",
        "",
        "| variant | output | max abs err | cosine | top-1 agree |",
        "|---|---|---:|---:|---:|",
    ]
    for v, name, p in rows:
        lines.append(f"| {v.name} | {name} | {p.max_abs_err:.2e} | {p.cosine:.6f} | {_f(p.top1_agreement, '{:.1%}')} |")
    return lines


def render_markdown(r: Report) -> str:
    verdict = "PASSED" if r.gate.passed else "FAILED"
    icon = "✅" if r.gate.passed else "❌"
    dev = r.device
    lines = [
        f"# edgekit report: {icon} gate {verdict}",
        "",
        f"- target: `{r.target}`; device: `{dev.name}` ({dev.arch}, {dev.cpu or 'cpu n/a'}, "
        f"{dev.cores} cores, transport {dev.transport})",
        f"- model: `{r.model.get('source')}` (sha256 `{str(r.model.get('sha256'))[:12]}`)",
        f"- baseline variant: `{r.baseline}`; created {r.created_at} by edgekit {r.edgekit_version}",
        f"- {r.metric_line()}",
        "",
    ]
    lines += (
        (_generation_table(r) + _decode_predictions(r) + _quantization_accounts(r))
        if r.model.get("task") == "text-generation"
        else _fixed_table(r)
    )
    if r.decision is not None:
        d = r.decision
        lines += ["", "## Decision", "", f"**Ship:** {d.reason if d.ship else 'nothing — ' + d.reason}", ""]
        lines += [f"- not `{n}`: {why}" for n, why in d.lost.items()]
    lines += ["", "## Gate", "", "| check | variant | value | limit | result |", "|---|---|---:|---:|---|"]
    for c in r.gate.checks:
        lines.append(
            f"| {c.name} | {c.variant or ''} | {_f(c.value)} | {_f(c.limit)} | "
            f"{'pass' if c.passed else '**FAIL**'}: {c.message} |"
        )
    if r.comparison is not None:
        cw = r.compared_with
        lines += ["", "## Compared with the baseline report", "", f"Baseline: `{cw.path if cw else None}`."]
        if cw is not None and cw.method is not None:
            lines.append(f"Release latency judged by: {cw.method_line()}.")
        lines.append(render_diff_markdown(r.comparison).rstrip("\n"))
    lines += _search_section(r) + budget_markdown(r)  # the budget as a goal: its plan, predictions, frontier
    lines += _fleet_section(r) + _profile_section(r) + _parity_section(r) + _outputs_section(r)
    energy_reasons = {v.energy_reason for v in r.variants if v.energy_mj_per_inference is None and v.energy_reason}
    if energy_reasons:
        lines += ["", f"Energy not measured: {'; '.join(sorted(energy_reasons))}."]
    if r.warnings:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in r.warnings]
    return "\n".join(lines) + "\n"


def _generation_table(r: Report) -> list[str]:
    """A language model's variants: time to first token, prefill and decode speed, memory, quality."""
    lines = [
        "| variant | format | precision | runtime | size KB | TTFT ms (cold) | prefill tok/s by prompt | "
        "decode tok/s (95% CI) | inter-token p50/p95 ms | decode tok/s at a full cache | peak MB | KV MB | "
        "perplexity | KLD (95% CI) | top-1 agree | greedy: first divergence |",
        "|---|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for v in r.variants:
        g, q = v.generation, v.quality
        if g is None or q is None:
            continue
        none2: list[float | None] = [None, None]
        ci, kci = g.decode_tokens_per_s_ci95 or none2, q.kld_ci95 or none2
        pre = ", ".join(f"{p['tokens']}: {p['tokens_per_s']:.0f}" for p in g.prefill)
        div = (q.greedy or {}).get("first_divergence")
        lines.append(
            f"| {v.name}{' (baseline)' if v.name == r.baseline else ''} | {v.format} | {v.precision} | "
            f"{v.runtime.label(version=True, threads=' ({} thr)')} | {v.size_bytes / 1024:.1f} | "
            f"{_f(g.ttft_ms)} ({_f(g.ttft_cold_ms)}) | {pre} | {_f(g.decode_tokens_per_s, '{:.1f}')} "
            f"({_f(ci[0], '{:.1f}')}-{_f(ci[1], '{:.1f}')}) | {_f(g.inter_token_ms.get('p50'))}/"
            f"{_f(g.inter_token_ms.get('p95'))} | {_f(g.decode_filled.get('tokens_per_s'), '{:.1f}')} | "
            f"{_f(g.peak_rss_mb, '{:.1f}')} | {_f(g.kv_cache_mb, '{:.2f}')} ({g.kv_cache_source}) | "
            f"{q.perplexity:.4g} (float {q.perplexity_float:.4g}) | {q.kld_mean:.3g} ({_f(kci[0], '{:.2g}')}-"
            f"{_f(kci[1], '{:.2g}')}) | {q.top1_agreement:.1%} | {div} |"
        )
    return lines


def _decode_predictions(r: Report) -> list[str]:
    """Each file's decode rate as predicted before it was built beside the measured one (decode_predictions.py)."""
    rows = prediction_rows(r)
    if not rows:
        return []
    return [
        "",
        "## Decode predicted before build",
        "",
        f"{INTRO}: {how_close(rows)}.",
        "",
        "| " + " | ".join(HEAD) + " |",
        "|---|---:|---:|---:|---:|---|",
        *(
            f"| {x.variant} | {_f(x.predicted, '{:.1f}')} ({_f(x.low, '{:.1f}')}-{_f(x.high, '{:.1f}')}) | "
            f"{x.measured:.1f} | {_f(x.ratio, '{:.2f}')} | {x.mb_per_token:.2f} | {x.basis} |"
            for x in rows
        ),
    ]


def _quantization_accounts(r: Report) -> list[str]:
    """Each low-bit language-model file's layer account (edgekit/llm/layer_plan.py): what its layers became,
    every layer not at the variant's own scheme named with why, padded groups, and the recovery ladder's rungs."""
    lines: list[str] = []
    for v in r.variants:
        gguf = next((s for s in reversed(v.lineage) if isinstance(s.metrics.get("tensors"), list)), None)
        if gguf is not None:  # llama-quantize's per-tensor account (edgekit/llm/export_gguf.py)
            summ = gguf.metrics.get("quantization") or {}
            types = ", ".join(f"{n} {t}" for t, n in (summ.get("types") or {}).items())
            lines += ["", f"**`{v.name}`** tensors (asked {summ.get('requested')}): {types}."]
            lines += [
                f"- `{t['name']}` at {t['actual']}: {t['reason']}"
                for t in gguf.metrics["tensors"]
                if t.get("kind") not in ("requested", "float_1d")
            ]
            n1d = sum(t.get("kind") == "float_1d" for t in gguf.metrics["tensors"])
            if n1d:
                lines.append(f"- {n1d} 1-D tensors (norms, biases) stay float: llama-quantize quantizes 2-D weights")
            continue
        acc = next(
            (
                s.metrics["quantization"]
                for s in reversed(v.lineage)
                if isinstance(s.metrics.get("quantization"), dict) and "layers" in s.metrics["quantization"]
            ),
            None,
        )
        if acc is None:
            continue
        counts = ", ".join(f"{n} {k}" for k, n in acc.get("counts", {}).items())
        lines += ["", f"**`{v.name}`** layers ({acc.get('headline')}): {counts}."]
        lines += [f"- `{n}`: {why}" for n, why in acc.get("not_headline", {}).items()]
        lines += [f"- `{n}`: {why}" for n, why in acc.get("padded", {}).items()]
        for rung in acc.get("ladder", []):
            kept = ", ".join(f"`{n}`" for n in rung["int8_layers"]) or "none"
            lines.append(
                f"- host check, layers kept at int8: {kept}: KLD {rung['host_kld']:.4g} "
                f"({'within' if rung['within'] else 'over'} the tolerance)"
            )
    return (["", "## Quantization accounts", ""] + lines[1:]) if lines else []


def _fixed_table(r: Report) -> list[str]:
    lines = [
        "| variant | format | precision | runtime | size KB | p50 ms | p90 ms | p99 ms | p50 95% CI | peak MB | "
        f"energy mJ | {r.metric_label()} | drop (95% CI) | parity max abs | top-1 agree |",
        "|---|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for v in r.variants:
        lat = v.latency_ms
        ci = f"{lat.ci95[0]:.3f}-{lat.ci95[1]:.3f}" if lat else "n/a"
        acc = v.accuracy.value if v.accuracy else None
        par = v.parity
        lines.append(
            f"| {v.name}{' (baseline)' if v.name == r.baseline else ''} | {v.format} | {v.precision} | "
            f"{v.runtime.label(version=True, threads=' ({} thr)')} | {v.size_bytes / 1024:.1f} | "
            f"{_f(lat and lat.p50)} | {_f(lat and lat.p90)} | {_f(lat and lat.p99)} | {ci} | "
            f"{_f(v.peak_memory_mb, '{:.1f}')} | {_f(v.energy_mj_per_inference, '{:.3f}', 'null')} | "
            f"{_f(acc, '{:.4g}')} | {_drop(v)} | "
            f"{_f(par and par.max_abs_err, '{:.2e}')} | {_f(par and par.top1_agreement, '{:.1%}')} |"
        )
    return lines


def _profile_section(r: Report, top: int = 10) -> list[str]:
    """Per-op profiles (the runtime's own profiler): the top ops of each profiled variant with their
    PyTorch module, then each diff against the baseline with its one-line reason."""
    profiled = [(v, v.op_profile) for v in r.variants if v.op_profile is not None]
    if not profiled:
        return []
    out = ["", "## Per-op profile on the device"]
    for v, p in profiled:
        if not p.available:
            out += ["", f"**{v.name}**: no per-op profile: {p.reason}"]
            continue
        traced = f"; {p.mapped_share:.0%} of op time traced to modules" if p.mapped_share is not None else ""
        out += [
            "",
            f"**{v.name}** ({p.source}, {p.runs} runs, median run {p.run_ms:.3g} ms{traced})",
            "",
            "| op | type | module | ms/inference | share |",
            "|---|---|---|---:|---:|",
        ]
        for o in p.top(top):
            module = "(model)" if o.module == "" else (o.module or "n/a")
            cls = f" ({o.module_class})" if o.module_class else ""
            out.append(f"| `{o.node}` | {o.op_type or ''} | {module}{cls} | {o.ms:.4f} | {_f(o.share, '{:.1%}')} |")
    for d in r.profile_diffs:
        out += ["", f"**{d.other} vs {d.base}**: {d.summary}"]
        if d.rows:
            out += [
                "",
                f"| op type | {d.base} nodes | {d.other} nodes | {d.base} ms | {d.other} ms | delta ms |",
                "|---|---:|---:|---:|---:|---:|",
            ]
            out += [
                f"| {x.op_type} | {x.base_nodes} | {x.other_nodes} | {x.base_ms:.4f} | {x.other_ms:.4f} | "
                f"{x.delta_ms:+.4f} |"
                for x in d.rows[:top]
            ]
    return out


def _search_section(r: Report) -> list[str]:
    """The variant search (deploy --search): what was chosen, and every candidate with why it was dropped."""
    srch = r.search
    if srch is None:
        return []
    shipped = srch.shipped.file if srch.shipped else None
    out = [
        "",
        "## Variant search",
        "",
        f"Selected **{srch.selected or 'nothing'}** by {srch.objective} in {srch.seconds} s"
        + (f"; shipping file `{shipped}`." if shipped else "."),
        "",
        *([_timeline_text(srch), ""] if srch.timeline is not None else []),
        "| candidate | status | dropped at | screening p50 ms | reason |",
        "|---|---|---|---:|---|",
    ]
    for c in srch.candidates:
        p50 = c.screening.p50 if c.screening else None
        out.append(
            f"| {c.name} | {c.status} | {c.dropped_at or ''} | {_f(p50, '{:.4f}')} | "
            f"{(c.reason or '').replace('|', '/')} |"
        )
    return out


def _timeline_text(srch: SearchSection) -> str:
    host = (srch.host or {}).get("summary")
    return timeline_line(srch.timeline) + (f" ({host})" if host else "")


def _fleet_section(r: Report) -> list[str]:
    """A fleet run: p50 per unit and variant, each unit's state and shard, then across the units."""
    fl = r.fleet
    if fl is None:
        return []
    names = [v.name for v in fl.variants]
    out = [
        "",
        "## Fleet",
        "",
        f"{fl.measured} of {fl.total} units measured; eval {fl.mode}"
        + (f" ({fl.eval_covered} of {fl.eval_samples} samples scored)" if fl.mode == "sharded" else "")
        + f"; the gate judged the {fl.gate} unit **{fl.judged_unit}**.",
        "",
        "| unit | state | shard | " + " | ".join(f"{n} p50 ms" for n in names) + " | unit gate | error |",
        "|---|---|---|" + "---:|" * len(names) + "---|---|",
    ]
    for u in fl.units:
        p50s = " | ".join(_f((u.latency_ms.get(n) or {}).get("p50")) for n in names)
        gate = "n/a" if u.gate_passed is None else "pass" if u.gate_passed else "**FAIL** " + ", ".join(u.failed_checks)
        shard = f"{u.shard[0]}-{u.shard[1]}" if u.shard else "all"
        out.append(
            f"| {u.name}{' (judged)' if u.name == fl.judged_unit else ''} | {u.state} | {shard} | {p50s} | "
            f"{gate} | {(u.error or '').replace('|', '/')[:200]} |"
        )
    out += [
        "",
        "| variant | units | median of p50s ms | spread ms | worst unit | best unit |",
        "|---|---:|---:|---:|---|---|",
    ]
    for v in fl.variants:
        out.append(
            f"| {v.name} | {v.units} | {v.median_of_medians_ms:.3f} | {v.spread_ms:.3f}"
            f"{f' ({v.spread_rel:.0%})' if v.spread_rel is not None else ''} | {v.worst_unit} "
            f"({v.worst_p50:.3f}) | {v.best_unit} ({v.best_p50:.3f}) |"
        )
    return out


def _parity_section(r: Report) -> list[str]:
    """Whole-chain parity: every conversion hop of every variant, from the lineage, then on the device."""
    rows = []
    for v in r.variants:
        for step in v.lineage:
            par = step.parity
            if step.kind == "convert" and par is not None:
                bad = step.parity_violations or []
                rows.append(
                    f"| {v.name} | {step.name} (host) | {_f(par.max_abs_err, '{:.2e}')} | "
                    f"{_f(par.cosine, '{:.6f}')} | {_f(par.top1_agreement, '{:.1%}')} | "
                    f"{'; '.join(bad) or 'ok'} |"
                )
        if v.parity:
            rows.append(
                f"| {v.name} | on the device vs {v.parity.reference} | {v.parity.max_abs_err:.2e} | "
                f"{v.parity.cosine:.6f} | {_f(v.parity.top1_agreement, '{:.1%}')} | |"
            )
    if not rows:
        return []
    return [
        "",
        "## Parity per hop",
        "",
        "| variant | hop | max abs err | cosine | top-1 agree | tolerance |",
        "|---|---|---:|---:|---:|---|",
        *rows,
    ]
