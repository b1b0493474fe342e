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
from dataclasses import dataclass, field
from typing import Any, Literal

from gpulens.errors import BadInputError
from gpulens.runs.diff import Change, diff
from gpulens.store import Store

EV_NOTE = "note"  # data: text
EV_RUN = "run"  # data: id, kind, name
EV_RUN_CHANGE = "run_change"  # data: run_id, previous_run_id, changes [{section, key, old, new}]

# Fingerprint keys that differ between machines without changing results.
FINGERPRINT_IGNORE = ("host",)

Verdict = Literal["good", "regression"]

RUNS_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY,
  kind TEXT NOT NULL,
  name TEXT NOT NULL,
  created REAL NOT NULL,
  started REAL,
  ended REAL,
  config TEXT NOT NULL,
  summary TEXT NOT NULL,
  fingerprint TEXT NOT NULL,
  verdict TEXT,
  baseline INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS runs_by_kind_name ON runs (kind, name, id);
CREATE TABLE IF NOT EXISTS run_samples (
  run_id INTEGER NOT NULL,
  metric TEXT NOT NULL,
  vals TEXT NOT NULL,
  PRIMARY KEY (run_id, metric)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS run_changes (
  run_id INTEGER NOT NULL,
  previous_run_id INTEGER NOT NULL,
  section TEXT NOT NULL,
  key TEXT NOT NULL,
  old TEXT,
  new TEXT
);
CREATE INDEX IF NOT EXISTS run_changes_by_run ON run_changes (run_id);
"""


@dataclass
class Run:
    id: int
    kind: str
    name: str
    created: float  # unix seconds
    started: float | None
    ended: float | None
    config: dict[str, Any]
    summary: dict[str, Any]
    fingerprint: dict[str, Any]
    verdict: Verdict | None = None  # set by `compare`: good (no regression) or regression
    baseline: bool = False
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


def _ensure(store: Store) -> None:
    store.ensure_schema(RUNS_SCHEMA)


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
        from gpulens.runs.fingerprint import fingerprint_dict

        fingerprint = fingerprint_dict()
    clean = _clean_samples(samples)
    dumps = lambda o: json.dumps(o, sort_keys=True, default=_json_default)  # noqa: E731
    _ensure(store)
    now = time.time()
    with store.lock:
        conn = store.connection
        conn.execute("BEGIN IMMEDIATE")  # the previous run is read under the write lock: no race
        try:
            prev = conn.execute(
                "SELECT id, config, fingerprint FROM runs WHERE kind = ? AND name = ? ORDER BY id DESC LIMIT 1", (kind, name)
            ).fetchone()
            cur = conn.execute(
                "INSERT INTO runs (kind, name, created, started, ended, config, summary, fingerprint) VALUES (?,?,?,?,?,?,?,?)",
                (kind, name, now, started, ended, dumps(config), dumps(summary), dumps(fingerprint)),
            )
            run_id = int(cur.lastrowid)  # type: ignore[arg-type]
            conn.executemany(
                "INSERT INTO run_samples (run_id, metric, vals) VALUES (?, ?, ?)",
                [(run_id, m, json.dumps(v)) for m, v in clean.items()],
            )
            changes: list[tuple[str, Change]] = []
            if prev is not None:
                # Round-trip through JSON so that tuples and lists compare equal.
                changes += [("config", c) for c in diff(json.loads(prev[1]), json.loads(dumps(config)))]
                changes += [
                    ("fingerprint", c)
                    for c in diff(json.loads(prev[2]), json.loads(dumps(fingerprint)), ignore=FINGERPRINT_IGNORE)
                ]
                conn.executemany(
                    "INSERT INTO run_changes (run_id, previous_run_id, section, key, old, new) VALUES (?,?,?,?,?,?)",
                    [(run_id, prev[0], s, c.key, json.dumps(c.old), json.dumps(c.new)) for s, c in changes],
                )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    t = ended if ended is not None else now
    store.event(EV_RUN, t, {"kind": kind, "name": name}, {"id": run_id, "kind": kind, "name": name})
    if changes:
        store.event(
            EV_RUN_CHANGE,
            t,
            {"kind": kind, "name": name},
            {
                "run_id": run_id,
                "previous_run_id": prev[0],
                "changes": [{"section": s, "key": c.key, "old": c.old, "new": c.new} for s, c in changes],
            },
        )
    store.flush()
    return run_id


def _row_to_run(row: Sequence[Any]) -> Run:
    return Run(
        id=row[0],
        kind=row[1],
        name=row[2],
        created=row[3],
        started=row[4],
        ended=row[5],
        config=json.loads(row[6]),
        summary=json.loads(row[7]),
        fingerprint=json.loads(row[8]),
        verdict=row[9],
        baseline=bool(row[10]),
    )


_COLS = "id, kind, name, created, started, ended, config, summary, fingerprint, verdict, baseline"


def get_run(store: Store, run_id: int, *, with_samples: bool = True) -> Run:
    """The run with id `run_id`; a BadInputError that says so when there is none."""
    _ensure(store)
    with store.lock:
        row = store.connection.execute(f"SELECT {_COLS} FROM runs WHERE id = ?", (int(run_id),)).fetchone()
        if row is None:
            n = store.connection.execute("SELECT count(*), max(id) FROM runs").fetchone()
        samples = (
            store.connection.execute("SELECT metric, vals FROM run_samples WHERE run_id = ?", (int(run_id),)).fetchall()
            if row is not None and with_samples
            else []
        )
    if row is None:
        have = f"the store holds {n[0]} runs (ids up to {n[1]})" if n[0] else "the store holds no runs yet"
        raise BadInputError(f"There is no run #{run_id}; {have}.", hint="List them with `gpulens runs list`.")
    run = _row_to_run(row)
    run.samples = {m: json.loads(v) for m, v in samples}
    return run


def list_runs(store: Store, kind: str | None = None, name: str | None = None, *, limit: int | None = None) -> list[Run]:
    """Runs, newest first, optionally of one kind and/or name (without their samples)."""
    _ensure(store)
    sql = f"SELECT {_COLS} FROM runs WHERE 1=1"
    args: list[Any] = []
    if kind is not None:
        sql += " AND kind = ?"
        args.append(kind)
    if name is not None:
        sql += " AND name = ?"
        args.append(name)
    sql += " ORDER BY id DESC"
    if limit is not None:
        sql += " LIMIT ?"
        args.append(int(limit))
    with store.lock:
        rows = store.connection.execute(sql, args).fetchall()
    return [_row_to_run(r) for r in rows]


def run_changes(store: Store, run_id: int) -> list[RecordedChange]:
    """What changed between run `run_id` and the previous run of its kind and name."""
    _ensure(store)
    with store.lock:
        rows = store.connection.execute(
            "SELECT run_id, previous_run_id, section, key, old, new FROM run_changes WHERE run_id = ? ORDER BY rowid",
            (int(run_id),),
        ).fetchall()
    return [RecordedChange(r[0], r[1], r[2], Change(r[3], json.loads(r[4]), json.loads(r[5]))) for r in rows]


def set_verdict(store: Store, run_id: int, verdict: Verdict | None) -> None:
    """Mark a run good (compared without regression) or a regression."""
    get_run(store, run_id, with_samples=False)
    with store.lock:
        store.connection.execute("UPDATE runs SET verdict = ? WHERE id = ?", (verdict, int(run_id)))


def set_baseline(store: Store, run_id: int) -> None:
    """Make `run_id` the baseline of its kind and name (the one `compare baseline ...` uses)."""
    run = get_run(store, run_id, with_samples=False)
    with store.lock:
        conn = store.connection
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE runs SET baseline = 0 WHERE kind = ? AND name = ?", (run.kind, run.name))
        conn.execute("UPDATE runs SET baseline = 1 WHERE id = ?", (run.id,))
        conn.execute("COMMIT")


def last_known_good(store: Store, kind: str, name: str, *, before: int | None = None) -> Run | None:
    """The newest run of this kind and name that a comparison found good (or the marked baseline,
    which is good by choice), older than run id `before` when given."""
    _ensure(store)
    sql = f"SELECT {_COLS} FROM runs WHERE kind = ? AND name = ? AND (verdict = 'good' OR baseline = 1)"
    args: list[Any] = [kind, name]
    if before is not None:
        sql += " AND id < ?"
        args.append(int(before))
    with store.lock:
        row = store.connection.execute(sql + " ORDER BY id DESC LIMIT 1", args).fetchone()
    return _row_to_run(row) if row else None


def baseline_for(store: Store, run: Run) -> Run:
    """The run to compare `run` against: the marked baseline of its kind and name, else its last
    known-good predecessor, else its oldest predecessor."""
    _ensure(store)
    with store.lock:
        row = store.connection.execute(
            f"SELECT {_COLS} FROM runs WHERE kind = ? AND name = ? AND baseline = 1 AND id != ? ORDER BY id DESC LIMIT 1",
            (run.kind, run.name, run.id),
        ).fetchone()
        if row is None:
            good = last_known_good(store, run.kind, run.name, before=run.id)
            if good is not None:
                return get_run(store, good.id)
            row = store.connection.execute(
                f"SELECT {_COLS} FROM runs WHERE kind = ? AND name = ? AND id < ? ORDER BY id LIMIT 1",
                (run.kind, run.name, run.id),
            ).fetchone()
    if row is None:
        raise BadInputError(
            f"Run {run.label} has no baseline: it is the first run of {run.kind}/{run.name}.",
            hint="Record another run of the same kind and name first, or compare two run ids.",
        )
    return get_run(store, row[0])


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
    if not r.isdigit():
        raise BadInputError(f"{ref!r} is not a run.", hint="Use a run id from `gpulens runs list`, 'latest' or 'baseline'.")
    return get_run(store, int(r))


def add_note(store: Store, text: str, t: float | None = None, labels: Mapping[str, str] | None = None) -> float:
    """Attach a change note ("raised micro-batch to 16") to the timeline. Returns its time."""
    text = (text or "").strip()
    if not text:
        raise BadInputError("A note needs some text.", hint='E.g. gpulens note "raised micro-batch to 16".')
    t = time.time() if t is None else float(t)
    store.event(EV_NOTE, t, dict(labels or {}), {"text": text})
    store.flush()
    return t


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, set | frozenset):
        return sorted(o)
    return str(o)
