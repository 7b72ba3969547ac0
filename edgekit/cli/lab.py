"""`edgekit lab export|places`: inventory devices as places on a labgrid coordinator."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer

from .common import out_console

app = typer.Typer(help="A device lab shared by many CI runners, through labgrid's coordinator (the `lab` extra: "
                  "pip install 'edgekit\\[lab]').\n\nSetup: `labgrid-coordinator --listen 0.0.0.0:20408` on the lab "
                  "server; `edgekit lab export --coordinator lab:20408 --run-exporter` where the inventory lives; "
                  "`export EDGEKIT_COORDINATOR=lab:20408` on every runner: each deploy then reserves its devices' "
                  "places there.", no_args_is_help=True)

_COORD_HELP = "The labgrid coordinator HOST:PORT (default: $EDGEKIT_COORDINATOR)."


@app.callback()
def _lab():
    pass


def _address(coordinator: Optional[str]):
    from ..devices.coordinator import ENV, address_from_env, parse_address
    from ..errors import BadInputError

    if coordinator:
        return parse_address(coordinator, "--coordinator")
    addr = address_from_env()
    if addr is None:
        raise BadInputError(f"no labgrid coordinator: pass --coordinator HOST:PORT or set {ENV}",
                            hint="start one with `labgrid-coordinator --listen 0.0.0.0:20408` (pip install "
                                 "'edgekit[lab]')")
    return addr


@app.command("export", help="Create or update one labgrid place per inventory device (all, or the named ones) "
             "and write labgrid-exporter's config.\n\nEach place is named after the device, tagged with its "
             "target (target=...), transport and pool labels (label_NAME=1), matching its resource. The "
             "exporter's config lists its resources (SSH devices as "
             "NetworkService address/port/username, adb devices as EdgekitADBDevice serial); --run-exporter then "
             "runs the exporter in the foreground so the places hold those resources. Without an exporter the "
             "places still reserve devices, with no resources listed.\n\n"
             "Example: edgekit lab export --coordinator lab-server:20408 pi-1 pi-2 --run-exporter")
def export_cmd(
    devices: Optional[list[str]] = typer.Argument(None, help="Inventory devices (default: all)."),
    coordinator: Optional[str] = typer.Option(None, "--coordinator", "-x", help=_COORD_HELP),
    exporter_config: Optional[Path] = typer.Option(None, "--exporter-config", help="Where to write "
                                                   "labgrid-exporter's config (default: $EDGEKIT_HOME/lab/"
                                                   "exporter.yaml)."),
    run_exporter: bool = typer.Option(False, "--run-exporter", help="Then become labgrid-exporter with that "
                                      "config (foreground; stop it with Ctrl-C or SIGTERM)."),
    exporter_name: Optional[str] = typer.Option(None, "--exporter-name", help="The exporter's name on the "
                                                "coordinator (default: edgekit-HOSTNAME)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
):
    from ..devices.coordinator import Coordinator
    from ..devices.inventory import get_device, load_inventory
    from ..errors import BadInputError
    from ..lab.export import default_exporter_name, export_places, exporter_argv, write_exporter_config
    from ..paths import edgekit_home

    addr = _address(coordinator)
    entries = [get_device(n) for n in dict.fromkeys(devices)] if devices else load_inventory().devices
    if not entries:
        raise BadInputError("the inventory has no devices to export",
                            hint="add some with `edgekit devices add` or `edgekit sim up`")
    with Coordinator(addr) as c:
        rows = export_places(c, entries)
    cfg = write_exporter_config(entries, exporter_config or edgekit_home() / "lab" / "exporter.yaml")
    name = exporter_name or default_exporter_name()
    argv = exporter_argv(addr, cfg, name)
    if as_json:
        print(json.dumps({"coordinator": str(addr), "places": rows, "exporter_config": str(cfg),
                          "exporter_argv": argv}), flush=True)
    else:
        for r in rows:
            tags = " ".join(f"{k}={v}" for k, v in r["tags"].items())
            res = r["resource"]
            what = (f"{res['cls']} " + ", ".join(f"{k}={v}" for k, v in res.items() if k != "cls")) if res else \
                "no resource (a local-kind device)"
            out_console.print(f"{'created' if r['created'] else 'updated'} place {r['place']} on {addr}: {tags}; "
                              f"{what}", highlight=False)
        out_console.print(f"exporter config: {cfg}" + ("" if run_exporter else
                          f"; the places hold their resources while labgrid's exporter runs: {' '.join(argv)}"),
                          highlight=False, soft_wrap=True)
    if run_exporter:
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(argv[0], argv)  # this process becomes the exporter: its PID is the one to stop


@app.command("places", help="The coordinator's places: who holds each (edgekit runs are named with host, PID and "
             "run id), their tags and the resources their exporters publish.\n\n"
             "Example: edgekit lab places --coordinator lab-server:20408 --json")
def places_cmd(coordinator: Optional[str] = typer.Option(None, "--coordinator", "-x", help=_COORD_HELP),
               as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    from rich.table import Table

    from ..devices.coordinator import Coordinator, describe_holder

    addr = _address(coordinator)
    with Coordinator(addr) as c:
        places, resources = c.places(), c.resources()
    def res_of(name: str, matches) -> list:
        from fnmatch import fnmatchcase

        out = []
        for r in resources:
            e, g, cls, _ = r.path.split("/")
            if any(fnmatchcase(e, m.split("/")[0]) and fnmatchcase(g, m.split("/")[1])
                   and fnmatchcase(cls, m.split("/")[2]) for m in matches if m.count("/") >= 2):
                out.append(r)
        return out

    if as_json:
        print(json.dumps([{"place": p.name, "acquired": p.acquired, "holder": describe_holder(p.acquired),
                           "changed": p.changed, "tags": p.tags, "comment": p.comment, "matches": list(p.matches),
                           "reservation": p.reservation,
                           "resources": [{"path": r.path, "cls": r.cls, "params": r.params, "acquired": r.acquired,
                                          "avail": r.avail} for r in res_of(p.name, p.matches)]}
                          for p in sorted(places.values(), key=lambda p: p.name)]))
        return
    if not places:
        out_console.print(f"no places on {addr}; create them with `edgekit lab export --coordinator {addr}`",
                          highlight=False)
        return
    t = Table("place", "held by", "tags", "resources")
    for p in sorted(places.values(), key=lambda p: p.name):
        rs = ", ".join(f"{r.cls} {r.params.get('address', r.params.get('serial', ''))}"
                       f"{':' + str(r.params['port']) if 'port' in r.params else ''}"
                       for r in res_of(p.name, p.matches))
        t.add_row(p.name, describe_holder(p.acquired) if p.acquired else "free",
                  " ".join(f"{k}={v}" for k, v in sorted(p.tags.items())), rs or "-")
    out_console.print(t)
