"""gpulens.clock: the clock the monitors read, and the FakeClock tests drive instead of sleeping."""

from __future__ import annotations

import time

import pytest

from gpulens.clock import SYSTEM_CLOCK, Clock, FakeClock, as_clock
from gpulens.errors import BadInputError


def test_a_fake_clock_moves_only_when_told_and_both_readings_together() -> None:
    clock = FakeClock(start=100.0, monotonic_start=5.0)
    assert (clock.time(), clock.monotonic(), clock()) == (100.0, 5.0, 100.0)
    clock.advance(0.25)
    clock.sleep(0.5)  # the same, for code that takes a sleep function
    assert (clock.time(), clock.monotonic(), clock.elapsed) == (100.75, 5.75, 0.75)
    with pytest.raises(BadInputError, match="only moves forward"):
        clock.advance(-1)
    assert isinstance(clock, Clock)


def test_as_clock_takes_a_clock_a_bare_wall_time_function_or_none() -> None:
    fake = FakeClock()
    assert as_clock(fake) is fake and as_clock(None) is SYSTEM_CLOCK
    t = [7.0]
    wrapped = as_clock(lambda: t[0])  # the older clock= spelling: durations are differences of its values
    t[0] = 9.5
    assert (wrapped.time(), wrapped.monotonic(), wrapped()) == (9.5, 9.5, 9.5)
    with pytest.raises(BadInputError, match="clock="):
        as_clock(3.0)  # type: ignore[arg-type]


def test_the_system_clock_is_wall_time_and_perf_counter() -> None:
    assert abs(SYSTEM_CLOCK.time() - time.time()) < 1 and abs(SYSTEM_CLOCK() - time.time()) < 1
    a = SYSTEM_CLOCK.monotonic()
    assert abs(a - time.perf_counter()) < 1 and SYSTEM_CLOCK.monotonic() >= a


def test_a_fake_wall_clock_steps_either_way_while_monotonic_time_does_not():
    from gpulens.clock import FakeClock

    clock = FakeClock(start=1_800_000_000.0, monotonic_start=50.0)
    clock.advance(1.0)
    clock.step_wall(-3600.0)
    assert clock.time() == 1_800_000_001.0 - 3600.0 and clock() == clock.time() and clock.monotonic() == 51.0
    clock.step_wall(+7200.0)
    clock.advance(0.5)
    assert clock.time() == 1_800_000_001.5 + 3600.0 and clock.monotonic() == 51.5
