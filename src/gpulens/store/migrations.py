"""The store's schema versions: one ordered list of migrations, run on open in one transaction.

`meta.schema_version` is the number of migrations applied. Opening a store applies the missing
ones (all of them for a new file) under `BEGIN IMMEDIATE`, so several processes opening the same
old store migrate it once, and a failure leaves it as it was. A store whose version is above
`SCHEMA_VERSION` was written by a newer gpulens and is refused rather than misread.

Migrations are history: never edit one that has shipped, append a new one.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from gpulens.errors import shown
from gpulens.store.decode import json_column
from gpulens.store.schema import (
    ALERT_TABLES,
    BASELINE_TABLES,
    CORE_TABLES,
    OUTBOX_TABLES,
    ROLLUPS,
    RUN_TABLES,
    TRACE_CLAIM_TABLES,
)
from gpulens.store.types import canonical_labels


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    what: str
    apply: Callable[[sqlite3.Connection], None]


def _create(statements: tuple[str, ...]) -> Callable[[sqlite3.Connection], None]:
    def run(conn: sqlite3.Connection) -> None:
        for sql in statements:
            conn.execute(sql)

    return run


# Spelled out, not imported from gpulens.workload: this migration must keep doing what it did
# when it shipped, whatever the label is called later.
_OLD_JOB, _NEW_JOB = "job", "train_job"


def _renamed(labels: dict[str, str]) -> dict[str, str] | None:
    """The labels with `job` renamed `train_job`, or None when there is nothing to rename."""
    if _OLD_JOB not in labels:
        return None
    out = dict(labels)
    value = out.pop(_OLD_JOB)
    out.setdefault(_NEW_JOB, value)
    return out


def _rename_training_job_label(conn: sqlite3.Connection) -> None:
    """Stores written before the rename carry the training label as `job`; Prometheus owns that
    name. Rewrite it in training series (named train_* or labelled with a rank) and training
    events (kinds train_*, or labelled with a rank). Other series keep a `job` label untouched."""
    rows = conn.execute("SELECT id, name, labels FROM series WHERE labels LIKE '%\"job\"%'").fetchall()
    path = _file_of(conn)
    for sid, name, labels_json in rows:
        labels = json_column(labels_json, path, "series", sid, "labels")
        if not (name.startswith("train_") or "rank" in labels):
            continue
        new = _renamed(labels)
        if new is None:
            continue
        new_json = canonical_labels(new)
        twin = conn.execute("SELECT id FROM series WHERE name = ? AND labels = ?", (name, new_json)).fetchone()
        if twin is None:
            conn.execute("UPDATE series SET labels = ? WHERE id = ?", (new_json, sid))
            continue
        # A store written by both versions holds the series twice: fold the old one into the new.
        conn.execute("UPDATE samples SET series_id = ? WHERE series_id = ?", (twin[0], sid))
        for table in ROLLUPS:
            _fold_rollup(conn, table, sid, twin[0])
        conn.execute("DELETE FROM series WHERE id = ?", (sid,))
    # Filtered in SQL: a 90-day store holds millions of events and few of them are training's.
    events = conn.execute(
        "SELECT id, kind, labels FROM events WHERE labels LIKE '%\"job\"%' "
        "AND (kind LIKE 'train\\_%' ESCAPE '\\' OR labels LIKE '%\"rank\"%')"
    ).fetchall()
    updates = []
    for eid, kind, labels_json in events:
        labels = json_column(labels_json, path, "events", eid, "labels")
        if not (kind.startswith("train_") or "rank" in labels):
            continue
        new = _renamed(labels)
        if new is not None:
            updates.append((canonical_labels(new), eid))
    conn.executemany("UPDATE events SET labels = ? WHERE id = ?", updates)


def _file_of(conn: sqlite3.Connection) -> str:
    """The path of the file `conn` has open, for a sentence about one of its rows."""
    try:
        return str(conn.execute("PRAGMA database_list").fetchone()[2]) or "in memory"
    except (sqlite3.Error, TypeError, IndexError):
        return "being migrated"


def _fold_rollup(conn: sqlite3.Connection, table: str, old_id: int, new_id: int) -> None:
    conn.execute(
        f"INSERT INTO {table} (series_id, bucket, vmin, vmax, vsum, n) "
        f"SELECT ?, bucket, vmin, vmax, vsum, n FROM {table} WHERE series_id = ? AND true "
        "ON CONFLICT (series_id, bucket) DO UPDATE SET vmin = min(vmin, excluded.vmin), "
        "vmax = max(vmax, excluded.vmax), vsum = vsum + excluded.vsum, n = n + excluded.n",
        (new_id, old_id),
    )
    conn.execute(f"DELETE FROM {table} WHERE series_id = ?", (old_id,))


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "series, samples, roll-ups, events, meta", _create(CORE_TABLES)),
    Migration(2, "training label job -> train_job", _rename_training_job_label),
    # Feature tables, created lazily before (IF NOT EXISTS keeps stores that already have them).
    Migration(3, "alert history and silences", _create(ALERT_TABLES)),
    Migration(4, "alert baselines", _create(BASELINE_TABLES)),
    Migration(5, "runs, run samples, run changes", _create(RUN_TABLES)),
    Migration(6, "undelivered alert notifications", _create(OUTBOX_TABLES)),
    Migration(7, "how far each replayed trace is imported", _create(TRACE_CLAIM_TABLES)),
)

SCHEMA_VERSION = MIGRATIONS[-1].version


class NotAStore(Exception):
    """The file is an SQLite database, but not one gpulens wrote (or its schema version is damaged)."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


def stored_version(conn: sqlite3.Connection) -> int:
    """The schema version written in the file, 0 for a new (empty) file. Raises NotAStore for an
    SQLite database gpulens did not write: tables but no `meta`, or a `meta` without a whole
    `schema_version` (gpulens writes it in the transaction that creates the tables)."""
    has_meta = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone()
    if has_meta is None:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' LIMIT 1").fetchone():
            raise NotAStore("it holds tables but no gpulens schema version")
        return 0
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.OperationalError:
        raise NotAStore("its meta table is not gpulens's") from None
    if row is None:
        raise NotAStore("its meta table has no schema_version")
    value = str(row[0]).strip()
    if not value.isdigit():  # not "-3", "abc" or "1.5": a version is the count of migrations applied
        raise NotAStore(f"its schema version {shown(str(row[0]))} is not a whole number")
    return int(value)


def pending(version: int) -> list[Migration]:
    return [m for m in MIGRATIONS if m.version > version]


def migrate(conn: sqlite3.Connection, version: int) -> None:
    """Apply the migrations after `version` inside the caller's transaction."""
    for m in pending(version):
        m.apply(conn)
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(m.version),),
        )
