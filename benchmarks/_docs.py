"""A benchmark writes its own table into the docs (issue #38): the section of a docs page between

    <!-- benchmark NAME: begin -->
    <!-- benchmark NAME: end -->

is replaced by what the script measured, headed by the host's CPU and ISA, the edgekit commit and the command that
reproduces it, so a page never holds a figure no run printed. The page is written atomically (a temp file beside
it, renamed); a page without the markers is an error naming them (nothing is appended silently)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _cpu import isa

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def markers(name: str) -> tuple[str, str]:
    return f"<!-- benchmark {name}: begin -->", f"<!-- benchmark {name}: end -->"


def provenance(command: list[str] | None = None, when: str | None = None) -> str:
    """The line every written table starts with: host, ISA, commit, date and the reproducing command."""
    import time

    cmd = " ".join(["python", *(command if command is not None else sys.argv)])
    return (f"Written by the benchmark: {isa()}; edgekit `{commit()}`; "
            f"{when or time.strftime('%Y-%m-%d', time.gmtime())}; `{cmd}`.")


def write_section(page: Path, name: str, body: str, *, command: list[str] | None = None,
                  when: str | None = None) -> None:
    """Replace the ``name`` section of ``page`` with the provenance line and ``body``."""
    text = page.read_text(encoding="utf-8")
    begin, end = markers(name)
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        raise SystemExit(f"{page} has no section for benchmark {name!r}: put the two lines\n  {begin}\n  {end}\n"
                         "where the table belongs")
    new = (text[:i + len(begin)] + "\n" + provenance(command, when) + "\n\n" + body.strip("\n") + "\n" + text[j:])
    fd, tmp = tempfile.mkstemp(dir=page.parent, prefix=f".{page.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(new)
    os.replace(tmp, page)
