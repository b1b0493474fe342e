"""Reads the samples and events a rule needs from the store, with the series of each metric cached
so one evaluation is a handful of indexed lookups (the agent and `gpulens replay` evaluate every
interval)."""

from __future__ import annotations

from dataclasses import dataclass

from gpulens.alerts.expr import Selector
from gpulens.alerts.windows import EventWindow, RangeWindow
from gpulens.store import Store
from gpulens.store.types import Event, Sample

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
        self._windows: dict[tuple[int, float, bool], RangeWindow] = {}
        self._event_windows: dict[tuple[str, float], EventWindow] = {}
        self._used: dict[tuple, int] = {}  # window -> the refresh that last used it
        self._refreshes = 0
        self._selected: dict[tuple[str, tuple], list[SeriesRef]] = {}  # a selector's series, until new ones come

    def refresh(self) -> None:
        """Pick up series created since the last call (cheap when there are none); forget windows
        no rule asked for in the last 100 evaluations."""
        self._refreshes += 1
        if self._refreshes % 100 == 0:
            for key in [k for k, n in self._used.items() if n < self._refreshes - 100]:
                self._windows.pop(key, None)  # type: ignore[arg-type]
                self._event_windows.pop(key, None)  # type: ignore[arg-type]
                self._used.pop(key, None)
        max_id = self.store.max_series_id()
        if max_id == self._max_id:
            return
        self._selected.clear()
        for row in self.store.series_since(max(self._max_id, 0)):
            self._by_name.setdefault(row.name, []).append(SeriesRef(row.id, row.name, row.labels, label_key(row.labels)))
        self._max_id = max_id

    def series(self, sel: Selector) -> list[SeriesRef]:
        """The series a selector picks: matched once, then again only after `refresh` found new series
        (every rule asks every evaluation, and the answer changes only then)."""
        key = (sel.name, sel.matchers)
        hit = self._selected.get(key)
        if hit is None:
            hit = self._selected[key] = [s for s in self._by_name.get(sel.name, ()) if all(m.matches(s.labels) for m in sel.matchers)]
        return list(hit)

    def names(self) -> set[str]:
        return set(self._by_name)

    def last(self, sid: int, t: float, lookback_seconds: float) -> float | None:
        """The newest value in (t - lookback, t]."""
        return self.store.last_value(sid, t, lookback_seconds)

    def before(self, sid: int, t: float) -> float | None:
        """The newest value at or before t, however old (the base of a counter's increase)."""
        return self.store.value_at_or_before(sid, t)

    def window(self, sid: int, start: float, end: float) -> list[Sample]:
        """(t, value) in (start, end], oldest first."""
        return self.store.window(sid, start, end)

    def window_after(self, sid: int, start: float, end: float, after_position: int) -> tuple[list[Sample], int]:
        return self.store.window_after(sid, start, end, after_position)

    def range_window(self, sid: int, range_seconds: float, t: float, *, sorted_values: bool = False) -> RangeWindow:
        """The series' window (t - range, t], kept from the last evaluation and brought up to `t`."""
        key = (sid, range_seconds, sorted_values)
        win = self._windows.get(key)
        if win is None:
            win = self._windows[key] = RangeWindow(range_seconds, sorted_values=sorted_values)
        self._used[key] = self._refreshes
        return win.advance(self, sid, t)

    def first_time(self, sid: int) -> float | None:
        return self.store.first_sample_time(sid)

    def events(self, kind: str, start: float, end: float) -> list[tuple[float, dict[str, str]]]:
        return [(e.t, e.labels) for e in self.events_in(kind, start, end)]

    def events_in(self, kind: str, start: float, end: float) -> list[Event]:
        """Events of `kind` in (start, end], oldest first."""
        return self.store.events(kind, start=start, end=end, include_start=False)

    def event_labels_after(self, kind: str, start: float, end: float, *, after_id: int, after_t: float) -> list[tuple[int, float, dict[str, str]]]:
        return self.store.event_labels_after(kind, start, end, after_id=after_id, after_t=after_t)

    def event_window(self, kind: str, range_seconds: float, t: float) -> EventWindow:
        """The kind's events in (t - range, t], counted per label set, kept from the last evaluation."""
        key = (kind, range_seconds)
        win = self._event_windows.get(key)
        if win is None:
            win = self._event_windows[key] = EventWindow(kind, range_seconds)
        self._used[key] = self._refreshes
        return win.advance(self, t)
