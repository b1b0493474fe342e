"""The clock the monitors read, injectable so tests (gpulens's and users') drive time instead of sleeping.

Two readings, because they answer different questions: `monotonic()` measures durations (it never
jumps when NTP or a person sets the wall clock), `time()` stamps records in unix seconds (what the
store, the GPU samples and Prometheus share). Calling a clock returns `time()`, so a `Clock` also
fits every older `clock=` argument that takes a bare wall-time callable (the GPU backends, the
alert runtime), and one `FakeClock` can drive a fake GPU and a monitor together:

    clock = FakeClock()
    mon = TrainingMonitor(job="unit", store=store, clock=clock)
    with mon.step():
        clock.advance(0.25)          # the step took exactly 250 ms

A leaf module: it imports nothing of gpulens but the errors, so every layer may use it.
"""

from __future__ import annotations

import threading
import time as _time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from gpulens.errors import BadInputError


@runtime_checkable
class Clock(Protocol):
    """A source of time: `monotonic()` for durations, `time()` (also `clock()`) for timestamps."""

    def monotonic(self) -> float: ...

    def time(self) -> float: ...

    def __call__(self) -> float: ...


class SystemClock:
    """The real clock. `monotonic` is `time.perf_counter`: monotonic, and fine-grained enough for a
    sub-millisecond step."""

    __slots__ = ()

    monotonic = staticmethod(_time.perf_counter)  # no wrapper call on the training loop's hot path
    time = staticmethod(_time.time)

    def __call__(self) -> float:
        return _time.time()

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK = SystemClock()


class FakeClock:
    """A clock that moves only when told to (`advance`, or `sleep` where code takes a sleep function).

    Both readings move together, from `start` (unix seconds) and `monotonic_start`. The defaults are
    round binary numbers, so durations that are sums of binary fractions (0.25, 0.125) come back
    exactly. Thread-safe: a server thread may read it while the test advances it.
    """

    def __init__(self, start: float = 1_700_000_000.0, monotonic_start: float = 1000.0):
        self._wall0 = float(start)
        self._mono0 = float(monotonic_start)
        self._elapsed = 0.0
        self._wall_step = 0.0  # what step_wall moved the wall clock by, in all
        self._lock = threading.Lock()

    def advance(self, seconds: float) -> None:
        """Move time forward by `seconds` (≥ 0: a monotonic clock never runs back)."""
        if not seconds >= 0:
            raise BadInputError(f"A clock only moves forward; advance({seconds!r}) would move it back.",
                                hint="Pass a duration ≥ 0.")
        with self._lock:
            self._elapsed += seconds

    sleep = advance  # where code under test takes `sleep=`, waiting costs no real time

    def step_wall(self, seconds: float) -> None:
        """Set the wall clock `seconds` forward (or back, when negative), as NTP or a person setting
        the clock does: `time()` jumps, `monotonic()` does not move."""
        with self._lock:
            self._wall_step += float(seconds)

    @property
    def elapsed(self) -> float:
        """Seconds advanced since the clock was made."""
        return self._elapsed

    def monotonic(self) -> float:
        return self._mono0 + self._elapsed

    def time(self) -> float:
        return self._wall0 + self._elapsed + self._wall_step

    def __call__(self) -> float:
        return self.time()

    def __repr__(self) -> str:
        return f"FakeClock(time={self.time()!r})"


class _CallableClock:
    """A bare wall-time callable as a Clock (the older `clock=lambda: t` spelling): both readings
    come from it, so the durations it implies are the differences of its values."""

    __slots__ = ("_fn",)

    def __init__(self, fn: Callable[[], float]):
        self._fn = fn

    def monotonic(self) -> float:
        return self._fn()

    def time(self) -> float:
        return self._fn()

    def __call__(self) -> float:
        return self._fn()


def as_clock(clock: Clock | Callable[[], float] | None) -> Clock:
    """A Clock from a Clock, a bare callable returning unix seconds, or None (the real clock)."""
    if clock is None:
        return SYSTEM_CLOCK
    if callable(getattr(clock, "monotonic", None)) and callable(getattr(clock, "time", None)) and callable(clock):
        return clock  # type: ignore[return-value]
    if callable(clock):
        return _CallableClock(clock)
    raise BadInputError(f"clock= must be a Clock or a function returning unix seconds, not {clock!r}.",
                        hint="Pass gpulens.clock.FakeClock() in tests, or leave it unset.")
