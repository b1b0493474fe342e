"""The samples this process wrote lately, kept in memory per watched series, so that the alert rules
read what the sampling loop just buffered without a commit (and without a query) per evaluation.

Invariant, per series: every sample of it with t > `after(sid)` that this process wrote is here,
oldest first. Older ones are read from the store. A series written out of time order (the wall clock
set back) is given up on (`after` None): it is read from the store from then on, after a flush.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from typing import TypeVar

from gpulens.store.types import Sample

K = TypeVar("K", bound=Hashable)


class RecentSamples:
    """Per watched series, (t, value) of the last `keep_seconds` (of the series' own newest time) at
    least, twice that at most (trimmed in bursts: most rows are one append)."""

    def __init__(self, keep_seconds: float):
        self.keep_seconds = keep_seconds
        self._rows: dict[int, deque[tuple[float, float]]] = {}
        self._after: dict[int, float] = {}
        self.watched_ids: set[int] = set()  # writers test membership before calling `add` (a hot path)
        self.disordered = False  # some series was given up on: the reader flushes before reading it

    def watch(self, series_ids: set[int] | list[int]) -> None:
        """Keep the samples of these series from now on (the store holds what came before)."""
        self.watched_ids.update(series_ids)

    def watched(self, sid: int) -> bool:
        return sid in self.watched_ids

    def add(self, sid: int, t: float, value: float) -> None:
        """Keep one sample of a watched series (the caller checked `watched_ids`)."""
        rows = self._rows.get(sid)
        if rows is None:
            self._rows[sid] = deque(((t, value),))
            self._after[sid] = t - 1e-6  # what came before this process's first sample is in the store
            return
        after = self._after[sid]
        if after != after or (rows and t <= rows[-1][0]):  # NaN: given up; or out of order: give up
            if after == after:
                rows.clear()
                self._after[sid] = float("nan")
                self.disordered = True
            return
        rows.append((t, value))
        edge = t - self.keep_seconds
        while rows[0][0] <= edge:
            self._after[sid] = rows.popleft()[0]

    def add_many(self, rows: list[tuple[int, float, float]]) -> None:
        """`add` for the watched ones of many (series_id, t, value) rows (a frame's)."""
        watched, kept, add = self.watched_ids, self._rows, self.add
        for sid, t, v in rows:
            if sid in watched:
                rows_of = kept.get(sid)
                if rows_of and t > rows_of[-1][0] and t - rows_of[0][0] < 2 * self.keep_seconds:
                    rows_of.append((t, v))  # the common case, inline: in order; `add` trims now and then
                else:
                    add(sid, t, v)

    def after(self, sid: int) -> float | None:
        """Every sample of `sid` written here with t above this is kept; None: read the store."""
        a = self._after.get(sid)
        return None if a is None or a != a else a

    def last(self, sid: int, t: float) -> tuple[float, float] | None:
        """The newest kept (t, value) at or before t."""
        rows = self._rows.get(sid)
        if not rows:
            return None
        if rows[-1][0] <= t:
            return rows[-1]
        for row in reversed(rows):
            if row[0] <= t:
                return row
        return None

    def last_values(self, items: Iterable[tuple[int, K]], t: float, lo: float) -> tuple[dict[K, float], list[tuple[int, K]]]:
        """`last` for many series at once (the alert rules' instant selectors, every evaluation): by
        key, the newest kept value at or before t if it is after `lo`; and the (id, key) pairs the
        feed cannot answer (not kept, or nothing kept at or before t), for the caller to read from
        the store."""
        out: dict[K, float] = {}
        ask: list[tuple[int, K]] = []
        rows_of, after_of = self._rows, self._after
        for sid, key in items:
            after = after_of.get(sid)
            rows = rows_of.get(sid)
            if after is None or after != after or not rows:
                ask.append((sid, key))
                continue
            rt, v = rows[-1]
            if rt > t:
                row = self.last(sid, t)
                if row is None:
                    ask.append((sid, key))
                    continue
                rt, v = row
            if rt > lo:
                out[key] = v
        return out, ask

    def window(self, sid: int, start: float, end: float) -> list[Sample]:
        """Kept samples in (start, end], oldest first."""
        rows = self._rows.get(sid)
        if not rows:
            return []
        out: list[Sample] = []
        for rt, v in reversed(rows):  # the newest few are what an evaluation asks for
            if rt <= start:
                break
            if rt <= end:
                out.append(Sample(rt, v))
        out.reverse()
        return out

    def __len__(self) -> int:
        return sum(len(r) for r in self._rows.values())

