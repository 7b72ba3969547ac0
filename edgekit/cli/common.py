"""What every command shares: consoles, progress display, error -> exit code mapping."""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

from rich.console import Console

# Reports are wide tables and errors carry paths: when the output is a file or a CI log, don't
# squeeze them into 80 columns (a wrapped path cannot be copied or grepped).
err_console = Console(stderr=True, width=None if Console(stderr=True).is_terminal else 200)
out_console = Console(width=None if Console().is_terminal else 160)

EXIT_OK, EXIT_GATE_FAILED, EXIT_BAD_INPUT, EXIT_DEVICE = 0, 1, 2, 3


@contextlib.contextmanager
def progress_display(enabled: bool = True) -> Iterator:
    """A spinner on stderr that shows the current step (plain lines when not a terminal)."""
    if not enabled:
        yield lambda msg: None
        return
    if not err_console.is_terminal:
        yield lambda msg: print(f"edgekit: {msg} ...", file=sys.stderr, flush=True)
        return
    with err_console.status("starting") as status:
        yield lambda msg: status.update(f"[bold]{msg}[/bold]")
