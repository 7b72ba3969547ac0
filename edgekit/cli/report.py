"""`edgekit report show`: the summary of a report in the terminal."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from .common import EXIT_GATE_FAILED, out_console

app = typer.Typer(help="Read edgekit reports.\n\nExample: edgekit report show edgekit-out/report.json",
                  no_args_is_help=True)


def _f(x, fmt="{:.3f}"):
    return "n/a" if x is None else fmt.format(x)


def print_summary(report) -> None:
    from rich.markup import escape

    verdict = "[bold green]PASSED[/]" if report.gate.passed else "[bold red]FAILED[/]"
    dev = report.device
    out_console.print(f"gate {verdict} - target {report.target}, device {dev.name} "
                      f"({dev.arch}" + (f", {dev.cores} cores)" if dev.cores is not None else ")"))
    if report.model.get("task") == "text-generation":
        out_console.print(_lm_table(report))
    else:
        out_console.print(_fixed_table(report))
    out_console.print(f"  {escape(report.metric_line())}", highlight=False)
    _print_decision_and_checks(report)


def _lm_table(report):
    """A language model's variants: what its users wait for (time to first token, decode tokens/s) and its
    quality from the device's own log-probabilities."""
    from rich.table import Table

    t = Table("variant", "format", "prec", "runtime", "size KB", "TTFT ms", "prefill tok/s", "decode tok/s",
              "decode 95% CI", "itl p95 ms", "peak MB", "KV MB", "ppl", "KLD", "top-1 agree", box=None)
    for v in report.variants:
        g, q = v.generation, v.quality
        ci = g.decode_tokens_per_s_ci95 if g else None
        t.add_row(v.name + (" *" if v.name == report.baseline else "") + (" [bold](selected)[/]" if v.selected else ""),
                  v.format, v.precision, v.runtime.label(), f"{v.size_bytes / 1024:.1f}",
                  _f(g and g.ttft_ms, "{:.2f}"), _f(g and g.prefill and g.prefill[-1]["tokens_per_s"], "{:.0f}"),
                  _f(g and g.decode_tokens_per_s, "{:.1f}"), f"{ci[0]:.1f}-{ci[1]:.1f}" if ci else "n/a",
                  _f(g and g.inter_token_ms.get("p95"), "{:.3f}"), _f(v.peak_memory_mb, "{:.1f}"),
                  _f(g and g.kv_cache_mb, "{:.2f}"), _f(q and q.perplexity, "{:.4g}"), _f(q and q.kld_mean, "{:.2e}"),
                  _f(q and q.top1_agreement, "{:.1%}"))
    return t


def _fixed_table(report):
    from rich.table import Table

    t = Table("variant", "format", "prec", "runtime", "size KB", "p50 ms", "p50 95% CI", "p90 ms", "p99 ms",
              "peak MB", "mJ/inf", report.metric_label(), "drop", "max|err|", "top-1 agree", box=None)
    for v in report.variants:
        lat = v.latency_ms
        t.add_row(v.name + (" *" if v.name == report.baseline else "") + (" [bold](selected)[/]" if v.selected else ""),
                  v.format, v.precision,
                  v.runtime.label(), f"{v.size_bytes / 1024:.1f}",
                  _f(lat and lat.p50), f"{lat.ci95[0]:.3f}-{lat.ci95[1]:.3f}" if lat else "n/a",
                  _f(lat and lat.p90), _f(lat and lat.p99), _f(v.peak_memory_mb, "{:.1f}"),
                  _f(v.energy_mj_per_inference),
                  _f(v.accuracy and v.accuracy.value, "{:.4g}"), _f(v.accuracy_drop, "{:+.3g}"),
                  _f(v.parity and v.parity.max_abs_err, "{:.2e}"),
                  _f(v.parity and v.parity.top1_agreement, "{:.1%}"))
    return t


def _print_decision_and_checks(report) -> None:
    from rich.markup import escape

    if report.decision is not None:
        d = report.decision
        out_console.print(f"[bold]ship:[/] {escape(d.reason if d.ship else 'nothing: ' + d.reason)}", highlight=False)
        for name, why in d.lost.items():
            out_console.print(f"  not {escape(name)}: {escape(why)}", highlight=False)
    if report.comparison is not None:
        cw = report.compared_with
        out_console.print(f"compared with {escape(str(cw.path if cw else None))}:", highlight=False)
        if cw is not None and cw.method is not None:
            out_console.print(f"  release latency judged by: {escape(cw.method_line())}", highlight=False)
        print_diff(report.comparison)
    for c in report.gate.checks:
        mark = "[green]pass[/]" if c.passed else "[red]FAIL[/]"
        out_console.print(f"  {mark} {escape(c.name)}{escape(f' [{c.variant}]') if c.variant else ''}: "
                          f"{escape(c.message)}", highlight=False)
    for w in report.warnings:
        out_console.print(f"  [yellow]warning:[/] {escape(w)}", highlight=False)


@app.command("show", help="Render a report's summary.\n\nExample: edgekit report show edgekit-out/report.json\n\n"
             "Exits 1 when the report's gate failed.")
def show_cmd(path: Path = typer.Argument(..., help="report.json"),
             as_json: bool = typer.Option(False, "--json", help="Print the gate as JSON.")):
    from ..report.model import Report

    report = Report.load(path)
    if as_json:
        print(json.dumps(report.gate.model_dump(mode="json")))
    else:
        print_summary(report)
    if not report.gate.passed:
        raise typer.Exit(EXIT_GATE_FAILED)


def print_diff(d) -> None:
    """A ReportDiff as a table: per variant and metric, before, after, change, p-value, verdict."""
    from rich.markup import escape
    from rich.table import Table

    from ..measure.compare import format_p

    t = Table("variant", "metric", "before", "after", "change", "p-value", "verdict", box=None)
    for v in d.variants:
        for c in v.changes:
            style = "red" if c.is_regression else ("green" if c.verdict in ("faster", "better", "smaller") else "")
            verdict = f"[{style}]{escape(c.verdict)}[/]" if style else escape(c.verdict)
            t.add_row(escape(v.variant), c.metric, _f(c.before, "{:.4g}"), _f(c.after, "{:.4g}"),
                      _f(c.change_rel, "{:+.1%}"), format_p(c.p_value), verdict)
    out_console.print(t)
    for name in d.added:
        out_console.print(f"  new variant {escape(name)}: nothing to compare", highlight=False)
    for name in d.removed:
        out_console.print(f"  variant {escape(name)} is no longer built", highlight=False)
    for w in d.warnings:
        out_console.print(f"  [yellow]warning:[/] {escape(w)}", highlight=False)


@app.command("diff", help="Compare two reports: per variant and metric, the change of NEW relative to OLD with its "
             "significance.\n\nExample: edgekit report diff release-1.2/report.json edgekit-out/report.json\n\n"
             "Exits 1 when NEW fails a release check against OLD (significant p50 regression above the threshold, "
             "accuracy drop, memory or size increase), else 0.")
def diff_cmd(old: Path = typer.Argument(..., help="The baseline report.json (e.g. the last release)."),
             new: Path = typer.Argument(..., help="The report.json to judge."),
             max_latency_regression: float = typer.Option(0.10, "--max-latency-regression", min=0,
                                                          help="Allowed p50 slowdown (fraction) when significant."),
             max_accuracy_drop: float = typer.Option(1.0, "--max-accuracy-drop", min=0, max=100,
                                                     help="Allowed accuracy drop in points."),
             max_memory_increase: float = typer.Option(0.10, "--max-memory-increase", min=0,
                                                       help="Allowed peak memory increase (fraction)."),
             max_size_increase: float = typer.Option(0.10, "--max-size-increase", min=0,
                                                     help="Allowed model size increase (fraction)."),
             alpha: float = typer.Option(0.05, "--alpha", min=0.0001, max=0.5, help="Significance level."),
             as_json: bool = typer.Option(False, "--json", help="Print the comparison and the checks as JSON.")):
    from ..inputs.recipe import GateConfig
    from ..report.gate import release_checks
    from ..report.model import Report

    a, b = Report.load(old), Report.load(new)
    cfg = GateConfig(max_latency_regression=max_latency_regression, max_release_accuracy_drop=max_accuracy_drop,
                     max_memory_increase=max_memory_increase, max_size_increase=max_size_increase,
                     significance_alpha=alpha)
    d = b.diff(a, alpha=alpha, min_effect=max_latency_regression)
    checks = [c for v in b.variants for c in release_checks(v.name, d, cfg)]
    failed = [c for c in checks if not c.passed]
    if as_json:
        print(json.dumps({"diff": d.model_dump(mode="json"), "checks": [c.model_dump(mode="json") for c in checks],
                          "passed": not failed}))
    else:
        from rich.markup import escape

        print_diff(d)
        for c in checks:
            mark = "[green]pass[/]" if c.passed else "[red]FAIL[/]"
            out_console.print(f"  {mark} {escape(c.name)} {escape(f'[{c.variant}]')}: {escape(c.message)}",
                              highlight=False)
        out_console.print("[bold green]no regression[/]" if not failed else
                          f"[bold red]{len(failed)} release check(s) failed[/]")
    if failed:
        raise typer.Exit(EXIT_GATE_FAILED)


@app.command("render", help="Rewrite report.md, report.html and junit.xml from a report.json (e.g. after an "
             "edgekit upgrade).\n\nExample: edgekit report render edgekit-out/report.json")
def render_cmd(path: Path = typer.Argument(..., help="report.json"),
               out: Path = typer.Option(None, "--out", "-o", help="Folder to write into (default: beside the report).")):
    from ..fsutil import ensure_writable_dir
    from ..report.model import Report

    report = Report.load(path)
    paths = report.write(ensure_writable_dir(out or path.parent))
    out_console.print("wrote " + ", ".join(str(p) for p in paths.values()), highlight=False)
