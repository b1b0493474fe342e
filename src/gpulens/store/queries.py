"""The store's read side: typed questions by name and labels, and by series id for the readers
that cache ids (the alert rules, the panels). A mixin of `Store`, which owns the connection, its
lock and `_guard` / `_read`; every query here runs under them."""

from __future__ import annotations

import math
import sqlite3
import threading
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from gpulens.store.connect import ACCESS_HINT, storage_error
from gpulens.store.decode import SANE_ROLLUP, SANE_TIME, SANE_VALUE, json_column, label_decoder
from gpulens.store.schema import ROLLUPS
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
    with_labels,
)
from gpulens.units import MAX_TIME_SECONDS, MIN_TIME_SECONDS


class StoreQueries:
    """Read-only queries over the samples, roll-ups and events tables."""

    # provided by Store
    path: Path
    _conn: sqlite3.Connection
    _lock: threading.RLock

    def _guard(self, action: str) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        raise NotImplementedError

    def series(self, name: str | None = None, labels: Mapping[str, str] | None = None) -> list[SeriesKey]:
        """Series whose name is `name` (all if None) and whose labels include `labels`."""
        with self._guard("read") as conn:
            if name is None:
                rows = conn.execute("SELECT id, name, labels FROM series ORDER BY name, labels").fetchall()
            else:
                rows = conn.execute(
                    "SELECT id, name, labels FROM series WHERE name = ? ORDER BY labels", (name,)
                ).fetchall()
        decode = label_decoder(self.path, "series")
        return with_labels([SeriesKey(n, decode(lj, sid)) for sid, n, lj in rows], labels)

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
                        f"WHERE series_id = ? AND t >= ? AND t <= ? AND {SANE_VALUE} "
                        "GROUP BY min(CAST((t - ?) / ? AS INTEGER), ?) ORDER BY 1",
                        (sid, lo, hi, lo, step, max_points - 1),
                    ).fetchall()
                else:
                    rows = conn.execute(
                        f"SELECT t, value, value, value, 1 FROM samples WHERE series_id = ? AND t >= ? AND t <= ? AND {SANE_VALUE} "
                        "ORDER BY t",
                        (sid, lo, hi),
                    ).fetchall()
            else:
                table = "rollup_1h" if resolution == "1h" else "rollup_1m"
                width = ROLLUPS[table]
                # A float: math.floor's int of a far-off window start (1e20 s) overflows SQLite's INTEGER.
                blo = float(math.floor(lo / width) * width) if math.isfinite(lo) else lo
                bucket = float(width)
                if max_points and math.isfinite(lo) and math.isfinite(hi) and hi > lo:
                    step = (hi - blo) / max_points
                    bucket = max(step, float(width))
                    rows = conn.execute(
                        f"SELECT min(bucket), sum(vsum) / sum(n), min(vmin), max(vmax), sum(n) FROM {table} "
                        f"WHERE series_id = ? AND bucket >= ? AND bucket <= ? AND {SANE_ROLLUP} "
                        "GROUP BY min(CAST((bucket - ?) / ? AS INTEGER), ?) ORDER BY 1",
                        (sid, blo, hi, blo, step, max_points - 1),
                    ).fetchall()
                else:
                    rows = conn.execute(
                        f"SELECT bucket, vsum / n, vmin, vmax, n FROM {table} "
                        f"WHERE series_id = ? AND bucket >= ? AND bucket <= ? AND {SANE_ROLLUP} ORDER BY bucket",
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
                    f"SELECT t, value FROM samples WHERE series_id = ? AND {SANE_TIME} AND {SANE_VALUE} ORDER BY t DESC LIMIT 1",
                    (sid,),
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
            decode = label_decoder(self.path, "series")
            keys = {sid: SeriesKey(n, decode(lj, sid)) for sid, n, lj in ids}
            rows = self._conn.execute(
                f"SELECT rowid, series_id, t, value FROM samples WHERE rowid > ? AND series_id IN ({','.join('?' * len(keys))}) "
                f"AND {SANE_TIME} AND {SANE_VALUE}"
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
        path, decode = self.path, label_decoder(self.path, "events")
        return with_labels([Event(r[0], r[1], r[2], decode(r[3], r[0]), json_column(r[4], path, "events", r[0], "data"))
                            for r in rows], labels)

    def event_labels_after(self, kind: str, start: float, end: float, *, after_id: int, after_t: float) -> list[tuple[int, float, dict[str, str]]]:
        """(id, t, labels) of the events of `kind` in (start, end] that are new to a reader who read
        up to the event `after_id` and the time `after_t` before: committed since (a higher id), or
        timed after `after_t`. Oldest first. For the alert evaluator's kept event windows."""
        with self._guard("read") as conn:
            rows = conn.execute("SELECT id, t, labels FROM events WHERE kind = ? AND t > ? AND t <= ? AND (id > ? OR t > ?) "
                                "ORDER BY t, id", (kind, start, end, after_id, after_t)).fetchall()
        decode = label_decoder(self.path, "events")
        return [(int(r[0]), float(r[1]), decode(r[2], r[0])) for r in rows]

    def event_kinds(self) -> list[str]:
        with self._guard("read") as conn:
            return [r[0] for r in conn.execute("SELECT DISTINCT kind FROM events ORDER BY kind")]

    # ---------------------------------------------------------------- typed queries by series id
    # For readers that cache series ids (the alert evaluator, the dashboard): one indexed lookup each.
    def series_since(self, after_id: int = 0) -> list[StoredSeries]:
        """Series created after id `after_id` (all with 0), oldest first."""
        with self._guard("read") as conn:
            rows = conn.execute("SELECT id, name, labels FROM series WHERE id > ? ORDER BY id", (after_id,)).fetchall()
        decode = label_decoder(self.path, "series")
        return [StoredSeries(sid, name, decode(lj, sid)) for sid, name, lj in rows]

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
        decode = label_decoder(self.path, "series")
        return [StoredSeries(sid, name, decode(lj, sid)) for sid, lj in rows]

    def label_sets(self) -> list[dict[str, str]]:
        """The distinct label sets of all series."""
        with self._guard("read") as conn:
            rows = conn.execute("SELECT min(id), labels FROM series GROUP BY labels").fetchall()
        decode = label_decoder(self.path, "series")
        return [decode(lj, sid) for sid, lj in rows]

    def label_values(self, label: str) -> list[str]:
        """The values a label takes across all series, sorted."""
        return sorted({ls[label] for ls in self.label_sets() if label in ls})

    def last_value(self, series_id: int, t: float, lookback_seconds: float) -> float | None:
        """The newest value in (t - lookback, t]."""
        rows = self._read(f"SELECT value FROM samples WHERE series_id = ? AND t <= ? AND t > ? AND {SANE_VALUE} "
                          "ORDER BY t DESC LIMIT 1",
                          (series_id, t, t - lookback_seconds))
        return rows[0][0] if rows else None

    def value_at_or_before(self, series_id: int, t: float) -> float | None:
        """The newest value at or before t, however old."""
        rows = self._read(f"SELECT value FROM samples WHERE series_id = ? AND t <= ? AND {SANE_VALUE} ORDER BY t DESC LIMIT 1",
                          (series_id, t))
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
                f"SELECT t, value FROM samples WHERE {where} AND t {op} ? AND t <= ? AND {SANE_VALUE} ORDER BY t", (*ids, start, end)
            ).fetchall()
        return [Sample(t, v) for t, v in rows]

    def window_after(self, series_id: int, start: float, end: float, after_position: int) -> tuple[list[Sample], int]:
        """Samples of one series in (start, end] committed after `after_position` (a rowid this
        method returned before; 0 for all), oldest first, with the newest position seen. For
        readers that keep a window and read only what is new each time (the alert evaluator)."""
        rows = self._read(
            f"SELECT rowid, t, value FROM samples WHERE series_id = ? AND t > ? AND t <= ? AND rowid > ? AND {SANE_VALUE} "
            "ORDER BY t, rowid",
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
                f"SELECT t, value FROM samples WHERE series_id IN ({marks}) AND t >= ? AND t <= ? AND {SANE_VALUE} ORDER BY t",
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
                f"SELECT 1 FROM samples WHERE series_id IN ({marks}) AND t >= ? AND t <= ? AND {SANE_VALUE} LIMIT 1",
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
                a, b = float(math.ceil(start / 60) * 60), float(math.floor(end / 60) * 60)  # floats: see _query_one
                parts.append(conn.execute(
                    f"SELECT sum(n), sum(vsum), min(vmin), max(vmax) FROM rollup_1m WHERE series_id IN ({marks}) "
                    f"AND bucket >= ? AND bucket < ? AND {SANE_ROLLUP}",
                    (*series_ids, a, b),
                ).fetchone())
                # Two range scans, not one OR (which SQLite cannot serve from the (series_id, t) index).
                for lo, hi, op in ((start, a, "<"), (b, end, "<=")):
                    parts.append(conn.execute(
                        f"SELECT count(*), sum(value), min(value), max(value) FROM samples WHERE series_id IN ({marks}) "
                        f"AND t >= ? AND t {op} ? AND {SANE_VALUE}",
                        (*series_ids, lo, hi),
                    ).fetchone())
            else:
                parts.append(conn.execute(
                    f"SELECT count(*), sum(value), min(value), max(value) FROM samples WHERE series_id IN ({marks}) "
                    f"AND t >= ? AND t <= ? AND {SANE_VALUE}",
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
