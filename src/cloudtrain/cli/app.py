"""The `cloudtrain` command: a Typer app assembled from one module per command group.

Each command parses its flags, calls one library function and renders the value it
returns (a table, or JSON with `--json`). Errors: a `UserError` prints one line and
exits 2, any other failure prints one line and exits 1; `--debug` shows tracebacks.
"""

from __future__ import annotations

import sys
import traceback

import typer

from cloudtrain import __version__
from cloudtrain.cli import (
    catalog_cmds,
    config_cmds,
    launch_cmds,
    monitor_cmds,
    plan_cmds,
    runs_cmds,
    train_cmds,
)
from cloudtrain.errors import UserError

app = typer.Typer(
    name="cloudtrain",
    help="Fast, cheap and safe deep-learning training on rented GPU servers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"cloudtrain {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_show_version, is_eager=True, help="Print the version."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
) -> None:
    """cloudtrain: choose and cost GPUs, train fast, never lose work, see and explain."""


for _module in (
    catalog_cmds,
    plan_cmds,
    train_cmds,
    runs_cmds,
    monitor_cmds,
    launch_cmds,
    config_cmds,
):
    _module.register(app)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point; exits with 0, 1 (failure) or 2 (user error)."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        app(args=args, prog_name="cloudtrain")
    except UserError as error:
        if debug:
            traceback.print_exc()
        typer.echo(f"error: {error}", err=True)
        sys.exit(2)
    except Exception as error:
        if debug:
            raise
        name = type(error).__name__
        typer.echo(f"error: {name}: {error} (run with --debug for details)", err=True)
        sys.exit(1)
