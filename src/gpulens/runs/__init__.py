"""Runs and changes: every training job, load test or benchmark stored with its configuration,
environment fingerprint and summary, so that the next run can be compared with statistics."""

from typing import TYPE_CHECKING

from gpulens.runs.diff import Change, diff
from gpulens.runs.fingerprint import Fingerprint, take_fingerprint

# The registry (and with it the store) loads on first use (PEP 562): a training script that only
# takes a fingerprint does not pay for SQLite and the store (benchmarks/bench_runs.py).
_REGISTRY = frozenset({
    "EV_NOTE", "EV_RUN", "EV_RUN_CHANGE", "Note", "RecordedChange", "Run", "add_note", "baseline_for", "get_run",
    "last_known_good", "list_runs", "notes_between", "resolve_run", "run_changes", "save_run", "set_baseline",
    "set_verdict",
})

if TYPE_CHECKING:
    from gpulens.runs.registry import (
        EV_NOTE,
        EV_RUN,
        EV_RUN_CHANGE,
        Note,
        RecordedChange,
        Run,
        add_note,
        baseline_for,
        get_run,
        last_known_good,
        list_runs,
        notes_between,
        resolve_run,
        run_changes,
        save_run,
        set_baseline,
        set_verdict,
    )


def __getattr__(name: str) -> object:
    if name not in _REGISTRY:
        raise AttributeError(f"module 'gpulens.runs' has no attribute {name!r}")
    from gpulens.runs import registry

    value = getattr(registry, name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


__all__ = [
    "EV_NOTE",
    "EV_RUN",
    "EV_RUN_CHANGE",
    "Change",
    "Fingerprint",
    "Note",
    "RecordedChange",
    "Run",
    "add_note",
    "baseline_for",
    "diff",
    "get_run",
    "last_known_good",
    "list_runs",
    "notes_between",
    "resolve_run",
    "run_changes",
    "save_run",
    "set_baseline",
    "set_verdict",
    "take_fingerprint",
]
