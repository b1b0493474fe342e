"""Range windows kept across evaluations, so a rule's cost per evaluation stays flat as its window
fills: each evaluation reads only the samples committed since the last one (and at most
`LATE_GRACE_SECONDS` back in time, for monitors that commit steps that ended seconds ago), and
updates the window's aggregates incrementally (sum, counter steps, min/max by monotonic queues,
a sorted copy for quantiles in blocks, read by rank rather than re-sorted). `avg_over_time(x[10m])` at
10 Hz then costs the same after 10 minutes as after 1, instead of re-reading 6,000 points per
series every evaluation. `EventWindow` does the same for `count_events_over_time`: a count per
label set, kept, with only the events committed since the last evaluation read."""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import Protocol

from gpulens.store.types import Sample

# A sample committed later than this after its own time is missed by the incremental read (a
# window rebuilt from scratch, after a restart or a jump in time, still sees it).
LATE_GRACE_SECONDS = 60.0
_RESUM_EVERY = 10_000  # pops between exact recomputations of the running sums (float drift)


class WindowReader(Protocol):
    def window_after(self, sid: int, start: float, end: float, after_position: int) -> tuple[list[Sample], int]: ...

    def before(self, sid: int, t: float) -> float | None: ...


class EventReader(Protocol):
    def event_labels_after(self, kind: str, start: float, end: float, *, after_id: int, after_t: float) -> list[tuple[int, float, dict[str, str]]]: ...


class SortedValues:
    """A multiset of floats kept sorted in blocks of at most 2 x `LOAD` (sortedcontainers' layout,
    which is not a dependency here): adding or removing one value moves at most a block, not the
    whole window, so it costs the same at 600 values as at 6,000; the k-th smallest walks the
    block sizes (a handful)."""

    LOAD = 128

    def __init__(self) -> None:
        self._blocks: list[list[float]] = []
        self._maxes: list[float] = []  # the largest value of each block
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def clear(self) -> None:
        self._blocks.clear()
        self._maxes.clear()
        self._len = 0

    def add(self, v: float) -> None:
        self._len += 1
        if not self._blocks:
            self._blocks.append([v])
            self._maxes.append(v)
            return
        i = bisect.bisect_left(self._maxes, v)
        if i == len(self._maxes):  # above every block: the last one takes it
            i -= 1
            self._blocks[i].append(v)
            self._maxes[i] = v
        else:
            bisect.insort(self._blocks[i], v)
        block = self._blocks[i]
        if len(block) > 2 * self.LOAD:  # split in halves
            half = block[self.LOAD:]
            del block[self.LOAD:]
            self._blocks.insert(i + 1, half)
            self._maxes[i] = block[-1]
            self._maxes.insert(i + 1, half[-1])

    def remove(self, v: float) -> None:
        """Remove one value equal to `v` (it must be there)."""
        i = bisect.bisect_left(self._maxes, v)
        block = self._blocks[i]
        del block[bisect.bisect_left(block, v)]
        self._len -= 1
        if not block:
            del self._blocks[i]
            del self._maxes[i]
        else:
            self._maxes[i] = block[-1]

    def __getitem__(self, k: int) -> float:
        """The k-th smallest value (0-based; -1 for the largest)."""
        if k < 0:
            k += self._len
        if not 0 <= k < self._len:
            raise IndexError(k)
        for block in self._blocks:
            if k < len(block):
                return block[k]
            k -= len(block)
        raise IndexError(k)

    def __iter__(self):  # noqa: ANN204 - all values, in order
        for block in self._blocks:
            yield from block


class RangeWindow:
    """The samples of one series in (t - range, t] and their aggregates."""

    def __init__(self, range_seconds: float, *, sorted_values: bool = False):
        self.range_seconds = range_seconds
        self.keep_sorted = sorted_values
        self.points: deque[tuple[int, float, float, float]] = deque()  # (seq, t, value, counter step)
        self.end: float | None = None
        self.position = 0
        self.sum = 0.0
        self.step_sum = 0.0
        self.sorted = SortedValues()
        self._max: deque[tuple[int, float]] = deque()
        self._min: deque[tuple[int, float]] = deque()
        self._prev: float | None = None  # the last value pushed: the base of the next counter step
        self._seq = 0
        self._pops = 0

    # ------------------------------------------------------------ reading
    def advance(self, reader: WindowReader, sid: int, t: float) -> RangeWindow:
        start = t - self.range_seconds
        if self.end is None or t < self.end or t - self.end > self.range_seconds:
            self._rebuild(reader, sid, start, t)
        else:
            since = max(start, self.end - LATE_GRACE_SECONDS)
            read_new = getattr(reader, "window_new", None)  # a reader with a feed of what is not committed yet
            if read_new is not None:
                new, self.position = read_new(sid, since, t, self.position, self.end)
            else:
                new, self.position = reader.window_after(sid, since, t, self.position)
            last_t = self.points[-1][1] if self.points else -float("inf")
            if new and new[0].t < last_t:  # a late sample inside the window: rare, start over
                self._rebuild(reader, sid, start, t)
            else:
                for p in new:
                    self._push(p.t, p.value)
        while self.points and self.points[0][1] <= start:
            self._pop()
        self.end = t
        return self

    def _rebuild(self, reader: WindowReader, sid: int, start: float, end: float) -> None:
        self.points.clear()
        self._max.clear()
        self._min.clear()
        self.sorted.clear()
        self.sum = self.step_sum = 0.0
        self._prev = reader.before(sid, start)  # a counter first seen inside the window counts from zero
        # the position is the newest row read: a row committed meanwhile comes with the next read
        pts, self.position = reader.window_after(sid, start, end, 0)
        for p in pts:
            self._push(p.t, p.value)

    def _push(self, t: float, v: float) -> None:
        prev = self._prev
        step = v if prev is None else (v - prev if v >= prev else v)  # a drop is a counter reset
        self._prev = v
        self._seq += 1
        seq = self._seq
        self.points.append((seq, t, v, step))
        self.sum += v
        self.step_sum += step
        if self.keep_sorted:  # the sorted copy has min and max at its ends: no queues to keep
            self.sorted.add(v)
            return
        while self._max and self._max[-1][1] <= v:
            self._max.pop()
        self._max.append((seq, v))
        while self._min and self._min[-1][1] >= v:
            self._min.pop()
        self._min.append((seq, v))

    def _pop(self) -> None:
        seq, _, v, step = self.points.popleft()
        self.sum -= v
        self.step_sum -= step
        if self.keep_sorted:
            self.sorted.remove(v)
        else:
            if self._max and self._max[0][0] == seq:
                self._max.popleft()
            if self._min and self._min[0][0] == seq:
                self._min.popleft()
        self._pops += 1
        if self._pops % _RESUM_EVERY == 0:
            self.sum = sum(p[2] for p in self.points)
            self.step_sum = sum(p[3] for p in self.points)

    # ------------------------------------------------------------ aggregates
    def __len__(self) -> int:
        return len(self.points)

    @property
    def max(self) -> float:
        return self.sorted[-1] if self.keep_sorted else self._max[0][1]

    @property
    def min(self) -> float:
        return self.sorted[0] if self.keep_sorted else self._min[0][1]

    @property
    def first(self) -> float:
        return self.points[0][2]

    @property
    def last(self) -> float:
        return self.points[-1][2]

    def quantile(self, q: float) -> float:
        """The q-quantile of the window's values by `gpulens.stats`' definition (type 7: linear
        between the closest ranks), read off the kept sorted copy by rank: no sort per evaluation."""
        vals = self.sorted
        h = (len(vals) - 1) * min(max(q, 0.0), 1.0)
        lo = int(h)
        a = vals[lo]
        if lo + 1 >= len(vals) or h == lo:
            return a
        b = vals[lo + 1]
        return a + (h - lo) * (b - a) if a != b else a


class EventWindow:
    """Events of one kind in (t - range, t], counted per label set, kept across evaluations: each
    evaluation reads only the events committed since the last one (at most `LATE_GRACE_SECONDS` back
    in time), so its cost does not grow with the range. Events timed after the window's end (a
    monitor's clock ahead of this one) are read once and counted when their time comes; so when the
    reader says nothing was committed since the last read (`events_unchanged`), there is nothing
    to read."""

    def __init__(self, kind: str, range_seconds: float):
        self.kind = kind
        self.range_seconds = range_seconds
        self.events: deque[tuple[float, int, tuple[tuple[str, str], ...]]] = deque()  # (t, id, label key)
        self.counts: dict[tuple[tuple[str, str], ...], int] = {}
        self.labels: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
        self.end: float | None = None
        self._last_id = 0
        self._ahead: list[tuple[int, float, dict[str, str]]] = []  # read, timed after `end`; oldest first

    def advance(self, reader: EventReader, t: float) -> EventWindow:
        start = t - self.range_seconds
        if self.end is None or t < self.end or t - self.end > self.range_seconds:
            self._rebuild(reader, start, t)
        else:
            unchanged = getattr(reader, "events_unchanged", None)
            new = [] if unchanged is not None and unchanged() else reader.event_labels_after(
                self.kind, max(start, self.end - LATE_GRACE_SECONDS), math.inf, after_id=self._last_id, after_t=math.inf)
            if new and self.events and new[0][1] < self.events[-1][0]:  # a late event: rare, start over
                self._rebuild(reader, start, t)
            else:
                self._take(new, t)
        while self.events and self.events[0][0] <= start:
            _, _, key = self.events.popleft()
            n = self.counts[key] - 1
            if n:
                self.counts[key] = n
            else:
                del self.counts[key]
                del self.labels[key]
        self.end = t
        return self

    def _rebuild(self, reader: EventReader, start: float, end: float) -> None:
        self.events.clear()
        self.counts.clear()
        self.labels.clear()
        self._ahead.clear()
        self._last_id = 0
        self._take(reader.event_labels_after(self.kind, start, math.inf, after_id=0, after_t=start), end)

    def _take(self, events: list[tuple[int, float, dict[str, str]]], end: float) -> None:
        """Count the events read up to `end`; keep the later ones for when their time comes."""
        for eid, _, _ in events:
            self._last_id = max(self._last_id, eid)
        if self._ahead:
            events = sorted(self._ahead + events, key=lambda e: (e[1], e[0]))
            self._ahead = []
        for i, (eid, t, labels) in enumerate(events):
            if t > end:
                self._ahead = events[i:]
                break
            key = tuple(sorted(labels.items()))
            self.events.append((t, eid, key))
            self.counts[key] = self.counts.get(key, 0) + 1
            self.labels.setdefault(key, labels)
