"""`edgekit sim up|down|list`: a simulated device to try `--device` on without a board."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

import typer

from .common import PANEL_ARM64, PANEL_OUTPUT, PANEL_TARGET, err_console, out_console

app = typer.Typer(help="Simulated devices: a real sshd in its own network namespace, CPU-throttled with cgroups "
                  "(root), registered in the inventory.\n\nExample: edgekit sim up pi --cpu-quota 0.25 && "
                  "edgekit deploy model.pt2 --target rpi4 --device pi --eval-data eval.npz",
                  no_args_is_help=True)


@app.command("up", help="Start a simulated device and register it. Needs root for its own address and CPU/memory "
             "limits; without root it falls back to an sshd on a loopback port and says so.\n\n"
             "Example: edgekit sim up pi --cpu-quota 0.25 --memory 1G\n\n"
             "Example (a Debian arm64 twin under qemu): edgekit sim up pi-arm --arch arm64")
def up_cmd(
    name: str = typer.Argument(..., help="Device name."),
    target: str = typer.Option("rpi4", "--target", "-t", rich_help_panel=PANEL_TARGET, help="Target class it registers as."),
    cpu_quota: Optional[float] = typer.Option(None, "--cpu-quota", rich_help_panel=PANEL_TARGET, help="CPU limit in cores (0.25 = a quarter core)."),
    memory: Optional[str] = typer.Option(None, "--memory", rich_help_panel=PANEL_TARGET, help="Memory limit, e.g. 512M or 1G."),
    arch: str = typer.Option("native", "--arch", rich_help_panel=PANEL_TARGET, help="native: an sshd running this host's Python. arm64: a Debian "
                             "bookworm arm64 twin (Raspberry Pi OS's base, Python 3.11) under qemu user emulation, "
                             "rootfs built once and cached (root; apt-get install qemu-user-static binfmt-support "
                             "debootstrap)."),
    provision: bool = typer.Option(True, "--provision/--no-provision", rich_help_panel=PANEL_ARM64, help="arm64: install the target's aarch64 "
                                   "runtime wheels on the twin (downloaded on this host; the twin has no network)."),
    wheelhouse: Optional[Path] = typer.Option(None, "--wheelhouse", rich_help_panel=PANEL_ARM64, help="arm64: folder of aarch64 .whl files to "
                                              "install from (default: download them into the edgekit cache)."),
    runtime: Optional[list[str]] = typer.Option(None, "--runtime", rich_help_panel=PANEL_ARM64, help="arm64: also install this runtime's own "
                                                "wheels (the target's wheels.runtime_packages, e.g. executorch: a CPU "
                                                "torch + executorch, ~167 MB); repeatable."),
    as_json: bool = typer.Option(False, "--json", rich_help_panel=PANEL_OUTPUT, help="Print the simulator's state as JSON."),
):
    from ..devices.sim_device import status, up

    def say(msg: str) -> None:
        err_console.print(f"sim: {msg}", highlight=False)

    if arch not in ("native", "arm64"):
        from ..errors import BadInputError

        raise BadInputError(f"--arch {arch!r} is not one of: native, arm64")
    timings = None
    if arch == "arm64":
        from ..devices import sim_arm64 as _arm64

        state, entry, timings = _arm64.up(name, target=target, cpu_quota=cpu_quota, memory=memory,
                                          provision=provision, wheelhouse=wheelhouse, say=say,
                                          runtimes=tuple(runtime or ()))
    else:
        state, entry = up(name, target=target, cpu_quota=cpu_quota, memory=memory, say=say)
    if as_json:
        doc = status(state)
        if timings is not None:
            doc["timings"] = dataclasses.asdict(timings)
        print(json.dumps(doc))
    elif timings is not None:
        out_console.print(f"arm64 twin {name} is up (emulated aarch64, {entry.user}@{state.host}:{state.port}, target "
                          f"{state.target}; rootfs {'built' if timings.rootfs_built else 'cached'} "
                          f"{timings.rootfs_seconds:g} s, start {timings.start_seconds:g} s"
                          + (f", runtimes {timings.provision_seconds:g} s" if timings.provision_seconds is not None
                             else "") + f"). Try: edgekit devices check {name}", highlight=False)
    else:
        out_console.print(f"simulated device {name} is up ({state.mode}, {entry.user}@{state.host}:{state.port}, "
                          f"target {state.target}). Try: edgekit devices check {name}", highlight=False)


@app.command("down", help="Stop a simulated device and remove everything it made (processes, namespace, cgroups, "
             "inventory entry, files).\n\nExample: edgekit sim down pi")
def down_cmd(name: Optional[str] = typer.Argument(None, help="Device name."),
             purge: bool = typer.Option(False, "--purge", help="Also delete the cached arm64 rootfs (the next "
                                        "`sim up --arch arm64` builds it again).")):
    from ..devices.sim_device import down

    def say(m: str) -> None:
        err_console.print(f"sim: {m}", highlight=False)

    if name is None and not purge:
        from ..errors import BadInputError

        raise BadInputError("name the simulated device to stop", hint="edgekit sim down NAME [--purge]")
    if name is not None:
        down(name, say=say)
        out_console.print(f"simulated device {name} is down")
    if purge:
        from ..devices.sim_arm64 import purge_rootfs

        gone = purge_rootfs(say=say)
        out_console.print(f"deleted {len(gone)} cached arm64 rootfs" if gone else "no cached arm64 rootfs to delete")


@app.command("list", help="List simulated devices.\n\nExample: edgekit sim list --json")
def list_cmd(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    from rich.table import Table

    from ..devices.sim_device import load_states, status

    docs = [status(s) for s in load_states()]
    if as_json:
        print(json.dumps(docs))
        return
    if not docs:
        out_console.print("no simulated devices; start one with `edgekit sim up NAME`")
        return
    t = Table("name", "mode", "target", "address", "cpu quota", "memory", "running", "pid")
    for d in docs:
        mem = f"{d['memory_bytes'] / 2**20:.0f} MB" if d["memory_bytes"] else "-"
        t.add_row(d["name"], d["mode"] + (" arm64 (emulated)" if d.get("arch") == "arm64" else ""), d["target"], f"{d['host']}:{d['port']}",
                  f"{d['cpu_quota']:g}" if d["cpu_quota"] else "-", mem, "yes" if d["running"] else "NO", str(d["pid"]))
    out_console.print(t)
