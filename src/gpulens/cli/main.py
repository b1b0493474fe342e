"""The `gpulens` command. Each module in this package with a `register(app)` function adds its
commands; business logic lives in the library, never here."""

from __future__ import annotations

import importlib
import logging
import pkgutil
import sys

import typer
from rich.markup import escape

from gpulens import __version__
from gpulens.cli.common import console_err
from gpulens.errors import GpulensError

app = typer.Typer(
    name="gpulens",
    help=(
        "GPU observability that knows training from inference.\n\n"
        "Plan (will it fit, how fast, what it costs), measure (honest baselines), watch (GPU health and "
        "workload metrics with learned thresholds) and diagnose (the bottleneck, with evidence and the fix).\n\n"
        "Start with `gpulens demo` (the recorded H200 session) or `gpulens agent` on a GPU machine.\n\n"
        "Exit codes: 0 ok, 1 a gate failed (e.g. a regression), 2 bad input, 3 an outside system is unavailable."
    ),
    no_args_is_help=True,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpulens {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log what gpulens does (to standard error)."),
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


def _register_all() -> None:
    import gpulens.cli as pkg

    for mod in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if mod.name in {"main", "common"}:
            continue
        module = importlib.import_module(f"gpulens.cli.{mod.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)


_register_all()


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the CLI and turns a GpulensError into one sentence and its exit code."""
    try:
        # Without standalone mode click returns a command's typer.Exit code instead of exiting.
        rc = app(args=argv, standalone_mode=False)
        if isinstance(rc, int) and not isinstance(rc, bool):
            return rc
    except GpulensError as e:
        console_err.print(f"[bold red]error:[/] {escape(e.message)}" + (f"\n[dim]→[/] {escape(e.hint)}" if e.hint else ""), highlight=False)
        return e.exit_code
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        console_err.print("aborted")
        return 130
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # click's usage errors
        import click

        if isinstance(e, click.exceptions.ClickException):
            e.show()
            return e.exit_code
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
