"""Alert times that never run back, and durations that a wall-clock step does not stretch.

The rules read the store at wall-clock instants (the samples are stamped with wall time), but an
alert's life is measured on the monotonic clock: when NTP or a person sets the clock back, an alert
must not resolve before it began and then fire a second time once the clock is set forward again;
when the clock jumps forward, a `for: 5m` must still wait five minutes.

`AlertTimeline.at(now)` turns the instant an evaluation was asked for into
- `t`: the alert time (what alerts are stamped with): `now`, unless that is before the last one
  (the clock was set back), in which case it carries on from the last one by the monotonic time
  elapsed, until the wall clock catches up;
- `duration_clock`: the reading `for` and repeat durations are measured on. It moves by the
  monotonic time elapsed since the last evaluation when this one is at the clock's present (the
  agent: a wall-clock step is no time passing), and by the alert time elapsed when it is at a
  recorded instant (a replay evaluates along its recorded timeline, faster than real time);
- `behind`: whether `now` is more than `BEHIND_SECONDS` before `t`: the rules should then also be
  read at `t`, so that what happened before the step still counts while the clock is behind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpulens.clock import Clock, as_clock

# An evaluation this close to the clock's present is live (the agent evaluates at clock()).
LIVE_SECONDS = 2.0
# The wall clock this far behind the alert time counts as set back (less is the jitter of a slewing clock).
BEHIND_SECONDS = 1.0


@dataclass(frozen=True)
class AlertInstant:
    t: float  # unix seconds, never before the previous one
    duration_clock: float  # seconds on a clock that only moves forward
    behind: bool  # the wall clock was set back: read the rules at `t` too


class AlertTimeline:
    def __init__(self, clock: Clock | Callable[[], float] | None = None):
        self.clock = as_clock(clock)
        self._t: float | None = None
        self._mono = 0.0
        self._duration = 0.0

    def at(self, now: float) -> AlertInstant:
        live = abs(now - self.clock.time()) <= LIVE_SECONDS  # at the clock's present: the agent
        mono = self.clock.monotonic()
        if self._t is None:
            t = self._duration = now
        else:
            elapsed = max(0.0, mono - self._mono)
            if now >= self._t:
                t = now
            elif live:
                t = self._t + elapsed
            else:
                t = self._t  # a recorded instant before the last one: time stands until the record passes it
            self._duration += elapsed if live else t - self._t
        self._t, self._mono = t, mono
        return AlertInstant(t, self._duration, t - now > BEHIND_SECONDS)
