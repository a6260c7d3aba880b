"""The ``zonnx`` console entry point: registers one subcommand per module and turns ZonnxError into one line."""

from __future__ import annotations

__all__ = ["app", "main"]

import logging
import sys

import typer
from rich.markup import escape

from zonnx import __version__
from zonnx.errors import ZonnxError
from zonnx.tools import (
    build_cmd,
    compare_cmd,
    compile_cmd,
    convert_cmd,
    doctor_cmd,
    inspect_cmd,
    optimize_cmd,
    profile_cmd,
    quantize_cmd,
    run_cmd,
    triage_cmd,
)
from zonnx.tools.console import err_console

app = typer.Typer(
    name="zonnx",
    help="ONNX-centric NPU deployment toolchain: convert, inspect, optimize, quantize, compile, build.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.command("inspect")(inspect_cmd.inspect)
app.command("optimize")(optimize_cmd.optimize)
app.command("quantize")(quantize_cmd.quantize)
app.command("compile")(compile_cmd.compile)
app.command("build")(build_cmd.build)
app.command("convert")(convert_cmd.convert)
app.command("run")(run_cmd.run)
app.command("profile")(profile_cmd.profile)
app.command("compare")(compare_cmd.compare)
app.command("triage")(triage_cmd.triage)
app.command("doctor")(doctor_cmd.doctor)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"zonnx {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log what each step does."),
) -> None:
    """ONNX-centric NPU deployment toolchain."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )


def main() -> None:
    """Run the CLI; a ZonnxError prints one line 'error: ...' and exits with its code, never a traceback.

    typer's standalone mode handles usage errors (exit 2 with the usage line) and --help itself.
    """
    try:
        app()
    except ZonnxError as e:
        err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
