"""Findings: what `gpulens diagnose` reports. Analyzers are pure functions of what a Reader answers
(gpulens.reader.AnalysisReader: a node's store today, a fleet's Prometheus later); they never write."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from gpulens.reader import AnalysisReader, analysis_reader
from gpulens.store import Store

Workload = Literal["training", "inference", "gpu"]
Severity = Literal["info", "warning", "critical"]


@dataclass
class Finding:
    kind: str  # e.g. input_bound, checkpoint_stall, slo_violation, colocation
    workload: Workload
    start: float  # unix seconds
    end: float
    severity: Severity
    summary: str  # one sentence a beginner understands
    evidence: dict[str, Any] = field(default_factory=dict)  # the numbers that support it (typed: diagnose.evidence)
    advice: list[str] = field(default_factory=list)  # ordered: the step that pays most first
    labels: dict[str, str] = field(default_factory=dict)  # job / service / gpu

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: evidence values as plain numbers, with `evidence_units` (the unit of each value
        that has one), `evidence_text` (each value as the terminal, dashboard and report show it) and
        `evidence_labels` (each key as they label it)."""
        from gpulens.diagnose.evidence import evidence_label, format_value, unit_of

        d = asdict(self)
        d["evidence_units"] = {k: u for k, v in self.evidence.items() if (u := unit_of(v))}
        d["evidence_text"] = {k: format_value(v) for k, v in self.evidence.items()}
        d["evidence_labels"] = {k: evidence_label(k, v) for k, v in self.evidence.items()}
        return d


@dataclass
class DiagnoseScope:
    """What to look at: a time window and optional job / service selection."""

    start: float | None = None
    end: float | None = None
    job: str | None = None
    service: str | None = None


Analyzer = Callable[[AnalysisReader, DiagnoseScope], list[Finding]]
_ANALYZERS: list[tuple[str, Analyzer, int]] = []
# Findings are listed by their analyzer's order, then oldest first: GPU faults (order 0) and GPU
# conditions (1) come before the workload findings, which they may explain.
DEFAULT_ORDER = 2


def register_analyzer(name: str, *, order: int = DEFAULT_ORDER) -> Callable[[Analyzer], Analyzer]:
    def deco(fn: Analyzer) -> Analyzer:
        _ANALYZERS.append((name, fn, order))
        return fn

    return deco


# Modules that register analyzers when imported; missing ones are skipped.
ANALYZER_MODULES = (
    "gpulens.diagnose.training",
    "gpulens.diagnose.inference",
    "gpulens.diagnose.colocation",
    "gpulens.diagnose.health",
    "gpulens.diagnose.silence",
)


def diagnose(source: AnalysisReader | Store, scope: DiagnoseScope | None = None) -> list[Finding]:
    """Every registered analyzer over the source (a Reader, or a Store, read through its StoreReader):
    GPU health first, then the rest, each oldest first."""
    import importlib
    import importlib.util

    for mod in ANALYZER_MODULES:
        if importlib.util.find_spec(mod) is not None:
            importlib.import_module(mod)
    scope = scope or DiagnoseScope()
    reader = analysis_reader(source)
    ranked: list[tuple[int, Finding]] = []
    for _name, fn, order in _ANALYZERS:
        ranked.extend((order, f) for f in fn(reader, scope))
    return [f for _, f in sorted(ranked, key=lambda of: (of[0], of[1].start, of[1].kind))]
