"""The `gpulens` command. Each module in this package with a `register(app)` function adds its
commands; business logic lives in the library, never here."""

from __future__ import annotations

import errno
import importlib
import logging
import os
import pkgutil
import re
import sys
from typing import Any

import typer
from rich.markup import escape

from gpulens import __version__
from gpulens.cli import usage_errors
from gpulens.cli.common import apply_env_defaults, console_err
from gpulens.cli.help_text import keep_examples_everywhere
from gpulens.cli.value_checks import check_values
from gpulens.errors import EXIT_BAD_INPUT, EXIT_GATE, EXIT_STORAGE_FULL, GpulensError

_HELP = (
        "GPU observability that knows training from inference.\n\n"
        "Plan (will it fit, how fast, what it costs), measure (honest baselines), watch (GPU health and "
        "workload metrics with learned thresholds) and diagnose (the bottleneck, with evidence and the fix).\n\n"
        "Start with `gpulens demo` (the recorded H200 session) or `gpulens agent` on a GPU machine.\n\n"
        "Exit codes: 0 ok, 1 a gate failed (e.g. a regression) or the reader of its output went away, 2 bad input, 3 an outside system is unavailable, 4 a disk it writes to (the store's, or the output's) is full.\n\n"
        "Set once in the environment: GPULENS_STORE (--store), GPULENS_BACKEND (--backend), "
        "GPULENS_METRIC_NAMES (--metric-names), GPULENS_NOTIFY (--notify), GPULENS_DASHBOARD_TOKEN (--token); "
        "a flag on the command line wins. Shell completion: `gpulens --install-completion`."
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpulens {__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log what gpulens does (to standard error)."),
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


# Commands whose module registers them and needs no other: `gpulens agent` then loads only
# cli/agent.py, not every command's module (the agent's start-up CPU, issue 28). A test holds this
# table to what the modules register.
SELF_CONTAINED_COMMANDS = {"agent": "agent", "record": "agent"}
_NOT_COMMANDS = {"main", "common", "usage_errors", "help_text"}


def build_app(modules: list[str] | None = None) -> typer.Typer:
    """The `gpulens` app with the commands of `modules` (cli/<name>.py; all of them by default)."""
    import gpulens.cli as pkg

    app = typer.Typer(name="gpulens", help=_HELP, no_args_is_help=True, rich_markup_mode="markdown",
                      pretty_exceptions_enable=False)
    app.callback()(_root)
    if modules is None:
        modules = sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name not in _NOT_COMMANDS)
    for name in modules:
        register = getattr(importlib.import_module(f"gpulens.cli.{name}"), "register", None)
        if register is not None:
            register(app)
    keep_examples_everywhere(app)
    apply_env_defaults(app)
    check_values(app)
    return app


_apps: dict[str | None, typer.Typer] = {}


def _app_for(argv: list[str]) -> typer.Typer:
    """The whole app, or only the invoked command's module when it is self-contained."""
    command = next((a for a in argv if not a.startswith("-")), None)
    module = SELF_CONTAINED_COMMANDS.get(command or "")
    if module is not None and "--help" not in argv[:1]:
        if module not in _apps:
            _apps[module] = build_app([module])
        return _apps[module]
    if None not in _apps:
        _apps[None] = build_app()
    return _apps[None]


def __getattr__(name: str) -> typer.Typer:
    """`from gpulens.cli.main import app`: the whole app, built on first use (PEP 562)."""
    if name == "app":
        return _app_for([])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the CLI and turns a GpulensError or a usage error into one sentence and its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    app = _app_for(args)
    try:
        # Without standalone mode click returns a command's typer.Exit code instead of exiting; prog_name keeps
        # messages saying `gpulens` under `python -m gpulens` too.
        rc = _click_command(app)(args=args, prog_name="gpulens", standalone_mode=False)
        sys.stdout.flush()  # here, not at exit, so a closed pipe or a full disk is answered below
        if isinstance(rc, int) and not isinstance(rc, bool):
            return rc
    except GpulensError as e:
        _print_error(e.message, e.hint)
        return e.exit_code
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        console_err.print("aborted")
        return 130
    except KeyboardInterrupt:
        return 130
    except OSError as e:
        if e.errno == errno.EPIPE:  # the reader stopped reading (`gpulens … | head`): stop quietly with 1, as rich
            _drop_stdout()          # does when its own write finds the pipe closed (Console.on_broken_pipe)
            return EXIT_GATE
        if e.errno == errno.ENOSPC:  # stdout's disk is full (`gpulens … > /dev/full`); the store has its own error
            _drop_stdout()
            where = str(e.filename) if e.filename else "the output"
            _print_error(f"Could not write {where}: the disk it goes to is full.", "Free some space, or send the output elsewhere.")
            return EXIT_STORAGE_FULL
        if e.errno != errno.ENAMETOOLONG:
            raise
        # a path the file system cannot even look up: pathlib's exists()/is_file() raise for it, anywhere
        name = str(e.filename or "")
        shown = name if len(name) <= 60 else f"{name[:60]}… ({len(name):,} characters)"
        _print_error(f"The path {shown} is too long for the file system.", "Give a shorter path.")
        return EXIT_BAD_INPUT
    except usage_errors.CLICK_ERRORS as e:
        if usage_errors.is_help_for_no_args(e):
            e.show()  # type: ignore[attr-defined]  # the help text, as click means it
            return EXIT_BAD_INPUT
        problem = usage_errors.describe(e, _command_path(app, args))
        _print_error(problem.message, problem.hint)
        return problem.exit_code
    return 0


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so the text still buffered for a closed pipe or a full disk is not
    written again (and failed again, with a traceback) when Python flushes it at exit."""
    try:
        sys.stdout.flush()
    except OSError:
        pass
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # a stdout with no file descriptor (captured in tests)
        pass


_click_commands: dict[int, Any] = {}


def _click_command(app: typer.Typer) -> Any:
    """The click command tree of `app`, built once per process: typer rebuilds it on every `app()` call (60 ms,
    twice for a usage error), which a test suite running main() a thousand times pays in full."""
    import typer.main

    if id(app) not in _click_commands:
        _click_commands[id(app)] = typer.main.get_command(app)
    return _click_commands[id(app)]


def _command_path(app: typer.Typer, args: list[str]) -> str:
    return usage_errors.command_path_of(_click_command(app), args)


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _printable(text: str) -> str:
    """Control characters a user typed (a path holding ESC [2J) are shown escaped, not sent to the terminal."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def _print_error(message: str, hint: str | None) -> None:
    console_err.print(f"[bold red]error:[/] {escape(_printable(message))}" + (f"\n[dim]→[/] {escape(_printable(hint))}" if hint else ""),
                      highlight=False, soft_wrap=True)


if __name__ == "__main__":
    sys.exit(main())
