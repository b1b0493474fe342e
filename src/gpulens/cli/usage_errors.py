"""Click/typer usage errors as one gpulens sentence with exit code 2.

typer >= 0.2x vendors click (`typer._click`) and raises its own exception classes; older typer raises
click's. Both are caught here by class, from whichever modules are importable, so a new typer cannot turn a
mistyped option back into a traceback.
"""

from __future__ import annotations

import difflib
import importlib
import re
from dataclasses import dataclass

from gpulens.errors import EXIT_BAD_INPUT

_EXCEPTION_MODULES = ("typer._click.exceptions", "click.exceptions")


def _classes(name: str) -> tuple[type[BaseException], ...]:
    found: list[type[BaseException]] = []
    for module_name in _EXCEPTION_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        cls = getattr(module, name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException) and cls not in found:
            found.append(cls)
    return tuple(found)


#: every error click/typer raise for what the user typed (UsageError, BadParameter, FileError, ...)
CLICK_ERRORS: tuple[type[BaseException], ...] = _classes("ClickException")
_NO_SUCH_OPTION = _classes("NoSuchOption")
_NO_ARGS_IS_HELP = _classes("NoArgsIsHelpError")


@dataclass(frozen=True)
class UsageProblem:
    """What to print for a usage error: one sentence, a hint, and the exit code (always 2)."""

    message: str
    hint: str | None
    exit_code: int = EXIT_BAD_INPUT


def is_help_for_no_args(err: BaseException) -> bool:
    """click >= 8.2 signals "no arguments, so show the help" with an exception rather than printing it."""
    return bool(_NO_ARGS_IS_HELP) and isinstance(err, _NO_ARGS_IS_HELP)


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=3, cutoff=0.6)
    if not close:
        return ""
    return " Did you mean " + " or ".join(f"'{c}'" for c in close) + "?"


def _option_names(ctx: object) -> list[str]:
    command = getattr(ctx, "command", None)
    names: list[str] = []
    for param in getattr(command, "params", []) or []:
        names.extend(o for o in getattr(param, "opts", []) if o.startswith("-"))
        names.extend(o for o in getattr(param, "secondary_opts", []) if o.startswith("-"))
    return names


def _command_names(ctx: object) -> list[str]:
    command = getattr(ctx, "command", None)
    list_commands = getattr(command, "list_commands", None)
    if list_commands is None:
        return []
    try:
        return list(list_commands(ctx))
    except Exception:  # a broken group listing must not hide the user's mistake
        return []


def command_path_of(root: object, argv: list[str], prog: str = "gpulens") -> str:
    """The command an argument list names ("gpulens bench serve"), for errors click raises without a context
    (an option missing its value is found by the parser, before the command's context exists)."""
    path, command = [prog], root
    for arg in argv:
        commands = getattr(command, "commands", None)
        if not commands or arg not in commands:
            break
        path.append(arg)
        command = commands[arg]
    return " ".join(path)


def describe(err: BaseException, fallback_path: str = "gpulens") -> UsageProblem:
    """One sentence for a click/typer error, with a 'did you mean' where there is a close name."""
    ctx = getattr(err, "ctx", None)
    command_path = getattr(ctx, "command_path", None) or fallback_path
    if _NO_SUCH_OPTION and isinstance(err, _NO_SUCH_OPTION):
        option = str(getattr(err, "option_name", "") or "")
        choices = list(getattr(err, "possibilities", None) or []) or _option_names(ctx)
        # The option name alone (click's own text differs between versions); suggestions computed here.
        text = f"No such option {option} for `{command_path}`." + _did_you_mean(option, choices)
    else:
        format_message = getattr(err, "format_message", None)
        text = format_message() if callable(format_message) else str(err)
        text = " ".join(str(text).split())  # click joins its parts with two spaces and newlines
        unknown = re.match(r"No such command '(?P<name>[^']*)'\.", text)
        if unknown:
            # newer typer suggests commands itself; older ones do not, so suggest here
            ours = text.split("Did you mean", 1)
            suggestion = (" Did you mean" + ours[1]) if len(ours) == 2 else _did_you_mean(unknown["name"], _command_names(ctx))
            text = f"No such command '{unknown['name']}' in `{command_path}`." + suggestion
        elif not text.endswith((".", "?", "!")):
            text += "."
    return UsageProblem(message=text, hint=f"Run `{command_path} --help` to see the usage.")
