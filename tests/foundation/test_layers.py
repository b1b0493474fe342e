"""The package's layers and import graph (DESIGN.md: no arrow runs back up).

LAYERS is the one written order of every package and top-level module under src/gpulens, highest
first. An import may only point to a lower layer; packages that share a layer do not import each
other. Every import counts, lazy (function-level) ones too: a lazy import back up a layer is still a
wrong arrow. Only imports under `if TYPE_CHECKING:` are left out (they never run). There is no list of
known exceptions: a new package must be given a layer here, and a cycle of any kind fails.
ruff's banned-api (pyproject.toml) says a few of the same things near the code; this test is the contract.
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

# Highest first. Why the cuts fall where they do:
# - vocab, promql, http_client and webconfig are the shared words and the ways out and in (PromQL text,
#   outbound HTTP, the TLS / basic-auth file of every listener) that every feature uses: below all
#   features, importing none of them;
# - reader is the seam consumers read through (a store or a Prometheus), above the store it wraps;
# - the consumers are two layers: alerts / diagnose / runs decide from data; bench, scaling, energy and
#   evals build on them (a scaling signal from a bench run, energy per job from diagnosis's joins);
#   fleet (a fleet on one machine: agents as processes, workloads writing their records) sits with bench;
# - exporter (the node's live /metrics) and pipeline (the node: one sampling loop wiring sources to
#   sinks) sit above the consumers they feed; views is the panel model the surfaces share;
# - cli, and gpucheck (`python -m gpulens.gpucheck`), are entry points: nothing imports them.
# - files (writing a user's output file atomically) sits with units and clock: any feature's output uses it.
# - lazy (a package's PEP 562 re-exports) sits there too: the facade, gpu and runs name their lazy parts with it.
# - signals (handlers that hand their work to a thread, never taking a lock) too: cli's stops, workload's exit flush.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__main__",),
    ("cli", "gpucheck"),
    ("web", "report", "export", "tune", "render"),
    ("views",),
    ("pipeline",),
    ("exporter",),
    ("bench", "scaling", "energy", "evals", "integrations", "fleet"),
    ("alerts", "diagnose", "runs"),
    ("workload", "reader"),
    ("gpu", "store", "plan", "k8s"),
    ("promql", "http_client", "webconfig"),
    ("vocab",),
    ("units", "stats", "mfu", "data", "clock", "files", "safe_parse", "lazy", "signals"),
    ("errors",),
)
# The public facade (gpulens/__init__.py) re-exports from every layer (lazily, by name).
FACADE = "gpulens"
SRC = Path(__file__).resolve().parents[2] / "src" / "gpulens"


def _top(module: str) -> str:
    """The top-level part of a module: gpulens.store.store -> store; the package itself -> FACADE."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else FACADE


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


def test_every_package_and_module_has_one_layer():
    on_disk = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    on_disk |= {p.stem for p in SRC.glob("*.py") if p.name != "__init__.py"}
    listed = [name for layer in LAYERS for name in layer]
    assert len(listed) == len(set(listed)), "a package is listed on two layers"
    assert sorted(on_disk - set(listed)) == [], "give these a layer in LAYERS (and say why there)"
    assert sorted(set(listed) - on_disk) == [], "these are in LAYERS but not in src/gpulens"


def wrong_imports(package: str, layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """Each import between two of `package`'s top-level parts, lazy ones included, that does not point
    to a strictly lower layer, as 'importer:line -> imported (up|sideways)'. The package's own
    __init__ (a facade) is left out."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=True, cache_dir=None)
    layer = {name: i for i, names in enumerate(layers) for name in names}
    wrong = []
    for importer in sorted(graph.modules):
        src = _top(importer)
        if src == FACADE:
            continue
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            dst = _top(imported)
            if dst in (src, FACADE) or layer[dst] > layer[src]:
                continue
            lines = sorted(d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported))
            how = "up" if layer[dst] < layer[src] else "sideways (same layer)"
            wrong.append(f"{importer}:{lines[0]} -> {imported} ({how})")
    return wrong


def test_no_import_points_up_or_sideways():
    wrong = wrong_imports("gpulens", LAYERS)
    assert not wrong, "imports against the layers:\n  " + "\n  ".join(wrong)


def test_the_layer_check_names_wrong_imports(tmp_path, monkeypatch):
    """Not vacuous: in a throwaway package, a lazy import up a layer and one sideways are both named."""
    pkg = tmp_path / "layerpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "top.py").write_text("import layerpkg.bottom\n")
    (pkg / "left.py").write_text("import layerpkg.bottom\n")
    (pkg / "right.py").write_text("import layerpkg.left\n")
    (pkg / "bottom.py").write_text("def f():\n    import layerpkg.top\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("layerpkg", None)
    layers = (("top",), ("left", "right"), ("bottom",))
    assert wrong_imports("layerpkg", layers) == [
        "layerpkg.bottom:2 -> layerpkg.top (up)",
        "layerpkg.right:1 -> layerpkg.left (sideways (same layer))",
    ]


def test_no_package_cycle():
    edges: dict[str, set[str]] = {}
    for importer, imported in import_edges("gpulens", module_level_only=False).items():
        a = _top(importer)
        edges.setdefault(a, set()).update(b for b in map(_top, imported) if b != a)
    found = cycles(edges)
    assert not found, f"package cycles: {_describe(found)}"


def test_no_module_level_import_cycle():
    found = cycles(import_edges("gpulens", module_level_only=True))
    assert not found, f"module-level import cycles: {_describe(found)}; move the shared type down a layer"


def test_no_lazy_import_cycle():
    found = cycles(import_edges("gpulens", module_level_only=False))
    assert not found, f"import cycles through function-level imports: {_describe(found)}; cut them, do not list them"


def test_only_the_seams_import_their_outside_system():
    graph = grimp.build_graph("gpulens", include_external_packages=True, cache_dir=None)

    def importers_outside(target: str, allowed: tuple[str, ...]) -> list[str]:
        """Modules that import `target` or any module inside it, other than those under `allowed`."""
        targets = {target} | (graph.find_descendants(target) if target.startswith("gpulens.") else set())
        importers = {m for t in targets for m in graph.find_modules_that_directly_import(t)}
        return sorted(m for m in importers if not any(m == a or m.startswith(a + ".") for a in allowed))

    assert importers_outside("pynvml", ("gpulens.gpu.nvml",)) == []
    assert importers_outside("sqlite3", ("gpulens.store",)) == []


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
        ("src/gpulens/cli/x.py", "import sqlite3\n", {"TID251"}),  # cli/ruff.toml keeps the seams' bans
        ("src/gpulens/web/x.py", "from gpulens.cli.main import app\n", {"TID251"}),
        ("src/gpulens/web/x.py", "import sqlite3\n", {"TID251"}),
        ("tests/x.py", "import pynvml\n", {"TID251"}),
        ("tests/x.py", "import sqlite3\nfrom gpulens.cli.main import app\n", set()),
        ("src/gpulens/web/x.py", "from gpulens.views.panels import PANELS\n", set()),
        ("src/gpulens/report/x.py", "from gpulens.views.data import ChartOut\n", set()),
    ],
)
def test_ruff_bans_imports_up_a_layer(path, source, codes):
    assert _ruff_layer_codes(path, source) == codes
