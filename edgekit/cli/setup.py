"""`edgekit setup`: install what a target needs on this host (what `edgekit doctor` lists as missing)."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from .common import PANEL_OUTPUT, PANEL_TARGET, err_console, out_console

HELP = """Set up what a target needs on this host, once: the browser's web runtimes (ONNX Runtime Web and LiteRT.js,
npm ci from the lockfile packaged with edgekit into the user cache, ~/.cache/edgekit/web-runtimes/), the arm64
twin's root filesystem (--twin: debootstrap, root). What edgekit cannot install itself (Chromium, npm, a Python
extra) is named with its install command. Present requirements are left as they are.

Example: edgekit setup --target browser

Example: edgekit setup --twin --json

Exit codes: 0 everything the targets need is here, 2 an unknown target, 3 something is still missing or its
setup failed (npm or the registry unreachable, debootstrap failed; the message says which and how to fix it).
"""


def setup_cmd(
    target: Annotated[Optional[list[str]], typer.Option(
        "--target", "-t", rich_help_panel=PANEL_TARGET,
        help="A target name or .yaml file whose host requirements to set up (repeatable), e.g. browser.")] = None,
    twin: Annotated[bool, typer.Option(
        "--twin", rich_help_panel=PANEL_TARGET,
        help="Also build the arm64 twin's root filesystem (`edgekit sim up NAME --arch arm64`; root, debootstrap, "
             "qemu-user-static; ~2 min once, cached).")] = False,
    as_json: Annotated[bool, typer.Option("--json", rich_help_panel=PANEL_OUTPUT,
                                          help="Machine-readable output.")] = False,
) -> None:
    from ..devices.host_setup import TWIN, TWIN_REQUIREMENTS, Requirement, requirements_for
    from ..errors import BadInputError, DeviceError, EdgekitError
    from ..inputs.targets import load_target

    if not target and not twin:
        raise BadInputError("name what to set up: --target NAME (repeatable) and/or --twin",
                            hint="`edgekit doctor` lists each target's requirements and what is missing")
    plan: list[tuple[str, list[Requirement]]] = []
    for t in target or []:
        spec = load_target(t)  # an unknown name: exit 2 with the known ones
        plan.append((spec.name, requirements_for(spec)))
    if twin:
        plan.append((TWIN, TWIN_REQUIREMENTS))

    def say(msg: str) -> None:
        err_console.print(f"setup: {msg}", highlight=False)

    rows: list[dict] = []
    errors: list[EdgekitError] = []
    for name, reqs in plan:
        for r in reqs:
            where, action, error = r.check(), "present", None
            if where is None and r.setup is not None:
                try:
                    where, action = r.setup(say), "installed"
                except EdgekitError as exc:
                    action, error = "failed", exc
                    errors.append(exc)
            elif where is None:
                action = "missing"
            rows.append({"target": name, "requirement": r.name, "for": r.purpose, "action": action, "where": where,
                         "fix": None if where else r.fix,
                         "error": None if error is None else {"message": error.message, "hint": error.hint}})
    missing = [r for r in rows if r["action"] == "missing"]
    if not errors and missing:
        errors.append(DeviceError("still missing on this host: " + ", ".join(
            f"{r['requirement']} (for {r['target']})" for r in missing),
            hint="; ".join(dict.fromkeys(r["fix"] for r in missing))))
    if as_json:
        print(json.dumps({"ok": not errors, "requirements": rows}))
    else:
        from rich.markup import escape

        marks = {"present": "[green]ok[/]", "installed": "[green]installed[/]", "missing": "[red]missing[/]",
                 "failed": "[red]failed[/]"}
        for row in rows:
            tail = escape(row["where"]) if row["where"] else f"-> {escape(row['fix'])}"
            out_console.print(f"  {row['target']}: {marks[row['action']]} {row['requirement']} {tail}",
                              highlight=False)
        for name, reqs in plan:
            if not reqs:
                out_console.print(f"  {name}: nothing to set up on this host beyond edgekit itself", highlight=False)
    if errors:
        if as_json:
            raise typer.Exit(errors[0].exit_code)
        raise errors[0]
