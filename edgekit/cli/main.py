"""Entry point: `edgekit COMMAND ...`. Exit codes: 0 ok, 1 gate failed, 2 bad input or usage,
3 device or transport failure."""

from __future__ import annotations

import sys

import typer

from ..version import __version__
from . import convert as _convert
from . import deploy as _deploy
from . import devices as _devices
from . import distill as _distill
from . import doctor as _doctor
from . import lab as _lab
from . import plan as _plan
from . import profile as _profile
from . import prune as _prune
from . import quantize as _quantize
from . import report as _report
from . import run as _run
from . import setup as _setup
from . import sim as _sim
from . import targets as _targets
from . import train as _train
from .common import help_text

app = typer.Typer(
    name="edgekit",
    help="Take a trained PyTorch model to edge hardware and prove, on that hardware, that the compressed "
    "model is still good enough to ship.\n\nExample: edgekit deploy model.pt2 --target local --eval-data eval.npz "
    "--calib-data calib.npz",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool):
    if value:
        print(f"edgekit {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")):
    pass


app.command("deploy", help=help_text(_deploy.HELP), no_args_is_help=True)(_deploy.deploy_cmd)
app.command("convert", help=help_text(_convert.HELP), no_args_is_help=True)(_convert.convert_cmd)
app.command("run", help=help_text(_run.HELP), no_args_is_help=True)(_run.run_cmd)
app.add_typer(_targets.app, name="targets")
app.command("train", help=help_text(_train.HELP), no_args_is_help=True)(_train.train_cmd)
app.command("plan", help=help_text(_plan.HELP), no_args_is_help=True)(_plan.plan_cmd)
app.command("quantize", help=help_text(_quantize.HELP), no_args_is_help=True)(_quantize.quantize_cmd)
app.command("prune", help=help_text(_prune.HELP), no_args_is_help=True)(_prune.prune_cmd)
app.command("distill", help=help_text(_distill.HELP), no_args_is_help=True)(_distill.distill_cmd)
app.add_typer(_report.app, name="report")
app.add_typer(_devices.app, name="devices")
app.add_typer(_sim.app, name="sim")
app.add_typer(_lab.app, name="lab")
app.command("profile", help=help_text(_profile.HELP), no_args_is_help=True)(_profile.profile_cmd)
app.command("doctor", help=help_text(_doctor.HELP))(_doctor.doctor_cmd)
app.command("setup", help=help_text(_setup.HELP), no_args_is_help=True)(_setup.setup_cmd)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code. Usage errors are click's (exit 2); edgekit errors are
    printed with their hint and mapped to their exit code; no traceback reaches the user."""
    from ..errors import EdgekitError
    from .common import err_console

    try:
        app(args=argv, standalone_mode=True)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except EdgekitError as exc:
        from rich.markup import escape

        err_console.print(f"[bold red]error:[/bold red] {escape(exc.message)}", highlight=False, soft_wrap=True)
        if exc.hint:
            err_console.print(f"[yellow]hint:[/yellow] {escape(exc.hint)}", highlight=False, soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        err_console.print("aborted")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
