"""Checks on what a user types, applied to every command of the app at start (like
`common.apply_env_defaults`), so a new option is checked without anyone remembering to:

- every number is one a command can use: a float option refuses nan and inf (click's float type
  takes them), an integer option refuses what a SQLite INTEGER cannot hold (a `--limit` of 2**63
  reached the store as an OverflowError traceback);
- every label a user names (`--job`, `--service`, `--host`) is not empty: `--job ''` stored steps
  under a name no one can type back, and as a filter it quietly selected every job."""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from typing import Any

import typer

from gpulens.safe_parse import SQLITE_INT_MAX, SQLITE_INT_MIN


def _number_kind(annotation: Any) -> type | None:
    """int or float for `int`, `float | None`, `list[int]`...; None for anything else."""
    if annotation in (int, float):
        return annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if len(args) == 1 or (args and all(a is args[0] for a in args)):  # Optional[X], list[X], tuple[X, ...]
        return _number_kind(args[0])
    return None


def _bad(value: Any) -> str | None:
    """Why one converted value is refused, or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number"
    if isinstance(value, int) and not SQLITE_INT_MIN <= value <= SQLITE_INT_MAX:
        text = str(value)
        shown = text if len(text) <= 24 else f"a {len(text.lstrip('-'))}-digit number"
        return f"{shown} is beyond the largest whole number gpulens stores ({SQLITE_INT_MAX})"
    return None


# Options whose value is a label of stored series (or selects by one).
LABEL_FLAGS = frozenset({"--job", "--service", "--host"})


def _empty_label(value: Any) -> str | None:
    if isinstance(value, str) and not value.strip():
        return "is empty: give a name, or leave the option out"
    return None


def _checker(problem_of: Callable[[Any], str | None], previous: Callable[..., Any] | None) -> Callable[..., Any]:
    def check(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
        for v in value if isinstance(value, list | tuple) else (value,):
            problem = problem_of(v)
            if problem:
                raise typer.BadParameter(problem, ctx=ctx, param=param)
        return previous(value) if previous is not None else value

    return check


def check_values(app: typer.Typer) -> list[tuple[str, str]]:
    """Give every int and float option and argument of `app` (sub-apps included) the number check,
    and every label option the empty-label check. Returns (command, parameter) for each one checked."""
    import inspect

    from typer.models import ArgumentInfo, OptionInfo

    done: list[tuple[str, str]] = []

    def bound(callback: Callable[..., Any] | None, name: str) -> None:
        if not callable(callback):  # None, or typer's placeholder for "no callback"
            return
        try:
            hints = typing.get_type_hints(callback)
        except Exception:  # noqa: BLE001 - a hint that does not resolve: the signature's own annotation
            hints = {}
        for pname, p in inspect.signature(callback).parameters.items():
            info = p.default
            if not isinstance(info, OptionInfo | ArgumentInfo) or getattr(info, "_gpulens_checked", False):
                continue
            if _number_kind(hints.get(pname, p.annotation)) is not None:
                problem_of = _bad
            elif isinstance(info, OptionInfo) and LABEL_FLAGS.intersection(info.param_decls or ()):
                problem_of = _empty_label
            else:
                continue
            # an existing callback takes only the value (the only form the CLI uses)
            info.callback = _checker(problem_of, info.callback)
            info._gpulens_checked = True  # type: ignore[attr-defined]
            done.append((name, pname))

    def visit(t: typer.Typer, path: str) -> None:
        if t.registered_callback is not None:  # a group's own options (`gpulens plan --batch ...`)
            bound(t.registered_callback.callback, path)
        for cmd in t.registered_commands:
            if cmd.callback is not None:
                bound(cmd.callback, f"{path} {cmd.name or cmd.callback.__name__.replace('_', '-')}".strip())
        for group in t.registered_groups:
            bound(group.callback, f"{path} {group.name or ''}".strip())
            if group.typer_instance is not None:
                visit(group.typer_instance, f"{path} {group.name or ''}".strip())

    visit(app, "")
    return done
