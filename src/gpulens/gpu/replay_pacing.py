"""How a replay keeps time without ever waiting on a bad line: the largest gap it plays
(`max_gap_seconds`), the frames that jump out of the timeline and are skipped, and the pacing
wait that a stop (SIGTERM, SIGINT, `--duration`) ends at once.

A recording's clock can be wrong for one line (a line dated 2099 in a session of 2026) or jump for
good (a recording resumed hours later, or taken on two machines). The two differ by what follows:
- a frame more than `max_gap_seconds` from both the frame before and the frame after, while those
  two are near each other, is an outlier: its lines are skipped and counted like malformed ones;
- anything else is kept: a jump the next frame continues from, a sparse recording whose every gap
  is long, the last frame. Each gap is played as `max_gap_seconds` at most (the rest of the
  timeline shifts with it), so a replay never sleeps longer than that between frames.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from gpulens.errors import BadInputError
from gpulens.gpu.types import GpuSample, XidEvent

# The longest recorded gap a replay plays, in recorded seconds: longer gaps are shortened to it.
DEFAULT_MAX_GAP_SECONDS = 60.0

# wait(seconds) -> True when the replay must stop now (a signal, the end of --duration).
Wait = Callable[[float], bool]


@dataclass
class RawFrame:
    """The lines of one recorded moment, with their line numbers, and the XID lines read with them."""

    samples: list[tuple[int, GpuSample]]
    xids: list[tuple[int, XidEvent]] = field(default_factory=list)

    @property
    def t(self) -> float:
        return self.samples[0][1].t


def _far(a: float, b: float, max_gap_seconds: float) -> bool:
    return abs(b - a) > max_gap_seconds


def guard_frames(raw: Iterator[RawFrame], max_gap_seconds: float,
                 skip: Callable[[int, str], None]) -> Iterator[RawFrame]:
    """The frames of `raw` with the outliers left out (each of their lines passed to `skip` with the
    reason). Looks one frame ahead (two at the start, where the two after stand in for the one before)."""
    ahead: list[RawFrame] = []

    def peek(k: int) -> RawFrame | None:
        while len(ahead) <= k:
            nxt = next(raw, None)
            if nxt is None:
                return None
            ahead.append(nxt)
        return ahead[k]

    def drop(f: RawFrame, prev_t: float | None) -> None:
        where = "its neighbours" if prev_t is not None else "the lines after it"
        for lineno, s in f.samples:
            skip(lineno, f"t is {s.t:.0f}, more than the max gap of {max_gap_seconds:g} s from {where}")

    prev_t: float | None = None
    carried: list[tuple[int, XidEvent]] = []  # XIDs read with a skipped frame go out with the next one kept
    while (cur := peek(0)) is not None:
        nxt = peek(1)
        # Compared with the frame before and the one after; the first frame with the two after it.
        before, after = (prev_t, nxt) if prev_t is not None else ((nxt.t if nxt is not None else None), peek(2))
        keep = before is None or after is None or not _far(before, cur.t, max_gap_seconds) \
            or not _far(cur.t, after.t, max_gap_seconds) or _far(before, after.t, max_gap_seconds)
        ahead.pop(0)
        if not keep:
            drop(cur, prev_t)
            carried += cur.xids
            continue
        cur.xids = carried + cur.xids
        carried = []
        prev_t = cur.t
        yield cur
    if carried:  # XIDs after the last frame kept
        yield RawFrame([], carried)


class Pacer:
    """When each frame is due on the wall clock, at `speed` times the recorded pace, with every gap
    longer than `max_gap_seconds` shortened to it; `wait` does the waiting and says when to stop."""

    def __init__(self, speed: float | None, max_gap_seconds: float, clock: Callable[[], float] = time.monotonic):
        self.speed = speed
        self.max_gap_seconds = max_gap_seconds
        self.clock = clock
        self.start: float | None = None  # clock() at the first frame
        self.rec0: float | None = None  # the first frame's recorded time
        self.removed_seconds = 0.0  # recorded seconds cut out of the timeline by long gaps (negative: jumps back)
        self._last_t: float | None = None

    def timeline(self, rec_t: float) -> float:
        """Recorded seconds since the first frame on the played timeline (long gaps shortened)."""
        if self.rec0 is None:
            self.rec0 = rec_t
        if self._last_t is not None:
            step = rec_t - self._last_t
            if step > self.max_gap_seconds:
                self.removed_seconds += step - self.max_gap_seconds
            elif step < -self.max_gap_seconds:  # a lasting jump back: the timeline goes on from here
                self.removed_seconds += step
        self._last_t = rec_t
        return rec_t - self.rec0 - self.removed_seconds

    def wait_for(self, played_seconds: float, wait: Wait) -> bool:
        """Wait until the frame `played_seconds` into the timeline is due; True when told to stop."""
        if self.start is None:
            self.start = self.clock()
        if self.speed is None:
            return False
        delay = self.start + played_seconds / self.speed - self.clock()
        if not delay > 0:
            return False
        # never longer than one shortened gap, whatever the clock did meanwhile
        return wait(min(delay, self.max_gap_seconds / self.speed))


def check_max_gap(max_gap_seconds: float) -> float:
    """A usable max gap: a finite number of seconds above zero."""
    if not (math.isfinite(max_gap_seconds) and max_gap_seconds > 0):
        raise BadInputError(f"The replay's max gap must be above zero seconds, not {max_gap_seconds!r}.",
                            hint="Give --max-gap 60s, say.")
    return max_gap_seconds
