"""The store: the hub every source writes to and every consumer reads from.

SQLite in WAL mode: one file, crash-safe, readable by several processes while one writes.
Writes are buffered and committed in batches; each commit also folds the batch into 1-minute and
1-hour roll-ups (min/max/sum/count), so a week-long chart reads a few thousand rows, not millions.
Readers ask typed questions (by name and labels, or by series id for those that cache ids) and get
typed answers (`store.types`); the features' own tables are reached through the repositories
beside this module. Opening a file migrates it (`connect`, `migrations`).
"""

from __future__ import annotations

import json
import logging
import math
import operator
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpulens.errors import StoreError
from gpulens.store import migrations
from gpulens.store.connect import ACCESS_HINT, connect, storage_error
from gpulens.store.queries import StoreQueries
from gpulens.store.recent import RecentSamples
from gpulens.store.schema import (
    ROLLUP_DELTA,
    ROLLUP_DELTA_INSERTED,
    ROLLUP_UPSERT_DELTA,
    ROLLUPS,
    ROWID_SEQUENTIAL_BELOW,
)
from gpulens.store.types import (
    canonical_labels,
)
from gpulens.units import MAX_ABS_VALUE, MAX_TIME_SECONDS, MIN_TIME_SECONDS

log = logging.getLogger(__name__)

DEFAULT_STORE_PATH = Path(".gpulens") / "gpulens.db"
_SERIES_TIME = operator.itemgetter(0, 1)  # a sample row's (series_id, t): the samples index's order

# Retention defaults: raw samples cover the default 7-day baseline window with a day to spare.
DEFAULT_RETENTION_SECONDS: dict[str, float] = {
    "raw": 8 * 86400,
    "rollup_1m": 90 * 86400,
    "rollup_1h": 2 * 365 * 86400,
    "events": 90 * 86400,
}


# What one GPU sample costs on disk, raw rows with their indexes and roll-ups: measured by the soak
# (tests/reliability/test_soak.py: 8 GPUs x 10 Hz grew the store 8.3 MiB a minute).
BYTES_PER_GPU_SAMPLE = 1_800


def estimate_store_bytes(gpus: int, interval_seconds: float, keep_raw_seconds: float) -> float:
    """About how large the store grows once raw retention is reached, for the agent's banner."""
    return gpus * (keep_raw_seconds / interval_seconds) * BYTES_PER_GPU_SAMPLE


class Store(StoreQueries):
    """A gpulens store at `path`. Thread-safe for one writer thread plus readers in this process;
    other processes open their own `Store` on the same file."""

    def __init__(
        self,
        path: str | os.PathLike[str] = DEFAULT_STORE_PATH,
        *,
        batch_size: int = 20_000,
        readonly: bool = False,
        busy_timeout_seconds: float = 30.0,
        max_pending_rows: int = 1_000_000,
    ):
        self.path = Path(path)
        self.batch_size = batch_size
        self.readonly = readonly
        self._lock = threading.RLock()
        self._pending: list[tuple[int, float, float]] = []
        self._pending_events: list[tuple[float, str, str, str]] = []
        self._series_ids: dict[tuple[str, str], int] = {}
        self._labels_cache: dict[tuple[tuple[str, str], ...], str] = {}
        self.refused_count = 0  # samples and events refused at the door (see write_id)
        self.max_pending_rows = max_pending_rows
        self.dropped_rows = 0  # buffered rows dropped while writes failed (see _auto_flush)
        self.write_error: StoreError | None = None  # the last flush's error, None once one succeeds
        # Runs inside every flush's transaction, before COMMIT (an import advances its trace claim
        # there, so the claim and the rows it covers commit together); raising rolls the flush back.
        self.commit_hook: Callable[[sqlite3.Connection], None] | None = None
        # With marks on (an import), a flush commits only the rows buffered before the last `mark()`:
        # whole frames, never half of one (a Ctrl-C midway), so the trace claim's position is exact.
        self._marked: tuple[int, int] | None = None
        # The samples written here lately, for readers that must see them before the next commit
        # (the alert rules of a live agent: `keep_recent`); None until one asks.
        self.recent: RecentSamples | None = None
        self._conn = self._connect(busy_timeout_seconds)

    # ---------------------------------------------------------------- opening
    def _connect(self, busy_timeout_seconds: float) -> sqlite3.Connection:
        return connect(self.path, readonly=self.readonly, busy_timeout_seconds=busy_timeout_seconds)

    @property
    def schema_version(self) -> int:
        with self._guard("read"):
            return migrations.stored_version(self._conn)

    @contextmanager
    def _guard(self, action: str) -> Iterator[sqlite3.Connection]:
        """The connection under the lock, with SQLite's errors turned into gpulens errors (a full
        disk into StorageFullError). For this package's repositories only."""
        with self._lock:
            try:
                yield self._conn
            except sqlite3.Error as e:
                raise storage_error(e, self.path, action, ACCESS_HINT) from None

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        """`_guard("read")` for one query, without a context manager's cost: for the lookups the alert
        rules make by the hundred every evaluation."""
        with self._lock:
            try:
                return self._conn.execute(sql, args).fetchall()
            except sqlite3.Error as e:
                raise storage_error(e, self.path, "read", ACCESS_HINT) from None

    @contextmanager
    def _transaction(self, action: str = "write to") -> Iterator[sqlite3.Connection]:
        """`_guard` inside BEGIN IMMEDIATE ... COMMIT (rolled back on any error); inside `atomic`, a
        savepoint of its transaction."""
        with self._guard(action) as conn:
            nested = conn.in_transaction
            conn.execute("SAVEPOINT gpulens_tx" if nested else "BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("RELEASE gpulens_tx" if nested else "COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK TO gpulens_tx" if nested else "ROLLBACK")
                    if nested:
                        conn.execute("RELEASE gpulens_tx")
                raise

    @contextmanager
    def atomic(self, action: str = "import into") -> Iterator[None]:
        """Everything written inside commits together at the end, or not at all: an import killed
        midway (kill -9, Ctrl-C, an error) leaves the store as it was, so a rerun never duplicates.
        Other processes see none of it until the end; their writes wait (busy timeout)."""
        with self._lock:
            self.flush()
            with self._guard(action) as conn:
                conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            with self._lock:
                self.flush()
                with self._guard(action) as conn:
                    conn.execute("COMMIT")
        except BaseException:
            with self._lock:
                # what was buffered or created inside is gone with the transaction
                self._pending.clear()
                self._pending_events.clear()
                self._series_ids.clear()
                if self._conn is not None and self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
            raise

    def backup_to(self, path: str | os.PathLike[str]) -> None:
        """Copy everything committed into a new store file at `path` (SQLite's online backup)."""
        self.flush()
        with self._guard("copy"):
            dst = sqlite3.connect(path)
            try:
                self._conn.backup(dst)
            finally:
                dst.close()

    def close(self) -> None:
        with self._lock:
            if self._conn is None:
                return
            try:
                self.flush()
            finally:
                self._conn.close()
                self._conn = None  # type: ignore[assignment]

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- writing
    def series_id(self, name: str, labels: Mapping[str, str] | None = None) -> int:
        """The id of a series, created on first use. Cache it for hot paths and use `write_id`."""
        labels_json = canonical_labels(dict(labels) if labels else None)
        key = (name, labels_json)
        sid = self._series_ids.get(key)
        if sid is not None:
            return sid
        with self._guard("write to") as conn:
            conn.execute("INSERT OR IGNORE INTO series (name, labels) VALUES (?, ?)", key)
            sid = conn.execute("SELECT id FROM series WHERE name = ? AND labels = ?", key).fetchone()[0]
        self._series_ids[key] = sid
        return sid

    def _refuse(self, what: str, t: Any, value: Any) -> None:
        self.refused_count += 1
        if self.refused_count == 1:
            log.warning("the store %s refused %s at t=%r (value %r): times must be unix seconds in 1970..2200 and "
                        "values within ±%g; such rows are dropped and counted (Store.refused_count)", self.path, what, t, value,
                        MAX_ABS_VALUE)

    def write_id(self, series_id: int, t: float, value: float) -> None:
        """Buffer one sample of a known series. NaN is not stored: a missing value is no sample.
        A time outside 1970..2200 or an infinite or absurd value is refused (counted, logged once):
        stored, it would break every later query and report."""
        if value != value:  # NaN
            return
        if not (MIN_TIME_SECONDS <= t <= MAX_TIME_SECONDS and -MAX_ABS_VALUE <= value <= MAX_ABS_VALUE):
            self._refuse("a sample", t, value)
            return
        self._pending.append((series_id, t, value))
        if self.recent is not None and series_id in self.recent.watched_ids:
            self.recent.add(series_id, t, value)
        if len(self._pending) >= self.batch_size:
            self._auto_flush()

    def write(self, name: str, labels: Mapping[str, str] | None, t: float, value: float | None) -> None:
        """Buffer one sample. None means "not available" and is skipped."""
        if value is None:
            return
        try:
            v = float(value)
        except OverflowError:
            v = math.inf  # refused below
        self.write_id(self.series_id(name, labels), t, v)

    def write_many(self, rows: Iterable[tuple[int, float, float]]) -> None:
        """Buffer many (series_id, t, value) rows at once: the fast path for bulk imports."""
        with self._lock:
            pending = self._pending
            first = len(pending)
            for r in rows:
                t, v = r[1], r[2]
                if MIN_TIME_SECONDS <= t <= MAX_TIME_SECONDS and -MAX_ABS_VALUE <= v <= MAX_ABS_VALUE:
                    pending.append(r)
                elif v == v:  # NaN is a missing value, not a refusal
                    self._refuse("a sample", t, v)
            if self.recent is not None:
                self.recent.add_many(pending[first:])
            if len(self._pending) >= self.batch_size:
                self._auto_flush()

    def event(
        self, kind: str, t: float, labels: Mapping[str, str] | None = None, data: Mapping[str, Any] | None = None
    ) -> None:
        """Buffer one event (an XID, a training step, a request, an alert, a phase marker...). An event
        at a time outside 1970..2200 is refused like a sample."""
        if not MIN_TIME_SECONDS <= t <= MAX_TIME_SECONDS:
            self._refuse(f"a {kind} event", t, None)
            return
        self._pending_events.append((t, kind, self._labels_json(labels), json.dumps(data or {}, default=_json_default)))
        if len(self._pending_events) >= self.batch_size:
            self._auto_flush()

    def _auto_flush(self) -> None:
        """A full batch: commit it, unless writes are failing (a full disk). Then the rows stay
        buffered, bounded by `max_pending_rows` (the oldest go, counted in `dropped_rows`), and the
        owner's next explicit `flush` (the sampling loop's, with backoff) writes them once it can;
        writers (the sampling sinks) never see the error."""
        with self._lock:
            if self.write_error is None:
                try:
                    self.flush()
                    return
                except StoreError:
                    pass  # kept in write_error; the rows are still buffered
            for buf in (self._pending, self._pending_events):
                excess = len(buf) - self.max_pending_rows
                if excess > 0:
                    del buf[:excess]
                    self.dropped_rows += excess
                    if self.dropped_rows == excess:
                        log.error("the store %s cannot be written and %d rows are buffered: the oldest are "
                                  "dropped from now on (Store.dropped_rows)", self.path, self.max_pending_rows)

    def _labels_json(self, labels: Mapping[str, str] | None) -> str:
        """Canonical JSON of a label set, cached: monitors label every event the same way."""
        if not labels:
            return "{}"
        key = tuple(labels.items())
        cached = self._labels_cache.get(key)
        if cached is None:
            if len(self._labels_cache) > 4096:
                self._labels_cache.clear()
            cached = self._labels_cache[key] = canonical_labels(dict(labels))
        return cached

    def keep_recent(self, keep_seconds: float) -> RecentSamples:
        """From now on, keep the samples written here of the series the caller watches for
        `keep_seconds` in memory (see `store.recent`). Flushes first, so that nothing written before
        is in neither place."""
        with self._lock:
            if self.recent is None:
                try:
                    self.flush()
                except StoreError:
                    pass  # buffered; those rows reach readers once a flush succeeds
                self.recent = RecentSamples(keep_seconds)
            else:
                self.recent.keep_seconds = max(self.recent.keep_seconds, keep_seconds)
            return self.recent

    @property
    def pending_count(self) -> int:
        return len(self._pending) + len(self._pending_events)

    @property
    def pending_events(self) -> int:
        """Events buffered, not committed yet."""
        return len(self._pending_events)

    def commit_marked_only(self, on: bool) -> None:
        """Turn marks on (see `mark`) or off; turning them off drops what was buffered after the last mark."""
        with self._lock:
            if not on and self._marked is not None:
                del self._pending[self._marked[0]:]
                del self._pending_events[self._marked[1]:]
            self._marked = (len(self._pending), len(self._pending_events)) if on else None

    def mark(self) -> None:
        """With marks on: everything buffered so far may be committed by the next flush."""
        with self._lock:
            if self._marked is not None:
                self._marked = (len(self._pending), len(self._pending_events))

    def flush(self) -> int:
        """Commit everything buffered (with marks on, what was buffered before the last mark), roll-ups
        included, in one transaction. Returns rows written."""
        with self._lock:
            if self._marked is None:
                rows, self._pending = self._pending, []
                events, self._pending_events = self._pending_events, []
            else:
                (n_rows, n_events) = self._marked
                if not n_rows and not n_events:
                    return 0  # nothing whole yet (a full batch mid-frame waits for the frame's end)
                self._marked = (0, 0)
                rows, self._pending = self._pending[:n_rows], self._pending[n_rows:]
                events, self._pending_events = self._pending_events[:n_events], self._pending_events[n_events:]
            if not rows and not events:
                return 0
            conn = self._conn
            nested = conn.in_transaction  # inside `atomic`: a savepoint of its transaction
            try:
                conn.execute("SAVEPOINT gpulens_flush" if nested else "BEGIN IMMEDIATE")
                if rows:
                    # In the index's order, (series_id, t), the inserts walk its pages in turn: about a
                    # quarter less CPU per commit of many ticks. Stable, so equal times keep their order.
                    rows.sort(key=_SERIES_TIME)
                    # The write lock is held from here: every row above `base` is this flush's.
                    base = conn.execute("SELECT coalesce(max(rowid), 0) FROM samples").fetchone()[0]
                    conn.executemany("INSERT INTO samples (series_id, t, value) VALUES (?, ?, ?)", rows)
                    conn.execute("DELETE FROM temp.rollup_delta")
                    if base < ROWID_SEQUENTIAL_BELOW:
                        conn.execute(ROLLUP_DELTA_INSERTED, (base,))
                    else:
                        conn.execute("DELETE FROM temp.batch")  # the batch again, for the roll-ups to fold
                        conn.executemany("INSERT INTO temp.batch VALUES (?, ?, ?)", rows)
                        conn.execute(ROLLUP_DELTA)
                    for table, width in ROLLUPS.items():
                        conn.execute(ROLLUP_UPSERT_DELTA.format(table=table, width=width))
                if events:
                    conn.executemany("INSERT INTO events (t, kind, labels, data) VALUES (?, ?, ?, ?)", events)
                if self.commit_hook is not None:
                    self.commit_hook(conn)
                conn.execute("RELEASE gpulens_flush" if nested else "COMMIT")
            except BaseException as e:
                if conn.in_transaction:
                    if nested:
                        conn.execute("ROLLBACK TO gpulens_flush")
                        conn.execute("RELEASE gpulens_flush")
                    else:
                        conn.execute("ROLLBACK")
                # Keep the data for the next try rather than losing it.
                self._pending[:0] = rows
                self._pending_events[:0] = events
                if self._marked is not None:
                    self._marked = (self._marked[0] + len(rows), self._marked[1] + len(events))
                if not isinstance(e, sqlite3.Error):
                    raise  # the commit hook's refusal, or an interruption: not a storage fault
                self.write_error = storage_error(e, self.path, "write to", "Check disk space and permissions.")
                raise self.write_error from None
            self.write_error = None
            return len(rows) + len(events)

    # ---------------------------------------------------------------- meta
    def get_meta(self, key: str) -> str | None:
        with self._guard("read") as conn:
            row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        with self._guard("write to") as conn:
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    # ---------------------------------------------------------------- retention
    def apply_retention(self, now: float | None = None, retention_seconds: Mapping[str, float] | None = None) -> int:
        """Delete data older than its retention. Returns the number of rows deleted."""
        now = time.time() if now is None else now
        keep = {**DEFAULT_RETENTION_SECONDS, **(retention_seconds or {})}
        deleted = 0
        with self._lock:
            self.flush()
            with self._transaction("apply retention to") as conn:
                deleted += conn.execute("DELETE FROM samples WHERE t < ?", (now - keep["raw"],)).rowcount
                for table in ROLLUPS:
                    deleted += conn.execute(f"DELETE FROM {table} WHERE bucket < ?", (now - keep[table],)).rowcount
                deleted += conn.execute("DELETE FROM events WHERE t < ?", (now - keep["events"],)).rowcount
        return deleted


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if isinstance(o, set | frozenset | tuple):
        return list(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")
