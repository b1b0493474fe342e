"""Runs in the store: a training job, a load test or a benchmark, with its configuration,
fingerprint, summary statistics and per-metric samples (what `compare` tests).

Saving a run also records what changed since the previous run of the same kind and name (its
configuration and fingerprint) as `run_change` rows and a timeline event, so "what changed?" has
an answer before anyone asks. Notes (`gpulens note ...`) are timeline events too.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from gpulens.errors import BadInputError
from gpulens.runs.diff import Change, diff
from gpulens.runs.fingerprint import FINGERPRINT_KEYS, fingerprint_dict
from gpulens.runs.work import step_work_changes
from gpulens.safe_parse import UnsafeValue, json_value, read_text, sqlite_int
from gpulens.store import Store
from gpulens.store import runs as repo

EV_NOTE = "note"  # data: text
EV_RUN = "run"  # data: id, kind, name
EV_RUN_CHANGE = "run_change"  # data: run_id, previous_run_id, changes [{section, key, old, new}]

# Fingerprint keys that differ between machines without changing results.
FINGERPRINT_IGNORE = ("host",)

Verdict = Literal["good", "regression"]

@dataclass
class Run(repo.RunRow):
    """A stored run (the store's row, store.runs.RunRow) and, when asked for, its samples."""

    samples: dict[str, list[float]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"#{self.id} {self.kind}/{self.name}"


@dataclass(frozen=True)
class RecordedChange:
    run_id: int
    previous_run_id: int
    section: Literal["config", "fingerprint"]
    change: Change


def _clean_samples(samples: Mapping[str, Sequence[float]] | None) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for metric, vals in (samples or {}).items():
        if not isinstance(metric, str) or not metric:
            raise BadInputError("A run's sample names must be non-empty strings.", hint=f"Got {metric!r}.")
        clean = []
        for v in vals:
            try:
                f = float(v)
            except (TypeError, ValueError):
                raise BadInputError(
                    f"The samples of {metric!r} must be numbers; {v!r} is not.", hint="Pass a list of floats per metric."
                ) from None
            if math.isfinite(f):
                clean.append(f)
        out[metric] = clean
    return out


def save_run(
    store: Store,
    kind: str,
    name: str,
    config: dict[str, Any],
    summary: dict[str, Any],
    samples: dict[str, list[float]] | None = None,
    fingerprint: dict[str, Any] | None = None,
    started: float | None = None,
    ended: float | None = None,
) -> int:
    """Store a run and return its id. The fingerprint is taken from this machine when None.
    Differences from the previous run of the same kind and name are recorded automatically."""
    if not kind or not name:
        raise BadInputError("A run needs a kind and a name.", hint="E.g. kind='bench-train', name='gpt-small'.")
    if fingerprint is None:
        fingerprint = fingerprint_dict()
    clean = _clean_samples(samples)
    dumps = lambda o: json.dumps(o, sort_keys=True, default=_json_default)  # noqa: E731
    now = time.time()

    def changes_of(prev_config: dict[str, Any], prev_fingerprint: dict[str, Any]) -> list[tuple[str, str, Any, Any]]:
        # Round-trip through JSON so that tuples and lists compare equal.
        found = [("config", c) for c in diff(prev_config, json.loads(dumps(config)))]
        found += [("fingerprint", c) for c in diff(prev_fingerprint, json.loads(dumps(fingerprint)), ignore=FINGERPRINT_IGNORE)]
        return [(s, c.key, c.old, c.new) for s, c in found]

    run_id, changes = repo.insert_run(
        store, kind=kind, name=name, created=now, started=started, ended=ended, config_json=dumps(config),
        summary_json=dumps(summary), fingerprint_json=dumps(fingerprint), samples=clean, changes_of=changes_of,
    )
    t = ended if ended is not None else now
    store.event(EV_RUN, t, {"kind": kind, "name": name}, {"id": run_id, "kind": kind, "name": name})
    if changes:
        store.event(
            EV_RUN_CHANGE,
            t,
            {"kind": kind, "name": name},
            {
                "run_id": run_id,
                "previous_run_id": changes[0].previous_run_id,
                "changes": [{"section": c.section, "key": c.key, "old": c.old, "new": c.new} for c in changes],
            },
        )
    store.flush()
    return run_id


def _run(row: repo.RunRow) -> Run:
    return Run(**asdict(row))


def get_run(store: Store, run_id: int, *, with_samples: bool = True) -> Run:
    """The run with id `run_id`; a BadInputError that says so when there is none."""
    row = repo.get_run(store, int(run_id))
    if row is None:
        n, top = repo.run_count(store)
        have = f"the store holds {n} runs (ids up to {top})" if n else "the store holds no runs yet"
        raise BadInputError(f"There is no run #{run_id}; {have}.", hint="List them with `gpulens runs list`.")
    run = _run(row)
    if with_samples:
        run.samples = repo.run_samples(store, row.id)
    return run


def list_runs(store: Store, kind: str | None = None, name: str | None = None, *, limit: int | None = None) -> list[Run]:
    """Runs, newest first, optionally of one kind and/or name (without their samples)."""
    return [_run(r) for r in repo.list_runs(store, kind, name, limit=limit)]


def run_changes(store: Store, run_id: int) -> list[RecordedChange]:
    """What changed between run `run_id` and the previous run of its kind and name."""
    return [
        RecordedChange(r.run_id, r.previous_run_id, r.section, Change(r.key, r.old, r.new))  # type: ignore[arg-type]
        for r in repo.run_changes(store, int(run_id))
    ]


def set_verdict(store: Store, run_id: int, verdict: Verdict | None) -> None:
    """Mark a run good (compared without regression) or a regression."""
    get_run(store, run_id, with_samples=False)
    repo.set_verdict(store, int(run_id), verdict)


def set_baseline(store: Store, run_id: int) -> None:
    """Make `run_id` the baseline of its kind and name (the one `compare baseline ...` uses)."""
    run = get_run(store, run_id, with_samples=False)
    repo.set_baseline(store, run.id, run.kind, run.name)


def last_known_good(store: Store, kind: str, name: str, *, before: int | None = None) -> Run | None:
    """The newest run of this kind and name that a comparison found good (or the marked baseline,
    which is good by choice), older than run id `before` when given."""
    rows = repo.list_runs(store, kind, name, good_only=True, before_id=before, limit=1)
    return _run(rows[0]) if rows else None


def baseline_for(store: Store, run: Run) -> Run:
    """The run to compare `run` against: the marked baseline of its kind and name (chosen by the
    user, whatever its settings), else among its predecessors that do the same work in a step
    (`gpulens.runs.work`) the last known-good one, else the oldest one; only when none does the same
    work, the last known-good or oldest predecessor of any settings (whose per-step figures
    `compare` then calls not comparable)."""
    rows = repo.list_runs(store, run.kind, run.name, baseline_only=True, exclude_id=run.id, limit=1)
    if not rows:
        earlier = repo.list_runs(store, run.kind, run.name, before_id=run.id, oldest_first=True)
        same = [r for r in earlier if not step_work_changes(r.config, run.config)]
        for pool in (same, earlier):
            if pool:
                good = [r for r in pool if r.verdict == "good" or r.baseline]
                rows = [good[-1] if good else pool[0]]  # the newest known-good, else the oldest
                break
    if not rows:
        raise BadInputError(
            f"Run {run.label} has no baseline: it is the first run of {run.kind}/{run.name}.",
            hint="Record another run of the same kind and name first, or compare two run ids.",
        )
    return get_run(store, rows[0].id)


def resolve_run(store: Store, ref: str, *, other: Run | None = None) -> Run:
    """A run from what a user typed: an id ("12" or "#12"), "latest", or "baseline" (the baseline
    of `other`'s kind and name)."""
    r = ref.strip().lstrip("#").lower()
    if r == "latest":
        runs = list_runs(store, other.kind if other else None, other.name if other else None, limit=1)
        if not runs:
            raise BadInputError("There is no run yet to call 'latest'.", hint="Record one, e.g. with `gpulens bench train`.")
        return get_run(store, runs[0].id)
    if r == "baseline":
        if other is None:
            raise BadInputError("'baseline' needs the other run to know which job it belongs to.", hint="E.g. `gpulens compare baseline 12`.")
        return baseline_for(store, other)
    run_id = _run_id(r)
    if run_id is None:
        raise BadInputError(f"{_shown(ref)} is not a run.", hint="Use a run id from `gpulens runs list`, 'latest' or 'baseline'.")
    return get_run(store, run_id)


def _run_id(text: str) -> int | None:
    """A run id as typed: ASCII digits a SQLite INTEGER holds (int() takes "١٢" and 5,000 digits too)."""
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        return None
    try:
        return sqlite_int(int(text), "a run id")
    except UnsafeValue:
        return None


def _shown(ref: str) -> str:
    return repr(ref) if len(ref) <= 40 else repr(ref[:40] + "…")


def add_note(store: Store, text: str, t: float | None = None, labels: Mapping[str, str] | None = None) -> float:
    """Attach a change note ("raised micro-batch to 16") to the timeline. Returns its time."""
    text = (text or "").strip()
    if not text:
        raise BadInputError("A note needs some text.", hint='E.g. gpulens note "raised micro-batch to 16".')
    t = time.time() if t is None else float(t)
    store.event(EV_NOTE, t, dict(labels or {}), {"text": text})
    store.flush()
    return t


@dataclass(frozen=True)
class Note:
    """A change someone noted on the timeline (`gpulens note`)."""

    t: float  # unix seconds
    text: str
    labels: dict[str, str] = field(default_factory=dict)


def notes_between(store: Store, start: float, end: float) -> list[Note]:
    """The notes made in [start, end], oldest first: what was changed between two runs."""
    if end < start:
        start, end = end, start
    return [Note(e.t, str((e.data or {}).get("text", "")), dict(e.labels)) for e in store.events(EV_NOTE, start=start, end=end)]


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, set | frozenset):
        return sorted(o)
    return str(o)


def load_fingerprint(ref: str, store_path: Any = None) -> tuple[str, dict[str, Any]]:
    """A fingerprint from what a user typed: "current" (this machine now), a JSON file written by
    `gpulens env --format json`, or a run id in the store. Returns (a label, the fingerprint)."""
    if ref == "current":
        return "this machine now", fingerprint_dict()
    p = Path(ref)
    if p.is_file():
        hint = "Write one with `gpulens env --format json > env.json`."
        try:
            data = json_value(read_text(p, "the fingerprint file", hint=hint))
        except UnsafeValue as e:
            raise BadInputError(f"{ref} is not a fingerprint JSON file ({e}).", hint=hint) from None
        if not isinstance(data, dict):
            raise BadInputError(f"{ref} holds JSON but not a fingerprint object.", hint="Write one with `gpulens env --format json > env.json`.")
        missing = [k for k in FINGERPRINT_KEYS if k not in data]
        if missing:
            raise BadInputError(
                f"{ref} is JSON but not a gpulens fingerprint: it has no {', '.join(missing)}.",
                hint="Write one with `gpulens env --format json > env.json`.",
            )
        return str(p), data
    run_id = _run_id(ref.lstrip("#"))
    if run_id is not None:
        if store_path is None or not Path(store_path).exists():
            raise BadInputError(f"There is no store at {store_path} to look up run #{run_id} in.", hint="Point --store at your gpulens store.")
        with Store(store_path) as st:
            run = get_run(st, run_id, with_samples=False)
        return run.label, run.fingerprint
    raise BadInputError(
        f"{_shown(ref)} is neither a file, a run id nor 'current'.",
        hint="Give a JSON file from `gpulens env --format json`, a run id from `gpulens runs list`, or 'current'.",
    )
