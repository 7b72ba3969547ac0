"""`edgekit targets list|show`."""

from __future__ import annotations

import json

import typer

from .common import out_console

app = typer.Typer(help="Hardware classes edgekit knows (targets/*.yaml).\n\nExample: edgekit targets show rpi4",
                  no_args_is_help=True)


@app.command("list", help="List the known targets.\n\nExample: edgekit targets list --json")
def list_cmd(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    from rich.table import Table

    from ..inputs.targets import list_targets, load_target

    specs = [load_target(n) for n in list_targets()]
    if as_json:
        print(json.dumps([s.model_dump(mode="json") for s in specs]))
        return
    table = Table("target", "arch", "os", "cores", "memory (MB)", "runtimes", "transport", "description")
    for s in specs:
        mcu = s.microcontroller  # a microcontroller: its SRAM and flash, KiB
        memory = f"{mcu.sram_kb:g} KB SRAM, {mcu.flash_kb:g} KB flash" if mcu else f"{s.memory_mb:g}"
        table.add_row(s.name, s.arch, s.os, str(s.cores), memory, ", ".join(s.runtimes), s.transport, s.description)
    out_console.print(table)


@app.command("show", help="Show one target's full spec.\n\nExample: edgekit targets show rpi4")
def show_cmd(name: str = typer.Argument(..., help="Target name or path to a target .yaml."),
             as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    import yaml

    from ..inputs.targets import load_target

    spec = load_target(name)
    if as_json:
        print(json.dumps(spec.model_dump(mode="json")))
    else:
        out_console.print(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False), highlight=False)
