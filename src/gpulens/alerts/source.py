"""Reads the samples and events a rule needs from the store, with the series of each metric cached
so one evaluation is a handful of indexed lookups (the agent and `gpulens replay` evaluate every
interval).

With a feed (`store.recent.RecentSamples`, a live agent's), the samples this process wrote lately
are read from memory instead: an evaluation then needs neither a commit first nor a query per series,
and sees every sample the loop buffered. Samples older than the feed keeps, and series this process
does not write (other writers'), still come from the store."""

from __future__ import annotations

from dataclasses import dataclass

from gpulens.alerts.expr import Selector
from gpulens.alerts.windows import EventWindow, RangeWindow
from gpulens.errors import StoreError
from gpulens.store import Store
from gpulens.store.recent import RecentSamples
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

    def __init__(self, store: Store, feed: RecentSamples | None = None):
        self.store = store
        self.feed = feed
        self._by_name: dict[str, list[SeriesRef]] = {}
        self._max_id = -1
        self._windows: dict[tuple[int, float, bool], RangeWindow] = {}
        self._event_windows: dict[tuple[str, float], EventWindow] = {}
        self._used: dict[tuple, int] = {}  # window -> the refresh that last used it
        self._refreshes = 0
        self._selected: dict[tuple[str, tuple], tuple[SeriesRef, ...]] = {}  # a selector's series, until new ones come
        self.generation = 0  # counts the refreshes that found new series
        self._pairs: dict[tuple[str, tuple], tuple[int, tuple[tuple[int, LabelKey], ...]]] = {}  # (generation, (id, key) of a selector's series)
        self._token: tuple[int, int] | None = None
        self.store_unchanged = False  # the last refresh found nothing committed since the one before

    def refresh(self) -> None:
        """Pick up series created since the last call (cheap when there are none); forget windows
        no rule asked for in the last 100 evaluations."""
        self._refreshes += 1
        if self._refreshes % 100 == 0:
            for key in [k for k, n in self._used.items() if n < self._refreshes - 100]:
                self._windows.pop(key, None)  # type: ignore[arg-type]
                self._event_windows.pop(key, None)  # type: ignore[arg-type]
                self._used.pop(key, None)
        if self.feed is not None and self.feed.disordered:
            self._flush()  # a series the feed gave up on (the clock set back) is read from the store
        token = self.store.change_token()
        self.store_unchanged = token == self._token  # nothing committed since the last refresh, here or elsewhere
        self._token = token
        if self.store_unchanged:
            return
        max_id = self.store.max_series_id()
        if max_id == self._max_id:
            return
        self.generation += 1
        self._selected.clear()
        for row in self.store.series_since(max(self._max_id, 0)):
            self._by_name.setdefault(row.name, []).append(SeriesRef(row.id, row.name, row.labels, label_key(row.labels)))
        self._max_id = max_id

    def series(self, sel: Selector) -> tuple[SeriesRef, ...]:
        """The series a selector picks: matched once, then again only after `refresh` found new series
        (every rule asks every evaluation, and the answer changes only then)."""
        key = (sel.name, sel.matchers)
        hit = self._selected.get(key)
        if hit is None:
            hit = self._selected[key] = tuple(s for s in self._by_name.get(sel.name, ()) if all(m.matches(s.labels) for m in sel.matchers))
            feed = self.feed
            if feed is not None and any(not feed.watched(s.id) for s in hit):
                # what is buffered of them goes to the store, the feed keeps what comes next
                self._flush()
                feed.watch([s.id for s in hit])
        return hit

    def _flush(self) -> None:
        try:
            self.store.flush()
        except StoreError:
            pass  # buffered; the sampling loop retries and raises GpulensStoreWriteFailing

    def _kept_after(self, sid: int) -> float | None:
        """The time after which the feed holds every sample of `sid`; None: ask the store."""
        return None if self.feed is None else self.feed.after(sid)

    def names(self) -> set[str]:
        return set(self._by_name)

    def last(self, sid: int, t: float, lookback_seconds: float) -> float | None:
        """The newest value in (t - lookback, t]."""
        kept = self._kept_after(sid)
        if kept is None:
            return self.store.last_value(sid, t, lookback_seconds)
        lo = t - lookback_seconds
        row = self.feed.last(sid, t)  # type: ignore[union-attr]
        if row is not None:  # every later sample up to t would be kept too
            return row[1] if row[0] > lo else None
        if lo >= kept:
            return None
        end = min(t, kept)
        return self.store.last_value(sid, end, end - lo)

    def last_values(self, sel: Selector, t: float, lookback_seconds: float) -> dict[LabelKey, float]:
        """`last` of every series the selector picks, by label key (an instant selector's vector)."""
        pairs = self._pairs.get((sel.name, sel.matchers))
        if pairs is None or pairs[0] != self.generation:
            pairs = self._pairs[(sel.name, sel.matchers)] = (self.generation, tuple((s.id, s.key) for s in self.series(sel)))
        if self.feed is None:
            out: dict[LabelKey, float] = {}
            ask: list[tuple[int, LabelKey]] = list(pairs[1])
        else:  # what the feed keeps, in one pass; the store for the rest
            out, ask = self.feed.last_values(pairs[1], t, t - lookback_seconds)
        for sid, key in ask:
            v = self.last(sid, t, lookback_seconds)
            if v is not None:
                out[key] = v
        return out

    def before(self, sid: int, t: float) -> float | None:
        """The newest value at or before t, however old (the base of a counter's increase)."""
        kept = self._kept_after(sid)
        if kept is None:
            return self.store.value_at_or_before(sid, t)
        row = self.feed.last(sid, t)  # type: ignore[union-attr]
        return row[1] if row is not None else self.store.value_at_or_before(sid, min(t, kept))

    def window(self, sid: int, start: float, end: float) -> list[Sample]:
        """(t, value) in (start, end], oldest first."""
        kept = self._kept_after(sid)
        if kept is None:
            return self.store.window(sid, start, end)
        stored = self.store.window(sid, start, min(end, kept)) if start < kept else []
        return stored + self.feed.window(sid, max(start, kept), end)  # type: ignore[union-attr]

    def window_after(self, sid: int, start: float, end: float, after_position: int) -> tuple[list[Sample], int]:
        """Samples in (start, end] committed after `after_position` (a rowid), with the newest
        position; with a feed, plus the kept ones that may not be committed yet."""
        kept = self._kept_after(sid)
        if kept is None:
            return self.store.window_after(sid, start, end, after_position)
        rows, position = self.store.window_after(sid, start, min(end, kept), after_position) if start < kept else ([], after_position)
        return rows + self.feed.window(sid, max(start, kept), end), position  # type: ignore[union-attr]

    def window_new(self, sid: int, start: float, end: float, after_position: int, seen_until: float) -> tuple[list[Sample], int]:
        """What a kept window (`windows.RangeWindow`) has not read yet: as `window_after`; for a series
        in the feed, only its samples after `seen_until` (this process writes them in time order),
        from memory when the feed reaches back that far."""
        kept = self._kept_after(sid)
        if kept is None:
            return self.store.window_after(sid, start, end, after_position)
        if seen_until >= kept:
            return self.feed.window(sid, max(start, seen_until), end), after_position  # type: ignore[union-attr]
        rows, position = self.window_after(sid, start, end, after_position)
        return [r for r in rows if r.t > seen_until], position

    def range_window(self, sid: int, range_seconds: float, t: float, *, sorted_values: bool = False) -> RangeWindow:
        """The series' window (t - range, t], kept from the last evaluation and brought up to `t`."""
        key = (sid, range_seconds, sorted_values)
        win = self._windows.get(key)
        if win is None:
            win = self._windows[key] = RangeWindow(range_seconds, sorted_values=sorted_values)
        self._used[key] = self._refreshes
        return win.advance(self, sid, t)

    def first_time(self, sid: int) -> float | None:
        first = self.store.first_sample_time(sid)
        if first is None and self._kept_after(sid) is not None:
            kept = self.feed.window(sid, -float("inf"), float("inf"))  # type: ignore[union-attr]
            first = kept[0].t if kept else None
        return first

    def _events_committed(self) -> None:
        """Events this process buffered (an XID, a monitor's step) count at once: commit them first
        (rare; the feed holds samples only)."""
        if self.feed is not None and self.store.pending_events:
            self._flush()

    def events(self, kind: str, start: float, end: float) -> list[tuple[float, dict[str, str]]]:
        return [(e.t, e.labels) for e in self.events_in(kind, start, end)]

    def events_in(self, kind: str, start: float, end: float) -> list[Event]:
        """Events of `kind` in (start, end], oldest first."""
        self._events_committed()
        return self.store.events(kind, start=start, end=end, include_start=False)

    def events_unchanged(self) -> bool:
        """Nothing was committed between the last two refreshes and this process buffers no event: a
        kept event window (which reads events timed ahead too) has nothing new to read."""
        return self.store_unchanged and not self.store.pending_events and self.store.change_token() == self._token

    def event_labels_after(self, kind: str, start: float, end: float, *, after_id: int, after_t: float) -> list[tuple[int, float, dict[str, str]]]:
        self._events_committed()
        return self.store.event_labels_after(kind, start, end, after_id=after_id, after_t=after_t)

    def event_window(self, kind: str, range_seconds: float, t: float) -> EventWindow:
        """The kind's events in (t - range, t], counted per label set, kept from the last evaluation."""
        key = (kind, range_seconds)
        win = self._event_windows.get(key)
        if win is None:
            win = self._event_windows[key] = EventWindow(kind, range_seconds)
        self._used[key] = self._refreshes
        return win.advance(self, t)
