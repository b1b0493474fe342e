"""Repository of runs (`runs`, `run_samples`, `run_changes`): a training job, a load test or a
benchmark with its configuration, fingerprint, summary and per-metric samples."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpulens.store.decode import json_column
from gpulens.store.store import Store


@dataclass
class RunRow:
    id: int
    kind: str
    name: str
    created: float  # unix seconds
    started: float | None
    ended: float | None
    config: dict[str, Any]
    summary: dict[str, Any]
    fingerprint: dict[str, Any]
    verdict: str | None = None  # set by `compare`: good (no regression) or regression
    baseline: bool = False


@dataclass(frozen=True)
class RunChangeRow:
    run_id: int
    previous_run_id: int
    section: str  # config | fingerprint
    key: str
    old: Any
    new: Any


# (previous run, its config, its fingerprint) -> the changes to record, as (section, key, old, new)
ChangesOf = Callable[[dict[str, Any], dict[str, Any]], list[tuple[str, str, Any, Any]]]

_COLS = "id, kind, name, created, started, ended, config, summary, fingerprint, verdict, baseline"


def _row(store: Store, r: Sequence[Any]) -> RunRow:
    config, summary, fingerprint = (json_column(r[i], store.path, "runs", r[0], c)
                                    for i, c in ((6, "config"), (7, "summary"), (8, "fingerprint")))
    return RunRow(r[0], r[1], r[2], r[3], r[4], r[5], config, summary, fingerprint, r[9], bool(r[10]))


def insert_run(
    store: Store,
    *,
    kind: str,
    name: str,
    created: float,
    started: float | None,
    ended: float | None,
    config_json: str,
    summary_json: str,
    fingerprint_json: str,
    samples: dict[str, list[float]],
    changes_of: ChangesOf,
) -> tuple[int, list[RunChangeRow]]:
    """Store a run and what changed since the previous run of its kind and name, in one
    transaction (the previous run is read under the write lock: two savers cannot race)."""
    with store._transaction() as conn:
        prev = conn.execute(
            "SELECT id, config, fingerprint FROM runs WHERE kind = ? AND name = ? ORDER BY id DESC LIMIT 1", (kind, name)
        ).fetchone()
        cur = conn.execute(
            "INSERT INTO runs (kind, name, created, started, ended, config, summary, fingerprint) VALUES (?,?,?,?,?,?,?,?)",
            (kind, name, created, started, ended, config_json, summary_json, fingerprint_json),
        )
        run_id = int(cur.lastrowid)  # type: ignore[arg-type]
        conn.executemany(
            "INSERT INTO run_samples (run_id, metric, vals) VALUES (?, ?, ?)",
            [(run_id, m, json.dumps(v)) for m, v in samples.items()],
        )
        changes: list[RunChangeRow] = []
        if prev is not None:
            prev_config = json_column(prev[1], store.path, "runs", prev[0], "config")
            prev_fingerprint = json_column(prev[2], store.path, "runs", prev[0], "fingerprint")
            changes = [RunChangeRow(run_id, prev[0], *c) for c in changes_of(prev_config, prev_fingerprint)]
            conn.executemany(
                "INSERT INTO run_changes (run_id, previous_run_id, section, key, old, new) VALUES (?,?,?,?,?,?)",
                [(c.run_id, c.previous_run_id, c.section, c.key, json.dumps(c.old), json.dumps(c.new)) for c in changes],
            )
    return run_id, changes


def get_run(store: Store, run_id: int) -> RunRow | None:
    with store._guard("read") as conn:
        row = conn.execute(f"SELECT {_COLS} FROM runs WHERE id = ?", (int(run_id),)).fetchone()
    return _row(store, row) if row else None


def run_samples(store: Store, run_id: int) -> dict[str, list[float]]:
    with store._guard("read") as conn:
        rows = conn.execute("SELECT metric, vals FROM run_samples WHERE run_id = ?", (int(run_id),)).fetchall()
    return {m: json_column(v, store.path, "run_samples", f"run {run_id}, metric {m}", "vals", list) for m, v in rows}


def run_count(store: Store) -> tuple[int, int | None]:
    """(how many runs, the highest id)."""
    with store._guard("read") as conn:
        n, top = conn.execute("SELECT count(*), max(id) FROM runs").fetchone()
    return int(n), top


def list_runs(
    store: Store,
    kind: str | None = None,
    name: str | None = None,
    *,
    limit: int | None = None,
    good_only: bool = False,
    baseline_only: bool = False,
    before_id: int | None = None,
    exclude_id: int | None = None,
    oldest_first: bool = False,
) -> list[RunRow]:
    """Runs, newest first (oldest first with `oldest_first`), filtered as asked. `good_only`:
    found good by a comparison, or the marked baseline (good by choice)."""
    sql = f"SELECT {_COLS} FROM runs WHERE 1=1"
    args: list[Any] = []
    for cond, value in (("kind = ?", kind), ("name = ?", name), ("id < ?", before_id), ("id != ?", exclude_id)):
        if value is not None:
            sql += f" AND {cond}"
            args.append(value)
    if good_only:
        sql += " AND (verdict = 'good' OR baseline = 1)"
    if baseline_only:
        sql += " AND baseline = 1"
    sql += " ORDER BY id" + ("" if oldest_first else " DESC")
    if limit is not None:
        sql += " LIMIT ?"
        args.append(int(limit))
    with store._guard("read") as conn:
        rows = conn.execute(sql, args).fetchall()
    return [_row(store, r) for r in rows]


def run_changes(store: Store, run_id: int) -> list[RunChangeRow]:
    with store._guard("read") as conn:
        rows = conn.execute(
            "SELECT run_id, previous_run_id, section, key, old, new FROM run_changes WHERE run_id = ? ORDER BY rowid",
            (int(run_id),),
        ).fetchall()
    return [RunChangeRow(r[0], r[1], r[2], r[3], *(json_column(r[i], store.path, "run_changes", f"run {r[0]}, key {r[3]}", c, object)
                                                   for i, c in ((4, "old"), (5, "new")))) for r in rows]


def set_verdict(store: Store, run_id: int, verdict: str | None) -> None:
    with store._guard("write to") as conn:
        conn.execute("UPDATE runs SET verdict = ? WHERE id = ?", (verdict, int(run_id)))


def set_baseline(store: Store, run_id: int, kind: str, name: str) -> None:
    """Make `run_id` the only baseline of its kind and name."""
    with store._transaction() as conn:
        conn.execute("UPDATE runs SET baseline = 0 WHERE kind = ? AND name = ?", (kind, name))
        conn.execute("UPDATE runs SET baseline = 1 WHERE id = ?", (int(run_id),))
