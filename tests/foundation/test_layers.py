"""The package's layers and import graph (DESIGN.md: no arrow runs back up).

Two rules, on purpose different:
- cycles count module-level imports only: a function-level import runs when called, after every module
  has loaded, so it cannot make an import-time cycle (and lazy imports are how optional extras load);
- layers count every import, lazy ones too: a lazy import back up a layer is still a wrong arrow.
Lazy cycles are listed in KNOWN_LAZY_CYCLES so that a new one fails here and gets looked at.
ruff's banned-api (pyproject.toml) says the same near the code; this test is the full contract.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp", reason="the import-graph checks need grimp (the dev extra)")

# Lazy (function-level) cycles left, each in another engineer's area: runs/ (the run registry and
# fingerprints). Remove an entry when its cycle goes.
KNOWN_LAZY_CYCLES = [
    ["gpulens.runs.fingerprint", "gpulens.runs.registry"],
]


def _module_file(package_dir: Path, module: str) -> Path:
    p = package_dir.parent.joinpath(*module.split("."))
    return p / "__init__.py" if p.is_dir() else p.with_suffix(".py")


def _function_level_lines(path: Path) -> set[int]:
    """Line numbers of the import statements inside a function body."""
    out: set[int] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            out.update(n.lineno for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom))
    return out


def import_edges(package: str, module_level_only: bool) -> dict[str, set[str]]:
    """importer -> the package's modules it imports (TYPE_CHECKING imports left out: they never run)."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=True, cache_dir=None)
    package_dir = Path(importlib.import_module(package).__file__).parent
    edges: dict[str, set[str]] = {}
    for importer in graph.modules:
        lazy = _function_level_lines(_module_file(package_dir, importer)) if module_level_only else set()
        for imported in graph.find_modules_directly_imported_by(importer):
            details = graph.get_import_details(importer=importer, imported=imported)
            if any(d["line_number"] not in lazy for d in details):
                edges.setdefault(importer, set()).add(imported)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return sorted(found)


def _describe(groups: list[list[str]]) -> str:
    return "; ".join(" <-> ".join(g) for g in groups)


def test_no_module_level_import_cycle():
    found = cycles(import_edges("gpulens", module_level_only=True))
    assert not found, f"module-level import cycles: {_describe(found)}; move the shared type down a layer"


def test_lazy_import_cycles_are_only_the_known_ones():
    found = cycles(import_edges("gpulens", module_level_only=False))
    new = [g for g in found if g not in KNOWN_LAZY_CYCLES]
    assert not new, f"new import cycles through function-level imports: {_describe(new)}"
    gone = [g for g in KNOWN_LAZY_CYCLES if g not in found]
    assert not gone, f"these cycles are gone, drop them from KNOWN_LAZY_CYCLES: {_describe(gone)}"


def test_layers():
    """cli on top; web, report and export side by side below it; views below them (all imports)."""
    graph = grimp.build_graph("gpulens", include_external_packages=True, cache_dir=None)
    layers = ("gpulens.cli", grimp.Layer("gpulens.web", "gpulens.report", "gpulens.export"), "gpulens.views")
    illegal = graph.find_illegal_dependencies_for_layers(layers=layers)
    assert not illegal, "imports back up a layer: " + "; ".join(f"{d.importer} -> {d.imported}" for d in illegal)

    def importers_outside(target: str, allowed: tuple[str, ...]) -> list[str]:
        """Modules that import `target` or any module inside it, other than those under `allowed`."""
        targets = {target} | (graph.find_descendants(target) if target.startswith("gpulens.") else set())
        importers = {m for t in targets for m in graph.find_modules_that_directly_import(t)}
        return sorted(m for m in importers if not any(m == a or m.startswith(a + ".") for a in allowed))

    assert importers_outside("gpulens.cli", ("gpulens.cli", "gpulens.__main__")) == []  # python -m gpulens
    assert importers_outside("gpulens.web", ("gpulens.web", "gpulens.cli")) == []
    assert importers_outside("pynvml", ("gpulens.gpu.nvml",)) == []


def test_the_checks_name_a_cycle_and_tell_lazy_from_module_level(tmp_path, monkeypatch):
    """A throwaway package with one module-level cycle (a <-> b) and one lazy cycle (b <-> c)."""
    pkg = tmp_path / "cyclepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyclepkg import b\n")
    (pkg / "b.py").write_text("import cyclepkg.a\n\ndef f():\n    from cyclepkg import c\n")
    (pkg / "c.py").write_text("from cyclepkg.b import f\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("cyclepkg", None)
    assert cycles(import_edges("cyclepkg", module_level_only=True)) == [["cyclepkg.a", "cyclepkg.b"]]
    assert cycles(import_edges("cyclepkg", module_level_only=False)) == [["cyclepkg.a", "cyclepkg.b", "cyclepkg.c"]]


REPO = Path(__file__).resolve().parents[2]


def _ruff_layer_codes(path: str, source: str) -> set[str]:
    """The TID codes ruff reports for `source` as if it were the file at `path` (nothing is written)."""
    pytest.importorskip("ruff", reason="the lint check needs ruff (the dev extra)")
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "TID", "--output-format", "concise", "--stdin-filename", path, "-"],
        input=source, capture_output=True, text=True, cwd=REPO, timeout=60,
    )
    return set(re.findall(r"\b(TID25[13])\b", done.stdout))


@pytest.mark.parametrize(
    ("path", "source", "codes"),
    [
        ("src/gpulens/report/x.py", "from gpulens.web import create_app\n", {"TID251"}),
        ("src/gpulens/store/x.py", "def f():\n    import gpulens.cli.main\n", {"TID251"}),
        ("src/gpulens/views/x.py", "from gpulens.export import grafana\n", {"TID253"}),
        ("src/gpulens/views/x.py", "from gpulens.report.build import build_report\n", {"TID253"}),
        ("src/gpulens/cli/x.py", "from gpulens.web.server import serve\n", set()),
        ("src/gpulens/web/x.py", "from gpulens.views.panels import PANELS\n", set()),
        ("src/gpulens/report/x.py", "from gpulens.views.data import ChartOut\n", set()),
    ],
)
def test_ruff_bans_imports_up_a_layer(path, source, codes):
    assert _ruff_layer_codes(path, source) == codes
