"""The store: the hub every source writes to and every consumer reads from.

SQLite in WAL mode: one file, crash-safe, readable by several processes while one writes.
Writes are buffered and committed in batches; each commit also folds the batch into 1-minute and
1-hour roll-ups (min/max/sum/count), so a week-long chart reads a few thousand rows, not millions.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gpulens.errors import StoreError
from gpulens.store.schema import CORE_SCHEMA, ROLLUP_UPSERT, ROLLUPS, SCHEMA_VERSION
from gpulens.store.types import Event, LatestValue, Resolution, SeriesData, SeriesKey, canonical_labels

log = logging.getLogger(__name__)

DEFAULT_STORE_PATH = Path(".gpulens") / "gpulens.db"

# Retention defaults: raw samples cover the default 7-day baseline window with a day to spare.
DEFAULT_RETENTION_SECONDS: dict[str, float] = {
    "raw": 8 * 86400,
    "rollup_1m": 90 * 86400,
    "rollup_1h": 2 * 365 * 86400,
    "events": 90 * 86400,
}


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
    ):
        self.path = Path(path)
        self.batch_size = batch_size
        self.readonly = readonly
        self._lock = threading.RLock()
        self._pending: list[tuple[int, float, float]] = []
        self._pending_events: list[tuple[float, str, str, str]] = []
        self._series_ids: dict[tuple[str, str], int] = {}
        self._labels_cache: dict[tuple[tuple[str, str], ...], str] = {}
        self._conn = self._connect(busy_timeout_seconds)

    # ---------------------------------------------------------------- opening
    def _connect(self, busy_timeout_seconds: float) -> sqlite3.Connection:
        if self.readonly and not self.path.exists():
            raise StoreError(
                f"There is no store at {self.path}.",
                hint="Point --store at a file that `gpulens agent` or `gpulens replay` wrote.",
            )
        if not self.readonly:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StoreError(
                    f"Cannot create the folder for the store {self.path}: {e.strerror}.",
                    hint="Choose a --store path in a folder you can write to.",
                ) from None
        # Several processes may create the same new store at once (the ranks of one job): switching
        # to WAL and creating the schema can then answer "locked" without waiting, so retry it all.
        deadline = time.monotonic() + busy_timeout_seconds
        while True:
            conn = None
            try:
                conn = sqlite3.connect(self.path, timeout=busy_timeout_seconds, check_same_thread=False, isolation_level=None)
                conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_seconds * 1000)}")
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                if not self.readonly:
                    conn.executescript(CORE_SCHEMA)
                    conn.execute(
                        "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                    )
                conn.execute("CREATE TEMP TABLE IF NOT EXISTS batch (series_id INTEGER, t REAL, value REAL)")
                return conn
            except sqlite3.OperationalError as e:
                if conn is not None:
                    conn.close()
                if ("locked" in str(e) or "busy" in str(e)) and time.monotonic() < deadline:
                    time.sleep(0.02)
                    continue
                raise StoreError(
                    f"Cannot open the store {self.path}: {e}.",
                    hint="Check that the path is writable and is a gpulens store (an SQLite file), or choose another --store.",
                ) from None
            except sqlite3.DatabaseError as e:
                if conn is not None:
                    conn.close()
                raise StoreError(
                    f"Cannot open the store {self.path}: {e}.",
                    hint="Check that the path is writable and is a gpulens store (an SQLite file), or choose another --store.",
                ) from None

    def ensure_schema(self, sql: str) -> None:
        """Create a feature's own tables (idempotent SQL: CREATE ... IF NOT EXISTS)."""
        with self._lock:
            self._conn.executescript(sql)

    @property
    def connection(self) -> sqlite3.Connection:
        """The raw connection, for features that own their tables. Hold `lock` while using it."""
        return self._conn

    @property
    def lock(self) -> threading.RLock:
        return self._lock

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
        with self._lock:
            self._conn.execute("INSERT OR IGNORE INTO series (name, labels) VALUES (?, ?)", key)
            sid = self._conn.execute("SELECT id FROM series WHERE name = ? AND labels = ?", key).fetchone()[0]
        self._series_ids[key] = sid
        return sid

    def write_id(self, series_id: int, t: float, value: float) -> None:
        """Buffer one sample of a known series. NaN is not stored: a missing value is no sample."""
        if value != value:  # NaN
            return
        self._pending.append((series_id, t, value))
        if len(self._pending) >= self.batch_size:
            self.flush()

    def write(self, name: str, labels: Mapping[str, str] | None, t: float, value: float | None) -> None:
        """Buffer one sample. None means "not available" and is skipped."""
        if value is None:
            return
        self.write_id(self.series_id(name, labels), t, float(value))

    def write_many(self, rows: Iterable[tuple[int, float, float]]) -> None:
        """Buffer many (series_id, t, value) rows at once: the fast path for bulk imports."""
        with self._lock:
            self._pending.extend(r for r in rows if r[2] == r[2])
            if len(self._pending) >= self.batch_size:
                self.flush()

    def event(
        self, kind: str, t: float, labels: Mapping[str, str] | None = None, data: Mapping[str, Any] | None = None
    ) -> None:
        """Buffer one event (an XID, a training step, a request, an alert, a phase marker...)."""
        self._pending_events.append((t, kind, self._labels_json(labels), json.dumps(data or {}, default=_json_default)))
        if len(self._pending_events) >= self.batch_size:
            self.flush()

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

    @property
    def pending_count(self) -> int:
        return len(self._pending) + len(self._pending_events)

    def flush(self) -> int:
        """Commit everything buffered, roll-ups included, in one transaction. Returns rows written."""
        with self._lock:
            if not self._pending and not self._pending_events:
                return 0
            rows, self._pending = self._pending, []
            events, self._pending_events = self._pending_events, []
            conn = self._conn
            try:
                conn.execute("BEGIN IMMEDIATE")
                if rows:
                    conn.execute("DELETE FROM temp.batch")
                    conn.executemany("INSERT INTO temp.batch VALUES (?, ?, ?)", rows)
                    conn.execute("INSERT INTO samples (series_id, t, value) SELECT series_id, t, value FROM temp.batch")
                    for table, width in ROLLUPS.items():
                        conn.execute(ROLLUP_UPSERT.format(table=table, width=width))
                if events:
                    conn.executemany("INSERT INTO events (t, kind, labels, data) VALUES (?, ?, ?, ?)", events)
                conn.execute("COMMIT")
            except sqlite3.Error as e:
                conn.execute("ROLLBACK") if conn.in_transaction else None
                # Keep the data for the next try rather than losing it.
                self._pending[:0] = rows
                self._pending_events[:0] = events
                raise StoreError(f"Cannot write to the store {self.path}: {e}.", hint="Check disk space and permissions.") from None
            return len(rows) + len(events)

    # ---------------------------------------------------------------- meta
    def get_meta(self, key: str) -> str | None:
        with self._lock:
            row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        with self._lock:
            self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    # ---------------------------------------------------------------- reading
    def series(self, name: str | None = None, labels: Mapping[str, str] | None = None) -> list[SeriesKey]:
        """Series whose name is `name` (all if None) and whose labels include `labels`."""
        with self._lock:
            if name is None:
                rows = self._conn.execute("SELECT name, labels FROM series ORDER BY name, labels").fetchall()
            else:
                rows = self._conn.execute(
                    "SELECT name, labels FROM series WHERE name = ? ORDER BY labels", (name,)
                ).fetchall()
        keys = [SeriesKey(n, json.loads(lj)) for n, lj in rows]
        if labels:
            want = {k: str(v) for k, v in labels.items()}
            keys = [k for k in keys if all(k.labels.get(a) == b for a, b in want.items())]
        return keys

    def metric_names(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._conn.execute("SELECT DISTINCT name FROM series ORDER BY name")]

    def _id_of(self, key: SeriesKey) -> int | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT id FROM series WHERE name = ? AND labels = ?", (key.name, key.labels_json)
            ).fetchone()
        return row[0] if row else None

    def time_range(self, name: str | None = None) -> tuple[float, float] | None:
        """First and last sample time (of metric `name`, or of everything, events included).
        Read per series through the (series_id, t) index, so a week of samples answers at once."""
        per_series = (
            "SELECT min(lo), max(hi) FROM (SELECT (SELECT min(t) FROM samples WHERE series_id = s.id) AS lo, "
            "(SELECT max(t) FROM samples WHERE series_id = s.id) AS hi FROM series s{where})"
        )
        with self._lock:
            if name is None:
                row = self._conn.execute(per_series.format(where="")).fetchone()
                ev = self._conn.execute("SELECT min(t), max(t) FROM events").fetchone()
            else:
                row = self._conn.execute(per_series.format(where=" WHERE s.name = ?"), (name,)).fetchone()
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
        if resolution is None:
            resolution = "raw"
            if max_points and math.isfinite(lo) and math.isfinite(hi):
                span = hi - lo
                # A roll-up is used when it still gives at least two buckets per requested point.
                if span / 3600 >= 2 * max_points:
                    resolution = "1h"
                elif span / 60 >= 2 * max_points:
                    resolution = "1m"
        with self._lock:
            if resolution == "raw":
                if max_points and math.isfinite(lo) and math.isfinite(hi) and hi > lo:
                    step = (hi - lo) / max_points
                    # min(..., max_points - 1) keeps a sample at exactly `end` in the last bucket
                    rows = self._conn.execute(
                        "SELECT min(t), avg(value), min(value), max(value), count(*) FROM samples "
                        "WHERE series_id = ? AND t >= ? AND t <= ? GROUP BY min(CAST((t - ?) / ? AS INTEGER), ?) ORDER BY 1",
                        (sid, lo, hi, lo, step, max_points - 1),
                    ).fetchall()
                else:
                    rows = self._conn.execute(
                        "SELECT t, value, value, value, 1 FROM samples WHERE series_id = ? AND t >= ? AND t <= ? ORDER BY t",
                        (sid, lo, hi),
                    ).fetchall()
            else:
                table = "rollup_1h" if resolution == "1h" else "rollup_1m"
                width = ROLLUPS[table]
                blo = math.floor(lo / width) * width if math.isfinite(lo) else lo
                if max_points and math.isfinite(lo) and math.isfinite(hi) and hi > lo:
                    step = (hi - blo) / max_points
                    rows = self._conn.execute(
                        f"SELECT min(bucket), sum(vsum) / sum(n), min(vmin), max(vmax), sum(n) FROM {table} "
                        "WHERE series_id = ? AND bucket >= ? AND bucket <= ? "
                        "GROUP BY min(CAST((bucket - ?) / ? AS INTEGER), ?) ORDER BY 1",
                        (sid, blo, hi, blo, step, max_points - 1),
                    ).fetchall()
                else:
                    rows = self._conn.execute(
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
        )

    def latest(self, name: str, labels: Mapping[str, str] | None = None) -> list[LatestValue]:
        """The most recent sample of each matching series."""
        out = []
        for key in self.series(name, labels):
            sid = self._id_of(key)
            with self._lock:
                row = self._conn.execute(
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
    ) -> list[Event]:
        """Events of `kind` (all kinds if None) in [start, end], oldest first."""
        sql = "SELECT id, t, kind, labels, data FROM events WHERE t >= ? AND t <= ?"
        args: list[Any] = [-math.inf if start is None else start, math.inf if end is None else end]
        if kind is not None:
            sql += " AND kind = ?"
            args.append(kind)
        sql += " ORDER BY t, id"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        with self._lock:
            rows = self._conn.execute(sql, args).fetchall()
        out = [Event(r[0], r[1], r[2], json.loads(r[3]), json.loads(r[4])) for r in rows]
        if labels:
            want = {k: str(v) for k, v in labels.items()}
            out = [e for e in out if all(e.labels.get(a) == b for a, b in want.items())]
        return out

    def event_kinds(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self._conn.execute("SELECT DISTINCT kind FROM events ORDER BY kind")]

    # ---------------------------------------------------------------- retention
    def apply_retention(self, now: float | None = None, retention_seconds: Mapping[str, float] | None = None) -> int:
        """Delete data older than its retention. Returns the number of rows deleted."""
        now = time.time() if now is None else now
        keep = {**DEFAULT_RETENTION_SECONDS, **(retention_seconds or {})}
        deleted = 0
        with self._lock:
            self.flush()
            self._conn.execute("BEGIN IMMEDIATE")
            deleted += self._conn.execute("DELETE FROM samples WHERE t < ?", (now - keep["raw"],)).rowcount
            for table in ROLLUPS:
                deleted += self._conn.execute(f"DELETE FROM {table} WHERE bucket < ?", (now - keep[table],)).rowcount
            deleted += self._conn.execute("DELETE FROM events WHERE t < ?", (now - keep["events"],)).rowcount
            self._conn.execute("COMMIT")
        return deleted


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    if isinstance(o, set | frozenset | tuple):
        return list(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")
