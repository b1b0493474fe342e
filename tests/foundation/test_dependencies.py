"""Every runtime dependency declared in pyproject.toml is imported by the package: a declared but
unused one (pydantic was, for a long time) costs every user an install for nothing."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import gpulens

SRC = Path(gpulens.__file__).resolve().parent
PYPROJECT = SRC.parents[1] / "pyproject.toml"
# distribution name -> the module it installs, where the two differ
IMPORT_NAME = {"nvidia-ml-py": "pynvml", "prometheus-client": "prometheus_client", "pyyaml": "yaml", "hdrhistogram": "hdrh"}


def _imported_top_level_modules() -> set[str]:
    out: set[str] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                out.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                out.add(node.module.split(".")[0])
    return out


def test_every_runtime_dependency_is_imported():
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    names = [re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].strip().lower() for d in deps]
    imported = _imported_top_level_modules()
    unused = [n for n in names if IMPORT_NAME.get(n, n.replace("-", "_")) not in imported]
    assert not unused, f"declared in pyproject.toml but never imported by gpulens: {unused}"
