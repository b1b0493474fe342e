"""The Reader of a local gpulens store: it answers both the panel and the analysis questions.

Open it on a path (read-only, its own connection: the dashboard, the reports) or on a Store already
open (borrowed, never closed here: a live monitor's store, a test's). A learned baseline band needs
gpulens.alerts, a layer above: the views pass it in as `bands` (gpulens.views.readers.store_reader).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gpulens.reader.answers import AlertRow, Band, EventRow, LatestValue, Line, SeriesWindow
from gpulens.reader.counters import counter_rate, summed_counter, without_pid
from gpulens.reader.protocols import QUANTILE_OF_AGG, SELECTION_KEYS, AnalysisReader, selection_label
from gpulens.stats import quantile
from gpulens.store import Store
from gpulens.store.types import SeriesData, canonical_labels

# A quantile needs this many samples per time bucket to mean something.
SAMPLES_PER_QUANTILE_BUCKET = 10
# Above this window length, sums and extremes read the 1-minute roll-up (exact: it keeps n, sum, min, max).
LONG_WINDOW_SECONDS = 2 * 3600
# The alert engine (gpulens.alerts) records each transition as an event of this kind.
ALERT_EVENT_KIND = "alert"
MAX_EVENT_ROWS = 1000

BandSource = Callable[[Store, str, Mapping[str, str], float], Band | None]


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


def _alert_row(d: Mapping[str, Any]) -> AlertRow | None:
    t = d.get("t") or d.get("time") or d.get("started") or d.get("start") or d.get("fired_at")
    if not isinstance(t, int | float):
        return None
    labels = d.get("labels")
    labels = labels if isinstance(labels, dict) else {}
    return AlertRow(
        t=float(t),
        name=str(d.get("name") or d.get("rule") or d.get("alertname") or "alert"),
        state=str(d.get("state") or d.get("status") or "firing"),
        severity=str(d.get("severity") or labels.get("severity") or "warning"),
        summary=str(d.get("summary") or d.get("message") or d.get("description") or ""),
        labels={str(k): str(v) for k, v in labels.items()},
    )


def alert_history(store: Store, start: float, end: float) -> list[AlertRow]:
    """Alerts that fired or resolved in [start, end], read from the alert engine's `alert` events
    without touching its tables."""
    rows = []
    for e in store.events(ALERT_EVENT_KIND, start=start, end=end, limit=MAX_EVENT_ROWS):
        own = e.data.get("labels")
        r = _alert_row({"t": e.t, **e.data, "labels": {**e.labels, **(own if isinstance(own, dict) else {})}})
        if r:
            rows.append(r)
    return rows


class StoreReader:
    """Reads a local gpulens store. On a path it opens the store read-only (the dashboard never
    writes, except that opening a store from an older gpulens migrates it once)."""

    kind = "store"
    supports_events = True

    def __init__(self, source: str | Path | Store, *, bands: BandSource | None = None):
        self._bands = bands
        if isinstance(source, Store):
            self.path = Path(source.path)
            self._store: Store | None = source
            self._owned = False
        else:
            self.path = Path(source)
            self._store = Store(self.path, readonly=True)  # fails early on a bad path
            self._owned = True
        self.description = f"store {self.path}"

    @property
    def store(self) -> Store:
        # Reopened on demand: an ASGI server may run the app's lifespan (which closes it) more than once.
        if self._store is None:
            self._store = Store(self.path, readonly=True)
        return self._store

    def close(self) -> None:
        if self._store is not None and self._owned:
            self._store.close()
            self._store = None

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ series lookup
    def _series(self, metric: str, match: Mapping[str, str]) -> list[tuple[int, dict[str, str]]]:
        want = {k: str(v) for k, v in match.items() if v not in (None, "")}
        return [(s.id, s.labels) for s in self.store.stored_series(metric)
                if all(s.labels.get(k) == v for k, v in want.items())]

    def data_range(self) -> tuple[float, float] | None:
        return self.store.time_range()

    def label_values(self) -> dict[str, list[str]]:
        out: dict[str, set[str]] = {k: set() for k in SELECTION_KEYS}
        for labels in self.store.label_sets():
            for k in out:
                if (label := selection_label(k)) in labels:
                    out[k].add(labels[label])
        return {k: sorted(v, key=lambda s: (len(s), s)) for k, v in out.items()}

    def has_data(self, metric: str, match: Mapping[str, str], start: float, end: float) -> bool:
        return self.store.has_samples([sid for sid, _ in self._series(metric, match)], start, end)

    def _raw(self, metric: str, match: Mapping[str, str], start: float, end: float) -> tuple[np.ndarray, np.ndarray]:
        cols = self.store.window_columns([sid for sid, _ in self._series(metric, match)], start, end)
        return np.asarray(cols.t, dtype=float), np.asarray(cols.value, dtype=float)

    # ------------------------------------------------------------ drawn series (panels)
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
        return [Line({}, mids.tolist(), [quantile(g, q) for g in groups])]

    def rate(self, metric: str, match: Mapping[str, str], start: float, end: float, points: int) -> list[Line]:
        # One line per label set: the counters of a service's workers (a `pid` label each) are added up.
        groups: dict[str, list[SeriesData]] = {}
        for d in self.store.query(metric, dict(match), start=start, end=end, max_points=points):
            if len(d):
                groups.setdefault(canonical_labels(without_pid(d.key.labels)), []).append(d)
        out = []
        for _, ds in sorted(groups.items()):
            t, v = counter_rate(*summed_counter(ds)) if len(ds) > 1 else counter_rate(ds[0].t, ds[0].value_max)
            if t:
                out.append(Line(without_pid(ds[0].key.labels) if len(ds) > 1 else ds[0].key.labels, t, v))
        return out

    def events_per_second(self, metric: str, match: Mapping[str, str], start: float, end: float, points: int) -> list[Line]:
        t, _ = self._raw(metric, match, start, end)
        if len(t) == 0:
            return []
        mids, groups, width = quantile_buckets(t, t, start, end, points)
        return [Line({}, mids.tolist(), [len(g) / width for g in groups])]

    # ------------------------------------------------------------ numbers (panels)
    def aggregate(self, metric: str, match: Mapping[str, str], agg: str, start: float, end: float) -> float | None:
        if agg in QUANTILE_OF_AGG:
            _, v = self._raw(metric, match, start, end)
            return quantile(v, QUANTILE_OF_AGG[agg])
        if agg not in ("count", "sum", "mean", "max", "min"):
            raise ValueError(f"unknown aggregate {agg!r}")
        ids = [sid for sid, _ in self._series(metric, match)]
        if not ids:
            return 0.0 if agg == "count" else None
        s = self.store.summary(ids, start, end, rollup_over_seconds=LONG_WINDOW_SECONDS)
        if agg == "count":
            return float(s.count)
        if s.count == 0:
            return None
        return {"sum": s.total, "mean": s.total / s.count, "max": s.maximum, "min": s.minimum}[agg]

    def events(self, kinds: tuple[str, ...], start: float, end: float, match: Mapping[str, str]) -> list[EventRow]:
        out = []
        for kind in kinds:
            for e in self.store.events(kind, start=start, end=end, labels=dict(match) or None, limit=MAX_EVENT_ROWS):
                out.append(EventRow(e.t, e.kind, e.labels, e.data))
        return sorted(out, key=lambda e: e.t)

    def alerts(self, start: float, end: float) -> list[AlertRow]:
        return alert_history(self.store, start, end)

    def band(self, metric: str, match: Mapping[str, str], t: float) -> Band | None:
        return None if self._bands is None else self._bands(self.store, metric, match, t)

    # ------------------------------------------------------------ analysis questions
    def cache_key(self) -> Hashable:
        return str(self.path), self.store.data_version()

    def time_range(self, metric: str | None = None) -> tuple[float, float] | None:
        return self.store.time_range(metric)

    def series_labels(self, metric: str, match: Mapping[str, str] | None = None) -> list[dict[str, str]]:
        return [k.labels for k in self.store.series(metric, match)]

    def series_windows(
        self, metric: str, match: Mapping[str, str] | None = None, *, start: float | None = None,
        end: float | None = None, max_points: int | None = None,
    ) -> list[SeriesWindow]:
        return [SeriesWindow(d.key.name, d.key.labels, d.t, d.value, d.value_min, d.value_max, d.resolution)
                for d in self.store.query(metric, match, start=start, end=end, max_points=max_points)]

    def latest_values(self, metric: str, match: Mapping[str, str] | None = None) -> list[LatestValue]:
        return [LatestValue(lv.key.name, lv.key.labels, lv.t, lv.value) for lv in self.store.latest(metric, match)]

    def event_rows(
        self, kind: str, *, start: float | None = None, end: float | None = None, match: Mapping[str, str] | None = None,
    ) -> list[EventRow]:
        return [EventRow(e.t, e.kind, e.labels, e.data) for e in self.store.events(kind, start=start, end=end, labels=match)]

    def setting(self, key: str) -> str | None:
        return self.store.get_meta(key)


def analysis_reader(source: AnalysisReader | Store) -> AnalysisReader:
    """The analysis reader of `source`: itself, or a Store wrapped (borrowed, not closed)."""
    return StoreReader(source) if isinstance(source, Store) else source
