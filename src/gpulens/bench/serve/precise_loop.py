"""An asyncio event loop whose timers fire within tens of microseconds of their deadline.

A stock asyncio loop sleeps in epoll, whose timeout Python rounds *up* to whole milliseconds, so
a send scheduled at t leaves at t + 0–1 ms: too coarse for a schedule at 1,000 requests/s, and
enough on its own to put a "10 ms" answer outside 10 %. Here the loop's waits go through a
selector that

- sleeps in epoll only while the next timer is milliseconds away, rounded *down* so it wakes early;
- covers the rest with `select()` on the epoll descriptor itself, which takes microseconds and
  still returns as soon as any socket is ready;
- polls without sleeping for the last `SPIN_SECONDS` before a timer, because waking an idle CPU
  (a virtual one above all) takes longer than that;
- on Linux, sets the running thread's timer slack to 1 ns while the loop runs (`prctl`): by
  default the kernel may add 50 µs to any sleep to batch wake-ups, which a spin would have to cover.

No thread, no lock: the same loop, with a better idea of "now". The cost is the spin, at most
`SPIN_SECONDS` of CPU per timer that fires. Measured at 1,000 timers/s on a 2-core VM: with the
default slack a 0.3 ms spin was needed for a ~12 µs median lateness (a third of a core); with 1 ns
slack 0.1 ms gives the same (a sixth of a core). CPU a load tester burns spinning is CPU the
machine's other work (the server, above all, on one host) takes back as preemptions.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import math
import select
import selectors
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

SPIN_SECONDS = 0.0001
_EPOLL_FLOOR_SECONDS = 0.002  # below this, one precise select() is cheaper than epoll + select

T = TypeVar("T")


class PreciseSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The platform's default selector (epoll, kqueue) with sub-millisecond timeouts."""

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout > 0:
            wait = timeout - SPIN_SECONDS
            if wait >= _EPOLL_FLOOR_SECONDS:
                # epoll counts whole milliseconds and Python rounds up: ask for half a millisecond
                # less than the whole milliseconds in `wait`, so this wakes early, never late; the
                # loop then asks again with what is left.
                return super().select((math.floor(wait * 1e3) - 0.5) / 1e3)
            if wait > 0:
                select.select([self._selector.fileno()], [], [], wait)  # returns early if a socket is ready
            timeout = 0  # then poll without sleeping until the timer is due
        return super().select(timeout)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A precise loop where the platform's selector has a descriptor to wait on, else the default."""
    if not hasattr(selectors.DefaultSelector, "fileno"):  # poll() and select() selectors have none
        return asyncio.new_event_loop()
    return asyncio.SelectorEventLoop(PreciseSelector())


_PR_SET_TIMERSLACK, _PR_GET_TIMERSLACK = 29, 30  # linux/prctl.h


@contextlib.contextmanager
def fine_timer_slack() -> Iterator[bool]:
    """The calling thread's timer slack at 1 ns for the block, then back to what it was. Yields
    whether it could be set (Linux only; elsewhere, and in sandboxes that refuse prctl, nothing
    changes and the spin alone keeps the timers)."""
    prctl = _prctl()
    before = prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0) if prctl is not None else -1
    if before < 0 or prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(1), 0, 0, 0) != 0:  # type: ignore[misc]
        yield False
        return
    try:
        yield True
    finally:
        prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(before), 0, 0, 0)  # type: ignore[misc]


def _prctl() -> Any:
    if not hasattr(select, "epoll"):  # not Linux
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on a precise loop, with fine timer slack on this thread while it runs."""
    with fine_timer_slack(), asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
