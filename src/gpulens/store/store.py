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
from gpulens.store.recent import RecentSamples
from gpulens.store.schema import (
    ROLLUP_DELTA,
    ROLLUP_DELTA_INSERTED,
    ROLLUP_UPSERT_DELTA,
    ROLLUPS,
    ROWID_SEQUENTIAL_BELOW,
)
from gpulens.store.types import (
    DataVersion,
    Event,
    LatestValue,
    Resolution,
    Sample,
    SampleColumns,
    SampleSummary,
    SeriesData,
    SeriesKey,
    StoredSeries,
    canonical_labels,
    with_labels,
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


class Store:
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
            return migrations.stored_version(self._conn) or 0

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
                        "values finite; such rows are dropped and counted (Store.refused_count)", self.path, what, t, value)

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

    # ---------------------------------------------------------------- reading
    def series(self, name: str | None = None, labels: Mapping[str, str] | None = None) -> list[SeriesKey]:
        """Series whose name is `name` (all if None) and whose labels include `labels`."""
        with self._guard("read") as conn:
            if name is None:
                rows = conn.execute("SELECT name, labels FROM series ORDER BY name, labels").fetchall()
            else:
                rows = conn.execute(
                    "SELECT name, labels FROM series WHERE name = ? ORDER BY labels", (name,)
                ).fetchall()
        return with_labels([SeriesKey(n, json.loads(lj)) for n, lj in rows], labels)

    def metric_names(self) -> list[str]:
        with self._guard("read") as conn:
            return [r[0] for r in conn.execute("SELECT DISTINCT name FROM series ORDER BY name")]

    def _id_of(self, key: SeriesKey) -> int | None:
        with self._guard("read") as conn:
            row = conn.execute(
                "SELECT id FROM series WHERE name = ? AND labels = ?", (key.name, key.labels_json)
            ).fetchone()
        return row[0] if row else None

    def time_range(self, name: str | None = None) -> tuple[float, float] | None:
        """First and last sample time (of metric `name`, or of everything, events included).
        Read per series through the (series_id, t) index, so a week of samples answers at once.
        Times outside 1970..2200 (written before the store refused them) are not trusted: left out."""
        per_series = (
            "SELECT min(lo), max(hi) FROM (SELECT (SELECT min(t) FROM samples WHERE series_id = s.id AND t >= ?) AS lo, "
            "(SELECT max(t) FROM samples WHERE series_id = s.id AND t <= ?) AS hi FROM series s{where})"
        )
        bounds = (MIN_TIME_SECONDS, MAX_TIME_SECONDS)
        with self._guard("read") as conn:
            if name is None:
                row = conn.execute(per_series.format(where=""), bounds).fetchone()
                ev = conn.execute("SELECT min(t), max(t) FROM events WHERE t >= ? AND t <= ?", bounds).fetchone()
            else:
                row = conn.execute(per_series.format(where=" WHERE s.name = ?"), (*bounds, name)).fetchone()
                ev = (None, None)
        lo = [v for v in (row[0], ev[0]) if v is not None]
        hi = [v for v in (row[1], ev[1]) if v is not None]
        return (min(lo), max(hi)) if lo else None

    def query(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        *,
        start: float | None = None,
        end: float | None = None,
        max_points: int | None = None,
        resolution: Resolution | None = None,
    ) -> list[SeriesData]:
        """Samples of every series named `name` whose labels include `labels`, in [start, end].

        With `max_points`, the answer is downsampled on the server to at most that many buckets
        per series, read from the coarsest roll-up that still gives that many points.
        """
        out = []
        for key in self.series(name, labels):
            sid = self._id_of(key)
            if sid is None:
                continue
            out.append(self._query_one(key, sid, start, end, max_points, resolution))
        return out

    def _query_one(
        self,
        key: SeriesKey,
        sid: int,
        start: float | None,
        end: float | None,
        max_points: int | None,
        resolution: Resolution | None,
    ) -> SeriesData:
        lo = -math.inf if start is None else start
        hi = math.inf if end is None else end
        if max_points:
            # Bucket over the span the series' samples cover within the window: an open end means
            # "all of it" (max_points was ignored, and every raw sample came back), and a window
            # wider than the data (--since 15m over 99 s) must not fold it all into one wide bucket.
            with self._guard("read") as conn:
                first, last = conn.execute(
                    "SELECT min(t), max(t) FROM samples WHERE series_id = ? AND t >= ? AND t <= ?", (sid, lo, hi)
                ).fetchone()
            if first is not None:
                lo, hi = max(lo, float(first)), min(hi, float(last))
        if resolution is None:
            resolution = "raw"
            if max_points and math.isfinite(lo) and math.isfinite(hi):
                span = hi - lo
                # A roll-up is used when it still gives at least two buckets per requested point.
                if span / 3600 >= 2 * max_points:
                    resolution = "1h"
                elif span / 60 >= 2 * max_points:
                    resolution = "1m"
        bucket: float | None = None
        with self._guard("read") as conn:
            if resolution == "raw":
                if max_points and math.isfinite(lo) and math.isfinite(hi) and hi > lo:
                    step = bucket = (hi - lo) / max_points
                    # min(..., max_points - 1) keeps a sample at exactly `end` in the last bucket
                    rows = conn.execute(
                        "SELECT min(t), avg(value), min(value), max(value), count(*) FROM samples "
                        "WHERE series_id = ? AND t >= ? AND t <= ? GROUP BY min(CAST((t - ?) / ? AS INTEGER), ?) ORDER BY 1",
                        (sid, lo, hi, lo, step, max_points - 1),
                    ).fetchall()
                else:
                    rows = conn.execute(
                        "SELECT t, value, value, value, 1 FROM samples WHERE series_id = ? AND t >= ? AND t <= ? ORDER BY t",
                        (sid, lo, hi),
                    ).fetchall()
            else:
                table = "rollup_1h" if resolution == "1h" else "rollup_1m"
                width = ROLLUPS[table]
                blo = math.floor(lo / width) * width if math.isfinite(lo) else lo
                bucket = float(width)
                if max_points and math.isfinite(lo) and math.isfinite(hi) and hi > lo:
                    step = (hi - blo) / max_points
                    bucket = max(step, float(width))
                    rows = conn.execute(
                        f"SELECT min(bucket), sum(vsum) / sum(n), min(vmin), max(vmax), sum(n) FROM {table} "
                        "WHERE series_id = ? AND bucket >= ? AND bucket <= ? "
                        "GROUP BY min(CAST((bucket - ?) / ? AS INTEGER), ?) ORDER BY 1",
                        (sid, blo, hi, blo, step, max_points - 1),
                    ).fetchall()
                else:
                    rows = conn.execute(
                        f"SELECT bucket, vsum / n, vmin, vmax, n FROM {table} "
                        "WHERE series_id = ? AND bucket >= ? AND bucket <= ? ORDER BY bucket",
                        (sid, blo, hi),
                    ).fetchall()
        return SeriesData(
            key=key,
            resolution=resolution,
            t=[r[0] for r in rows],
            value=[r[1] for r in rows],
            value_min=[r[2] for r in rows],
            value_max=[r[3] for r in rows],
            count=[r[4] for r in rows],
            bucket_seconds=bucket,
        )

    def latest(self, name: str, labels: Mapping[str, str] | None = None) -> list[LatestValue]:
        """The most recent sample of each matching series."""
        out = []
        for key in self.series(name, labels):
            sid = self._id_of(key)
            with self._guard("read") as conn:
                row = conn.execute(
                    "SELECT t, value FROM samples WHERE series_id = ? ORDER BY t DESC LIMIT 1", (sid,)
                ).fetchone()
            if row:
                out.append(LatestValue(key, row[0], row[1]))
        return out

    def samples_after(
        self, names: Iterable[str], cursor: int = 0, *, limit: int = 100_000
    ) -> tuple[list[tuple[SeriesKey, float, float]], int]:
        """Samples of the series named `names` committed after `cursor` (a position returned by the
        previous call; 0 for everything kept), in commit order, with the new cursor. Follows writes
        made by other processes, whatever their timestamps (a monitor commits steps that ended
        seconds ago), which a time watermark would miss."""
        names = list(names)
        if not names:
            return [], cursor
        with self._lock:
            ids = self._conn.execute(
                f"SELECT id, name, labels FROM series WHERE name IN ({','.join('?' * len(names))})", names
            ).fetchall()
            if not ids:
                return [], cursor
            keys = {sid: SeriesKey(n, json.loads(lj)) for sid, n, lj in ids}
            rows = self._conn.execute(
                f"SELECT rowid, series_id, t, value FROM samples WHERE rowid > ? AND series_id IN ({','.join('?' * len(keys))})"
                " ORDER BY rowid LIMIT ?",
                (cursor, *keys, limit),
            ).fetchall()
        if not rows:
            return [], cursor
        return [(keys[sid], t, v) for _, sid, t, v in rows], rows[-1][0]

    def last_sample_position(self) -> int:
        """The cursor of the newest committed sample (see `samples_after`)."""
        with self._lock:
            row = self._conn.execute("SELECT max(rowid) FROM samples").fetchone()
        return int(row[0] or 0)

    def events(
        self,
        kind: str | None = None,
        *,
        start: float | None = None,
        end: float | None = None,
        labels: Mapping[str, str] | None = None,
        limit: int | None = None,
        include_start: bool = True,
    ) -> list[Event]:
        """Events of `kind` (all kinds if None) in [start, end] ((start, end] without
        `include_start`), oldest first."""
        sql = f"SELECT id, t, kind, labels, data FROM events WHERE t {'>=' if include_start else '>'} ? AND t <= ?"
        args: list[Any] = [-math.inf if start is None else start, math.inf if end is None else end]
        if kind is not None:
            sql += " AND kind = ?"
            args.append(kind)
        sql += " ORDER BY t, id"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        with self._guard("read") as conn:
            rows = conn.execute(sql, args).fetchall()
        return with_labels([Event(r[0], r[1], r[2], json.loads(r[3]), json.loads(r[4])) for r in rows], labels)

    def event_labels_after(self, kind: str, start: float, end: float, *, after_id: int, after_t: float) -> list[tuple[int, float, dict[str, str]]]:
        """(id, t, labels) of the events of `kind` in (start, end] that are new to a reader who read
        up to the event `after_id` and the time `after_t` before: committed since (a higher id), or
        timed after `after_t`. Oldest first. For the alert evaluator's kept event windows."""
        with self._guard("read") as conn:
            rows = conn.execute("SELECT id, t, labels FROM events WHERE kind = ? AND t > ? AND t <= ? AND (id > ? OR t > ?) "
                                "ORDER BY t, id", (kind, start, end, after_id, after_t)).fetchall()
        return [(int(r[0]), float(r[1]), json.loads(r[2])) for r in rows]

    def event_kinds(self) -> list[str]:
        with self._guard("read") as conn:
            return [r[0] for r in conn.execute("SELECT DISTINCT kind FROM events ORDER BY kind")]

    # ---------------------------------------------------------------- typed queries by series id
    # For readers that cache series ids (the alert evaluator, the dashboard): one indexed lookup each.
    def series_since(self, after_id: int = 0) -> list[StoredSeries]:
        """Series created after id `after_id` (all with 0), oldest first."""
        with self._guard("read") as conn:
            rows = conn.execute("SELECT id, name, labels FROM series WHERE id > ? ORDER BY id", (after_id,)).fetchall()
        return [StoredSeries(sid, name, json.loads(lj)) for sid, name, lj in rows]

    def change_token(self) -> tuple[int, int]:
        """A value that differs whenever something may have been committed since it was last read: by
        another connection (SQLite's `PRAGMA data_version`) or by this one (rows it changed). Equal
        tokens: the stored content is the same, so a reader may keep what it read."""
        with self._lock:
            try:
                return self._conn.execute("PRAGMA data_version").fetchone()[0], self._conn.total_changes
            except sqlite3.Error as e:
                raise storage_error(e, self.path, "read", ACCESS_HINT) from None

    def max_series_id(self) -> int:
        return self._read("SELECT coalesce(max(id), 0) FROM series")[0][0]

    def stored_series(self, name: str) -> list[StoredSeries]:
        """Every series named `name`, with its id."""
        with self._guard("read") as conn:
            rows = conn.execute("SELECT id, labels FROM series WHERE name = ? ORDER BY id", (name,)).fetchall()
        return [StoredSeries(sid, name, json.loads(lj)) for sid, lj in rows]

    def label_sets(self) -> list[dict[str, str]]:
        """The distinct label sets of all series."""
        with self._guard("read") as conn:
            rows = conn.execute("SELECT DISTINCT labels FROM series").fetchall()
        return [json.loads(r[0]) for r in rows]

    def label_values(self, label: str) -> list[str]:
        """The values a label takes across all series, sorted."""
        return sorted({ls[label] for ls in self.label_sets() if label in ls})

    def last_value(self, series_id: int, t: float, lookback_seconds: float) -> float | None:
        """The newest value in (t - lookback, t]."""
        rows = self._read("SELECT value FROM samples WHERE series_id = ? AND t <= ? AND t > ? ORDER BY t DESC LIMIT 1",
                          (series_id, t, t - lookback_seconds))
        return rows[0][0] if rows else None

    def value_at_or_before(self, series_id: int, t: float) -> float | None:
        """The newest value at or before t, however old."""
        rows = self._read("SELECT value FROM samples WHERE series_id = ? AND t <= ? ORDER BY t DESC LIMIT 1", (series_id, t))
        return rows[0][0] if rows else None

    def window(self, series_ids: int | Sequence[int], start: float, end: float, *, include_start: bool = False) -> list[Sample]:
        """Samples of one series (or several, merged) in (start, end] ([start, end] with
        `include_start`), oldest first."""
        ids = [series_ids] if isinstance(series_ids, int) else list(series_ids)
        if not ids:
            return []
        op = ">=" if include_start else ">"
        where = "series_id = ?" if len(ids) == 1 else f"series_id IN ({','.join('?' * len(ids))})"
        with self._guard("read") as conn:
            rows = conn.execute(
                f"SELECT t, value FROM samples WHERE {where} AND t {op} ? AND t <= ? ORDER BY t", (*ids, start, end)
            ).fetchall()
        return [Sample(t, v) for t, v in rows]

    def window_after(self, series_id: int, start: float, end: float, after_position: int) -> tuple[list[Sample], int]:
        """Samples of one series in (start, end] committed after `after_position` (a rowid this
        method returned before; 0 for all), oldest first, with the newest position seen. For
        readers that keep a window and read only what is new each time (the alert evaluator)."""
        rows = self._read(
            "SELECT rowid, t, value FROM samples WHERE series_id = ? AND t > ? AND t <= ? AND rowid > ? ORDER BY t, rowid",
            (series_id, start, end, after_position),
        )
        newest = max((r[0] for r in rows), default=after_position)
        return [Sample(t, v) for _, t, v in rows], max(newest, after_position)

    def window_columns(self, series_ids: Sequence[int], start: float, end: float) -> SampleColumns:
        """Samples of the series, merged, in [start, end], oldest first, as two columns (cheap to
        turn into arrays: no object per sample)."""
        if not series_ids:
            return SampleColumns([], [])
        marks = ",".join("?" * len(series_ids))
        with self._guard("read") as conn:
            rows = conn.execute(
                f"SELECT t, value FROM samples WHERE series_id IN ({marks}) AND t >= ? AND t <= ? ORDER BY t",
                (*series_ids, start, end),
            ).fetchall()
        if not rows:
            return SampleColumns([], [])
        t, v = zip(*rows, strict=True)
        return SampleColumns(list(t), list(v))

    def has_samples(self, series_ids: Sequence[int], start: float, end: float) -> bool:
        """Whether any of the series has a sample in [start, end]."""
        if not series_ids:
            return False
        marks = ",".join("?" * len(series_ids))
        with self._guard("read") as conn:
            row = conn.execute(
                f"SELECT 1 FROM samples WHERE series_id IN ({marks}) AND t >= ? AND t <= ? LIMIT 1",
                (*series_ids, start, end),
            ).fetchone()
        return row is not None

    def summary(
        self, series_ids: Sequence[int], start: float, end: float, *, rollup_over_seconds: float = 2 * 3600
    ) -> SampleSummary:
        """Count, sum, min and max of the series' samples in [start, end], in SQLite. A window longer
        than `rollup_over_seconds` reads its full minutes from the 1-minute roll-up (exact: it keeps
        n, sum, min, max) and only its two partial edges from raw samples."""
        if not series_ids:
            return SampleSummary(0, 0.0, None, None)
        marks = ",".join("?" * len(series_ids))
        parts = []
        with self._guard("read") as conn:
            if end - start > rollup_over_seconds:
                a, b = math.ceil(start / 60) * 60, math.floor(end / 60) * 60
                parts.append(conn.execute(
                    f"SELECT sum(n), sum(vsum), min(vmin), max(vmax) FROM rollup_1m WHERE series_id IN ({marks}) "
                    "AND bucket >= ? AND bucket < ?",
                    (*series_ids, a, b),
                ).fetchone())
                # Two range scans, not one OR (which SQLite cannot serve from the (series_id, t) index).
                for lo, hi, op in ((start, a, "<"), (b, end, "<=")):
                    parts.append(conn.execute(
                        f"SELECT count(*), sum(value), min(value), max(value) FROM samples WHERE series_id IN ({marks}) "
                        f"AND t >= ? AND t {op} ?",
                        (*series_ids, lo, hi),
                    ).fetchone())
            else:
                parts.append(conn.execute(
                    f"SELECT count(*), sum(value), min(value), max(value) FROM samples WHERE series_id IN ({marks}) "
                    "AND t >= ? AND t <= ?",
                    (*series_ids, start, end),
                ).fetchone())
        mins = [p[2] for p in parts if p[2] is not None]
        maxs = [p[3] for p in parts if p[3] is not None]
        return SampleSummary(
            sum(p[0] or 0 for p in parts), sum(p[1] or 0.0 for p in parts),
            min(mins) if mins else None, max(maxs) if maxs else None,
        )

    def has_table(self, name: str) -> bool:
        """Whether the file holds table `name` (a store opened read-only is never migrated up
        from an empty file, so readers check before reading a feature's table)."""
        with self._guard("read") as conn:
            row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone()
        return row is not None

    def first_sample_time(self, series_id: int) -> float | None:
        with self._guard("read") as conn:
            return conn.execute("SELECT min(t) FROM samples WHERE series_id = ?", (series_id,)).fetchone()[0]

    def count_samples(self, series_id: int, start: float, end: float) -> int:
        """Samples of one series in [start, end]."""
        with self._guard("read") as conn:
            return conn.execute(
                "SELECT count(*) FROM samples WHERE series_id = ? AND t >= ? AND t <= ?", (series_id, start, end)
            ).fetchone()[0]

    def data_version(self) -> DataVersion:
        """Changes whenever samples or events are added: a cache key for derived results."""
        with self._guard("read") as conn:
            ev = conn.execute("SELECT max(id) FROM events").fetchone()[0]
            sm = conn.execute("SELECT max(rowid) FROM samples").fetchone()[0]
        return DataVersion(ev or 0, sm or 0)

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
