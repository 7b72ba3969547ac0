"""`edgekit doctor`: what this host can do, and what is missing (with the install command)."""

from __future__ import annotations

import json
import shutil
import sys
from importlib import metadata

import typer
from rich.markup import escape

from ..formats import FORMATS
from .common import EXIT_BAD_INPUT, out_console

HELP = """Check this host: Python packages per extra, system tools, the local agent, target files, and what each
target needs on this host (present or missing, with the command that sets it up: `edgekit setup --target NAME`).

Example: edgekit doctor --json

Exit codes: 0 the core works (a target's missing requirement is listed, not an error), 2 a core dependency is
missing or the local agent does not run.
"""

# (distribution, extra or "core", what it is for): each format's packages from the format registry
# (edgekit/formats.py), then the extras that are not a format's
PACKAGES = [
    *((p.dist, p.extra, p.purpose) for row in FORMATS for p in row.packages),
    ("neural-compressor", "inc", "INC quantization"), ("paramiko", "ssh", "SSH devices"),
    ("torch-pruning", "prune", "structured pruning"), ("polars", "train", "Parquet training data"),
    ("matplotlib", "report", "plots in report.html"),
    ("tflite-micro", "micro", "microcontroller targets (TFLite Micro)"),
]
TOOLS = [("adb", "Android devices (apt install adb)"), ("sshd", "edgekit sim (apt install openssh-server)"),
         ("ip", "edgekit sim network namespaces (apt install iproute2)"),
         ("qemu-aarch64-static", "arm64 twin (apt install qemu-user-static)"),
         ("debootstrap", "arm64 twin rootfs (apt install debootstrap)"),
         ("chromium", "HTML report check in the tests (apt install chromium)")]


def doctor_cmd(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")):
    from ..devices.host_setup import all_statuses
    from ..inputs.targets import list_targets

    pkgs = []
    for dist, extra, what in PACKAGES:
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            version = None
        pkgs.append({"package": dist, "extra": extra, "for": what, "version": version,
                     "install": None if version else ("pip install 'edgekit'" if extra == "core"
                                                      else f"pip install 'edgekit[{extra}]'")})
    tools = []
    for name, what in TOOLS:
        path = shutil.which(name) or (shutil.which(name, path="/usr/sbin:/sbin") if name in ("sshd", "ip") else None)
        tools.append({"tool": name, "for": what, "path": path})
    statuses, target_errors = all_statuses()
    broken = {e.split(":", 1)[0] for e in target_errors}
    targets = [t for t in list_targets() if t not in broken]
    setup = [s.as_dict() for s in statuses]
    agent = _probe_local_agent()
    core_ok = all(p["version"] for p in pkgs if p["extra"] == "core") and agent.get("ok")
    doc = {"python": sys.version.split()[0], "packages": pkgs, "tools": tools, "targets": targets,
           "target_errors": target_errors, "setup": setup, "local_agent": agent, "ok": bool(core_ok)}
    if as_json:
        print(json.dumps(doc))
    else:
        out_console.print(f"python {doc['python']}")
        for p in pkgs:
            mark = ("[green]ok[/]" if p["version"] else "[red]missing[/]" if p["extra"] == "core"
                    else "[yellow]missing[/]")
            out_console.print(f"  {mark} {p['package']} {p['version'] or ''} ({p['for']})"
                              + (f"  -> {escape(p['install'])}" if p["install"] else ""), highlight=False)
        for t in tools:
            mark = "[green]ok[/]" if t["path"] else "[yellow]missing[/]"
            out_console.print(f"  {mark} {t['tool']} {t['path'] or ''} ({t['for']})", highlight=False)
        out_console.print(f"  targets: {', '.join(targets)}" + (f"; broken: {target_errors}" if target_errors else ""),
                          highlight=False)
        out_console.print("  what the targets need on this host:")
        for s in setup:
            mark = "[green]ok[/]" if s["present"] else "[yellow]missing[/]"
            tail = escape(s["where"] or "") if s["present"] else f"-> {escape(s['fix'] or '')}"
            out_console.print(f"    {s['target']}: {mark} {s['requirement']} ({escape(s['for'])}) {tail}",
                              highlight=False)
        a = agent
        out_console.print(f"  local agent: {'ok' if a.get('ok') else 'FAILED'} "
                          f"{a.get('runtimes') or a.get('error') or ''}", highlight=False)
    if not core_ok:
        raise typer.Exit(EXIT_BAD_INPUT)


def _probe_local_agent() -> dict:
    from ..agent.bundle import agent_source
    from ..transport.local import LocalTransport

    try:
        t = LocalTransport()
        res = t.run([t.python, str(agent_source()), "--probe"], timeout=120)
        doc = json.loads(res.stdout)
        return {"ok": bool(doc.get("ok")), "runtimes": doc.get("runtimes"), "arch": doc.get("device", {}).get("arch")}
    except Exception as exc:  # doctor reports every failure instead of stopping at the first
        return {"ok": False, "error": str(exc)[:300]}
