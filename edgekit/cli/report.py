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
    from rich.table import Table

    verdict = "[bold green]PASSED[/]" if report.gate.passed else "[bold red]FAILED[/]"
    dev = report.device
    out_console.print(f"gate {verdict} - target {report.target}, device {dev.get('name')} "
                      f"({dev.get('arch')}, {dev.get('cores')} cores)")
    t = Table("variant", "format", "prec", "runtime", "size KB", "p50 ms", "p90 ms", "p99 ms", "peak MB",
              "acc %", "drop", "max|err|", "top-1 agree", box=None)
    for v in report.variants:
        lat = v.latency_ms
        t.add_row(v.name + (" *" if v.name == report.baseline else ""), v.format, v.precision,
                  f"{v.runtime.name} x{v.runtime.threads}", f"{v.size_bytes / 1024:.1f}",
                  _f(lat and lat.p50), _f(lat and lat.p90), _f(lat and lat.p99), _f(v.peak_memory_mb, "{:.1f}"),
                  _f(v.accuracy and v.accuracy.value, "{:.2f}"), _f(v.accuracy_drop, "{:+.2f}"),
                  _f(v.parity and v.parity.max_abs_err, "{:.2e}"),
                  _f(v.parity and v.parity.top1_agreement, "{:.1%}"))
    out_console.print(t)
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
