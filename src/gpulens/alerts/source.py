"""Reads the samples and events a rule needs from the store, with the series of each metric cached
so one evaluation is a handful of indexed lookups (the agent and `gpulens replay` evaluate every
interval)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from gpulens.alerts.expr import Selector
from gpulens.store import Store

LabelKey = tuple[tuple[str, str], ...]


def label_key(labels: dict[str, str]) -> LabelKey:
    return tuple(sorted(labels.items()))


@dataclass(frozen=True, slots=True)
class SeriesRef:
    id: int
    name: str
    labels: dict[str, str]
    key: LabelKey


class StoreSource:
    """Sample access for the evaluator. Every read sees what was flushed to the store."""

    def __init__(self, store: Store):
        self.store = store
        self._by_name: dict[str, list[SeriesRef]] = {}
        self._max_id = -1

    def refresh(self) -> None:
        """Pick up series created since the last call (cheap when there are none)."""
        with self.store.lock:
            conn = self.store.connection
            (max_id,) = conn.execute("SELECT coalesce(max(id), 0) FROM series").fetchone()
            if max_id == self._max_id:
                return
            rows = conn.execute("SELECT id, name, labels FROM series WHERE id > ?", (self._max_id,)).fetchall()
        for sid, name, labels_json in rows:
            labels = json.loads(labels_json)
            self._by_name.setdefault(name, []).append(SeriesRef(sid, name, labels, label_key(labels)))
        self._max_id = max_id

    def series(self, sel: Selector) -> list[SeriesRef]:
        return [s for s in self._by_name.get(sel.name, ()) if all(m.matches(s.labels) for m in sel.matchers)]

    def names(self) -> set[str]:
        return set(self._by_name)

    def last(self, sid: int, t: float, lookback_seconds: float) -> float | None:
        """The newest value in (t - lookback, t]."""
        with self.store.lock:
            row = self.store.connection.execute(
                "SELECT value FROM samples WHERE series_id = ? AND t <= ? AND t > ? ORDER BY t DESC LIMIT 1",
                (sid, t, t - lookback_seconds),
            ).fetchone()
        return None if row is None else row[0]

    def before(self, sid: int, t: float) -> float | None:
        """The newest value at or before t, however old (the base of a counter's increase)."""
        with self.store.lock:
            row = self.store.connection.execute(
                "SELECT value FROM samples WHERE series_id = ? AND t <= ? ORDER BY t DESC LIMIT 1", (sid, t)
            ).fetchone()
        return None if row is None else row[0]

    def window(self, sid: int, start: float, end: float) -> list[tuple[float, float]]:
        """(t, value) in (start, end], oldest first."""
        with self.store.lock:
            return self.store.connection.execute(
                "SELECT t, value FROM samples WHERE series_id = ? AND t > ? AND t <= ? ORDER BY t", (sid, start, end)
            ).fetchall()

    def first_time(self, sid: int) -> float | None:
        with self.store.lock:
            row = self.store.connection.execute("SELECT min(t) FROM samples WHERE series_id = ?", (sid,)).fetchone()
        return row[0]

    def events(self, kind: str, start: float, end: float) -> list[tuple[float, dict[str, str]]]:
        with self.store.lock:
            rows = self.store.connection.execute(
                "SELECT t, labels FROM events WHERE kind = ? AND t > ? AND t <= ?", (kind, start, end)
            ).fetchall()
        return [(t, json.loads(lj)) for t, lj in rows]
