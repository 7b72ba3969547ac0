"""What every command shares: consoles, progress display, error -> exit code mapping."""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

from rich.console import Console
from rich.markup import escape

# Reports are wide tables and errors carry paths: when the output is a file or a CI log, don't
# squeeze them into 80 columns (a wrapped path cannot be copied or grepped).
err_console = Console(stderr=True, width=None if Console(stderr=True).is_terminal else 200)
out_console = Console(width=None if Console().is_terminal else 160)

EXIT_OK, EXIT_GATE_FAILED, EXIT_BAD_INPUT, EXIT_DEVICE = 0, 1, 2, 3

# `--help` panels (Typer's rich_help_panel), shared so that an option means the same panel in every command.
PANEL_DATA = "Model and data"
PANEL_TARGET = "Target and device"
PANEL_SEARCH = "Variants and search"
PANEL_COMPRESSION = "Compression"
PANEL_CONVERSION = "Conversion"
PANEL_GATE = "Gate"
PANEL_RELEASE = "Release gate (vs --baseline)"
PANEL_MEASURE = "Measurement"
PANEL_FLEET = "Fleet and lab"
PANEL_TRAINING = "Training"
PANEL_DISTRIBUTED = "Distributed (torchrun)"
PANEL_HARDWARE = "Training hardware"
PANEL_SSH = "SSH"
PANEL_ADB = "Android (adb)"
PANEL_ARM64 = "arm64 twin"
PANEL_LM = "Language models"
PANEL_HOST = "Host"
PANEL_OUTPUT = "Output"

# --const / --state (edgekit/inputs/stateful.py): the same words in every command that takes them
CONST_HELP = ("A constant model input as NAME=VALUE (repeat), fed unchanged with every sample, e.g. --const "
              "sr=16000 (a number, or comma-separated numbers); a 0-d array in the .npz named like the input works too.")
STATE_HELP = ("A streaming model's state as OUTPUT:INPUT (repeat), e.g. --state stateN:state: INPUT starts as zeros "
              "and takes OUTPUT after each sample; samples run one at a time in the .npz's order (batch 1), in "
              "scoring and in static INT8 calibration.")


def help_text(text: str) -> str:
    """A command's help as Typer's rich mode should get it. That mode keeps every single newline as a hard
    line break, so a docstring's prose would break where its source lines do, not at the terminal's width:
    each prose paragraph becomes one line (the terminal wraps it). Paragraphs with an indented line (the
    examples) keep their lines as written."""
    import inspect

    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if any(line[:1].isspace() for line in p.splitlines()) else " ".join(p.split())
                       for p in paragraphs)


HOST_THREADS_HELP = ("Threads for host-side work (reference outputs, export, calibration, fine-tunes, conversion). "
                     "Default: $EDGEKIT_HOST_THREADS, else the CPU free now (cores this process may use, less the "
                     "run queue, at least 1): on a busy host more threads than free cores only wait.")


@contextlib.contextmanager
def host_threads_for(threads: int | None) -> Iterator:
    """The command's host-side work with the threads --host-threads (or the free CPU) gives."""
    from ..agent.host import host_compute, host_threads

    with host_compute(host_threads(threads)) as ht:
        yield ht


@contextlib.contextmanager
def progress_display(enabled: bool = True, *, still_every_s: float = 30.0) -> Iterator:
    """The current step on stderr: a live line with the step's elapsed seconds on a terminal; plain
    lines otherwise (a CI log), plus a "still ..." line every ``still_every_s`` while one step runs
    long, so a reader never faces minutes of silence."""
    if not enabled:
        yield lambda msg: None
        return
    import time

    state = {"msg": "starting", "since": time.monotonic(), "said": time.monotonic()}
    if not err_console.is_terminal:
        def say(msg: str) -> None:
            state.update(msg=msg, since=time.monotonic(), said=time.monotonic())
            print(f"edgekit: {msg} ...", file=sys.stderr, flush=True)

        def still() -> None:
            now = time.monotonic()
            if now - state["said"] >= still_every_s:
                state["said"] = now
                print(f"edgekit: still {state['msg']} ({now - state['since']:.0f} s)", file=sys.stderr, flush=True)

        with _every_second(still):
            yield say
        return
    with err_console.status("starting") as status:
        def show() -> None:
            el = time.monotonic() - state["since"]
            status.update(f"[bold]{escape(state['msg'])}[/bold]" + (f" [dim]({el:.0f} s)[/dim]" if el >= 3 else ""))

        def say_live(msg: str) -> None:
            state.update(msg=msg, since=time.monotonic())
            show()

        with _every_second(show):
            yield say_live


@contextlib.contextmanager
def _every_second(fn) -> Iterator[None]:
    """Call ``fn`` once a second from a daemon thread while the block runs."""
    import threading

    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(1.0):
            fn()

    threading.Thread(target=loop, name="edgekit-progress", daemon=True).start()
    try:
        yield
    finally:
        stop.set()


def parse_key_values(items: list[str], option: str) -> dict:
    """``KEY=VALUE`` words as a dict, each value read as a YAML scalar (0.5 a number, true a bool, text a
    string); a word without '=' is a BadInputError naming the option."""
    import yaml

    from ..errors import BadInputError

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise BadInputError(f"{option} {item!r} is not KEY=VALUE", hint=f"e.g. {option} threshold=0.5")
        try:
            out[key.strip()] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = value
    return out

