"""The exception tree (gpulens.errors): exit 3 follows from UnavailableError alone, and the tree drawn
in the module's docstring names every class (issue 22)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import gpulens
from gpulens import errors
from gpulens.errors import EXIT_UNAVAILABLE, GpulensError, UnavailableError


def _every_error_class() -> list[type[GpulensError]]:
    for mod in pkgutil.walk_packages(gpulens.__path__, "gpulens."):
        if mod.name.endswith(".__main__"):  # runs a command when imported
            continue
        try:
            importlib.import_module(mod.name)
        except ImportError:  # an optional extra that is not installed: its errors cannot be raised either
            continue
    found, todo = [], [GpulensError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return sorted(set(found), key=lambda c: (c.__module__, c.__qualname__))


ERRORS = _every_error_class()


def test_the_walk_finds_the_errors_defined_outside_errors_py():
    names = {c.__name__ for c in ERRORS}
    assert {"PrometheusUnavailableError", "ScrapeUnavailableError", "HttpUnavailableError", "RuleFileError"} <= names


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_exit_3_is_exactly_the_unavailable_errors(cls):
    assert (cls.exit_code == EXIT_UNAVAILABLE) == issubclass(cls, UnavailableError), cls
    if cls is not UnavailableError:  # only the root of the branch sets 3; everything under it inherits
        assert cls.__dict__.get("exit_code") != EXIT_UNAVAILABLE, f"{cls.__qualname__} sets exit 3 by hand"


def test_the_docstring_draws_every_class():
    missing = sorted(c.__name__ for c in ERRORS if c.__name__ not in errors.__doc__)
    assert not missing, f"draw these in the tree of gpulens/errors.py's docstring: {missing}"
