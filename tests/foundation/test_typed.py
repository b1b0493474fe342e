"""gpulens ships `py.typed` (PEP 561): a user's mypy sees its type hints instead of `Any`."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import gpulens

SRC = Path(gpulens.__file__).resolve().parents[1]
USER_CODE = """\
from gpulens.store import Store
from gpulens.workload.inference.scrape import EngineScraper

reveal_type(Store)
n: int = Store("x.db")  # wrong on purpose: mypy can only say so if it sees gpulens's types
reveal_type(EngineScraper.scrape_once)
"""


def test_a_users_mypy_sees_gpulens_types(tmp_path):
    pytest.importorskip("mypy")
    (tmp_path / "user.py").write_text(USER_CODE)
    # gpulens on the interpreter's path (as an installed package is): PEP 561 applies, so without
    # py.typed mypy says "module is installed, but missing library stubs or py.typed marker"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    r = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / ".mypy"), "--follow-imports=silent",
                        "user.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    out = r.stdout + r.stderr
    assert "py.typed" not in out and "import-untyped" not in out, out
    assert 'Revealed type is "def (path:' in out and "gpulens.store.store.Store" in out, out
    assert 'variable has type "int"' in out, out  # the deliberate mistake is caught
    assert "ScrapeResult" in out, out


def test_py_typed_is_packaged():
    assert (SRC / "gpulens" / "py.typed").is_file()
    pyproject = tomllib.loads((SRC.parent / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["gpulens"]
