"""Where the dashboard's numbers come from: a Reader answers the few questions a panel asks.

`StoreReader` reads a local gpulens store; `PrometheusReader` (gpulens.views.prometheus) asks a
Prometheus server's HTTP API the same questions, so one dashboard serves a node or a fleet.
All times are unix seconds; every answer is a typed value, never a raw row.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import numpy as np

from gpulens.store import Store
from gpulens.views.answers import AlertRow, Band, EventRow, Line
from gpulens.views.panels import selection_label

StatAggName = str  # "count" | "mean" | "max" | "min" | "p50" | "p95" | "p99" | "sum"
QUANTILE_OF_AGG = {"p50": 0.50, "p95": 0.95, "p99": 0.99}
# A quantile needs this many samples per time bucket to mean something.
SAMPLES_PER_QUANTILE_BUCKET = 10
# Above this window length, sums and extremes read the 1-minute roll-up (exact: it keeps n, sum, min, max).
LONG_WINDOW_SECONDS = 2 * 3600


class Reader(Protocol):
    kind: str  # "store" or "prometheus"
    description: str
    supports_events: bool  # XID events, cold starts... (Prometheus keeps only counters)

    def data_range(self) -> tuple[float, float] | None: ...
    def label_values(self) -> dict[str, list[str]]: ...
    def has_data(self, metric: str, match: Mapping[str, str], start: float, end: float) -> bool: ...
    def line(self, metric: str, match: Mapping[str, str], start: float, end: float, points: int) -> list[Line]: ...
    def quantile(self, metric: str, match: Mapping[str, str], q: float, start: float, end: float, points: int) -> list[Line]: ...
    def rate(self, metric: str, match: Mapping[str, str], start: float, end: float, points: int) -> list[Line]: ...
    def events_per_second(self, metric: str, match: Mapping[str, str], start: float, end: float, points: int) -> list[Line]: ...
    def aggregate(self, metric: str, match: Mapping[str, str], agg: str, start: float, end: float) -> float | None: ...
    def events(self, kinds: tuple[str, ...], start: float, end: float, match: Mapping[str, str]) -> list[EventRow]: ...
    def alerts(self, start: float, end: float) -> list[AlertRow]: ...
    def band(self, metric: str, match: Mapping[str, str], t: float) -> Band | None: ...
    def close(self) -> None: ...


def quantile_buckets(
    t: np.ndarray, v: np.ndarray, start: float, end: float, points: int
) -> tuple[np.ndarray, list[np.ndarray], float]:
    """Split per-event samples into time buckets wide enough to hold ~10 samples each (at most
    points/4 buckets), over the span the samples cover. Returns bucket mid-times, the values of
    each non-empty bucket, and the bucket width in seconds."""
    if len(t) == 0:
        return np.array([]), [], 1.0
    lo, hi = max(start, float(t.min())), min(end, float(t.max()))
    n_buckets = int(max(1, min(points // 4, len(t) // SAMPLES_PER_QUANTILE_BUCKET)))
    width = (hi - lo) / n_buckets if hi > lo else 1.0
    idx = np.minimum(((t - lo) / width).astype(int), n_buckets - 1)
    mids, groups = [], []
    for b in range(n_buckets):
        sel = v[idx == b]
        if len(sel):
            mids.append(lo + (b + 0.5) * width)
            groups.append(sel)
    return np.array(mids), groups, width


def counter_rate(t: list[float], vmax: list[float]) -> tuple[list[float], list[float | None]]:
    """Per-second increase of a counter between consecutive buckets (bucket maxima = last values).
    A drop means the counter restarted: the new value is the increase."""
    out_t, out_v = [], []
    for i in range(1, len(t)):
        dt = t[i] - t[i - 1]
        if dt <= 0:
            continue
        dv = vmax[i] - vmax[i - 1]
        out_t.append(t[i])
        out_v.append((dv if dv >= 0 else vmax[i]) / dt)
    return out_t, out_v


class StoreReader:
    """Reads a local gpulens store (opened read-only: the dashboard never writes)."""

    kind = "store"
    supports_events = True

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._store: Store | None = Store(self.path, readonly=True)  # fails early on a bad path
        self.description = f"store {self.path}"

    @property
    def store(self) -> Store:
        # Reopened on demand: an ASGI server may run the app's lifespan (which closes it) more than once.
        if self._store is None:
            self._store = Store(self.path, readonly=True)
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ series lookup
    def _series(self, metric: str, match: Mapping[str, str]) -> list[tuple[int, dict[str, str]]]:
        with self.store.lock:
            rows = self.store.connection.execute("SELECT id, labels FROM series WHERE name = ?", (metric,)).fetchall()
        want = {k: str(v) for k, v in match.items() if v not in (None, "")}
        out = []
        for sid, lj in rows:
            labels = json.loads(lj)
            if all(labels.get(k) == v for k, v in want.items()):
                out.append((sid, labels))
        return out

    def data_range(self) -> tuple[float, float] | None:
        return self.store.time_range()

    def label_values(self) -> dict[str, list[str]]:
        out: dict[str, set[str]] = {"gpu": set(), "job": set(), "service": set(), "host": set()}
        with self.store.lock:
            rows = self.store.connection.execute("SELECT DISTINCT labels FROM series").fetchall()
        for (lj,) in rows:
            labels = json.loads(lj)
            for k in out:
                if (label := selection_label(k)) in labels:
                    out[k].add(labels[label])
        return {k: sorted(v, key=lambda s: (len(s), s)) for k, v in out.items()}

    def has_data(self, metric: str, match: Mapping[str, str], start: float, end: float) -> bool:
        ids = [sid for sid, _ in self._series(metric, match)]
        if not ids:
            return False
        q = f"SELECT 1 FROM samples WHERE series_id IN ({','.join('?' * len(ids))}) AND t >= ? AND t <= ? LIMIT 1"
        with self.store.lock:
            return self.store.connection.execute(q, (*ids, start, end)).fetchone() is not None

    def _raw(self, metric: str, match: Mapping[str, str], start: float, end: float) -> tuple[np.ndarray, np.ndarray]:
        ids = [sid for sid, _ in self._series(metric, match)]
        if not ids:
            return np.array([]), np.array([])
        q = f"SELECT t, value FROM samples WHERE series_id IN ({','.join('?' * len(ids))}) AND t >= ? AND t <= ? ORDER BY t"
        with self.store.lock:
            rows = self.store.connection.execute(q, (*ids, start, end)).fetchall()
        arr = np.array(rows, dtype=float).reshape(-1, 2)
        return arr[:, 0], arr[:, 1]

    # ------------------------------------------------------------ drawn series
    def line(self, metric: str, match: Mapping[str, str], start: float, end: float, points: int) -> list[Line]:
        out = []
        for d in self.store.query(metric, dict(match), start=start, end=end, max_points=points):
            if len(d):
                out.append(Line(d.key.labels, d.t, list(d.value), list(d.value_min), list(d.value_max)))
        return out

    def quantile(self, metric: str, match: Mapping[str, str], q: float, start: float, end: float, points: int) -> list[Line]:
        # All selected series form one distribution: percentiles are never averaged across series.
        t, v = self._raw(metric, match, start, end)
        if len(t) == 0:
            return []
        mids, groups, _ = quantile_buckets(t, v, start, end, points)
        return [Line({}, mids.tolist(), [float(np.percentile(g, q * 100)) for g in groups])]

    def rate(self, metric: str, match: Mapping[str, str], start: float, end: float, points: int) -> list[Line]:
        out = []
        for d in self.store.query(metric, dict(match), start=start, end=end, max_points=points):
            if len(d) >= 2:
                t, v = counter_rate(d.t, d.value_max)
                out.append(Line(d.key.labels, t, v))
        return out

    def events_per_second(self, metric: str, match: Mapping[str, str], start: float, end: float, points: int) -> list[Line]:
        t, _ = self._raw(metric, match, start, end)
        if len(t) == 0:
            return []
        mids, groups, width = quantile_buckets(t, t, start, end, points)
        return [Line({}, mids.tolist(), [len(g) / width for g in groups])]

    # ------------------------------------------------------------ numbers
    def _sql_summary(self, ids: list[int], start: float, end: float) -> tuple[int, float, float | None, float | None]:
        """count, sum, min, max of the samples in [start, end], in SQLite. A long window reads its full
        minutes from the 1-minute roll-up and only its two partial edges from raw samples."""
        marks = ",".join("?" * len(ids))
        parts = []
        with self.store.lock:
            conn = self.store.connection
            if end - start > LONG_WINDOW_SECONDS:
                a, b = math.ceil(start / 60) * 60, math.floor(end / 60) * 60
                parts.append(conn.execute(
                    f"SELECT sum(n), sum(vsum), min(vmin), max(vmax) FROM rollup_1m WHERE series_id IN ({marks}) AND bucket >= ? AND bucket < ?",
                    (*ids, a, b),
                ).fetchone())
                # Two range scans, not one OR (which SQLite cannot serve from the (series_id, t) index).
                for lo, hi, op in ((start, a, "<"), (b, end, "<=")):
                    parts.append(conn.execute(
                        f"SELECT count(*), sum(value), min(value), max(value) FROM samples WHERE series_id IN ({marks}) "
                        f"AND t >= ? AND t {op} ?",
                        (*ids, lo, hi),
                    ).fetchone())
            else:
                parts.append(conn.execute(
                    f"SELECT count(*), sum(value), min(value), max(value) FROM samples WHERE series_id IN ({marks}) AND t >= ? AND t <= ?",
                    (*ids, start, end),
                ).fetchone())
        n = sum(p[0] or 0 for p in parts)
        total = sum(p[1] or 0.0 for p in parts)
        mins = [p[2] for p in parts if p[2] is not None]
        maxs = [p[3] for p in parts if p[3] is not None]
        return n, total, (min(mins) if mins else None), (max(maxs) if maxs else None)

    def aggregate(self, metric: str, match: Mapping[str, str], agg: str, start: float, end: float) -> float | None:
        if agg in QUANTILE_OF_AGG:
            _, v = self._raw(metric, match, start, end)
            return float(np.percentile(v, QUANTILE_OF_AGG[agg] * 100)) if len(v) else None
        if agg not in ("count", "sum", "mean", "max", "min"):
            raise ValueError(f"unknown aggregate {agg!r}")
        ids = [sid for sid, _ in self._series(metric, match)]
        if not ids:
            return 0.0 if agg == "count" else None
        n, total, lo, hi = self._sql_summary(ids, start, end)
        if agg == "count":
            return float(n)
        if n == 0:
            return None
        return {"sum": total, "mean": total / n, "max": hi, "min": lo}[agg]

    def events(self, kinds: tuple[str, ...], start: float, end: float, match: Mapping[str, str]) -> list[EventRow]:
        out = []
        for kind in kinds:
            for e in self.store.events(kind, start=start, end=end, labels=dict(match) or None, limit=1000):
                out.append(EventRow(e.t, e.kind, e.labels, e.data))
        return sorted(out, key=lambda e: e.t)

    def alerts(self, start: float, end: float) -> list[AlertRow]:
        from gpulens.views.integrations import alert_history

        return alert_history(self.store, start, end)

    def band(self, metric: str, match: Mapping[str, str], t: float) -> Band | None:
        from gpulens.views.integrations import baseline_band

        return baseline_band(self.store, metric, match, t)


def finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None
