"""Refuse an extra that would move the main stack: `python .ci/guard_extra.py EXTRA[,EXTRA...] [--plan FILE]`.

Asks pip what installing edgekit with the extras would change (a dry run with a JSON report, run by the venv's
own pip) and exits 1 naming each guarded package it would install, upgrade or downgrade (torch, onnx,
onnxruntime, tensorflow, coremltools, torchao, numpy, pydantic: what every hop and the agent were checked
against). Used before the ExecuTorch extra goes into the main venv (.ci/executorch.sh) and before OpenVINO's and
NCNN's (.ci/install.sh installs the stack without them first), so a new release of one of those runtimes that
pins another numpy or torch fails the install with its name instead of quietly changing what the tests run on.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import subprocess
import sys
import tempfile
from pathlib import Path

GUARDED = ("torch", "onnx", "onnxruntime", "tensorflow", "coremltools", "torchao", "numpy", "pydantic")


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


def changes(plan: list[dict]) -> list[str]:
    """The guarded packages pip's install report would change, as 'name old -> new' (old None: not installed)."""
    out = []
    for item in plan:
        name, new = _norm(item["metadata"]["name"]), item["metadata"]["version"]
        if name in GUARDED:
            try:
                old = md.version(name)
            except md.PackageNotFoundError:
                old = None
            if old != new:
                out.append(f"{name} {old} -> {new}")
    return out


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    extras, root = argv[0], Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "plan.json"
        run = subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--dry-run",
                              "--quiet", "--report", str(report), "-e", f"{root}[{extras}]"],
                             capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stdout[-3000:] + run.stderr[-3000:], file=sys.stderr)
            print(f"guard: pip cannot resolve edgekit[{extras}] beside this venv's stack", file=sys.stderr)
            return 1
        plan = json.loads(report.read_text())["install"]
    moved = changes(plan)
    if moved:
        print(f"guard: edgekit[{extras}] would change the main stack ({'; '.join(moved)}): pin the extra to a "
              "release that keeps it, or give it its own venv", file=sys.stderr)
        return 1
    adds = [f"{i['metadata']['name']} {i['metadata']['version']}" for i in plan
            if _norm(i["metadata"]["name"]) != "edgekit"]
    print(f"guard: edgekit[{extras}] leaves {', '.join(GUARDED)} as they are; installs {', '.join(adds) or 'nothing new'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
