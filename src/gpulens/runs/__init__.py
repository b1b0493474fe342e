"""Runs and changes: every training job, load test or benchmark stored with its configuration,
environment fingerprint and summary, so that the next run can be compared with statistics."""

from typing import TYPE_CHECKING

from gpulens.lazy import lazy_getattr
from gpulens.runs.diff import Change, diff
from gpulens.runs.fingerprint import Fingerprint, take_fingerprint

# The registry (and with it the store) loads on first use (PEP 562): a training script that only
# takes a fingerprint does not pay for SQLite and the store (benchmarks/bench_runs.py).
_LAZY = {name: "gpulens.runs.registry" for name in (
    "EV_NOTE", "EV_RUN", "EV_RUN_CHANGE", "Note", "RecordedChange", "Run", "add_note", "baseline_for", "get_run",
    "last_known_good", "list_runs", "notes_between", "resolve_run", "run_changes", "save_run", "set_baseline",
    "set_verdict",
)}

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


__getattr__ = lazy_getattr(__name__, _LAZY)

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
