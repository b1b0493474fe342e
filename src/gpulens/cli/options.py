"""Options declared once as a typed dataclass and generated as typer flags for every command that
takes them, so two commands cannot drift apart in a default or a help line.

A field carries its flags and help in its metadata (`option(...)`); a command declares a parameter
`opts: TheOptions` where the shared flags go, and receives the parsed dataclass there."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import MISSING, field, fields
from typing import Any

import typer

from gpulens.errors import BadInputError, shown


def option(flags: tuple[str, ...], help: str, default: Any = MISSING, *, min: int | None = None,  # noqa: A002 - the CLI's words
           **kw: Any) -> Any:
    """A dataclass field that is a command-line option; no default makes the option required; `min`
    is the smallest number it takes (a count of zero or less is refused before the command runs)."""
    meta = {"flags": flags, "help": help, "min": min}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


def _option_type(hint: Any) -> Any:
    """`int | None` -> `int`: typer takes the None default as "not given"."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if len(args) == 1 and type(None) in typing.get_args(hint) else hint


def _default(f: Any) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return ...  # required


def with_options(cls: type, param: str = "opts") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Replace `func`'s parameter `param` by one typer option per field of the dataclass `cls`
    (in field order, where `param` stood); `func` receives them as one `cls` instance."""

    def deco(func: Callable[..., Any]) -> Callable[..., Any]:
        hints = typing.get_type_hints(cls)
        own_hints = typing.get_type_hints(func)
        shared = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=_option_type(hints[f.name]),
                                    default=typer.Option(_default(f), *f.metadata["flags"], help=f.metadata["help"],
                                                                            min=f.metadata.get("min")))
                  for f in fields(cls)]
        names = [f.name for f in fields(cls)]
        params: list[inspect.Parameter] = []
        for p in inspect.signature(func).parameters.values():
            if p.name == param:
                params += shared
            else:
                params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=own_hints.get(p.name, p.annotation)))

        def wrapper(**kw: Any) -> Any:
            opts = cls(**{n: kw.pop(n) for n in names})
            return func(**{param: opts}, **kw)

        wrapper.__name__, wrapper.__doc__, wrapper.__module__ = func.__name__, func.__doc__, func.__module__
        wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return deco


def parse_ratio(text: str, what: str) -> float:
    """A share between 0 and 1, written 0.05 or 5% (one sentence when it is not)."""
    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise BadInputError(f"Cannot read {what} {shown(text)}.", hint=f"Give a share such as {what} 5%.") from None
    if not 0 < v < 1:
        raise BadInputError(f"{what} {text} is out of range.", hint=f"Give a share between 0% and 100%, e.g. {what} 5%.")
    return v
