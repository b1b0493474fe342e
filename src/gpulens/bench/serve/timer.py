"""Sub-millisecond wake-ups for an asyncio loop.

asyncio sleeps through epoll, whose timeout Python rounds *up* to whole milliseconds, so a send
scheduled at t leaves at t + 0–1 ms plus the loop's own work: too coarse for a schedule at 1,000
requests/s, where sends are 1 ms apart. A thread waiting on a condition variable wakes within tens
of microseconds of its deadline and pokes the loop through `call_soon_threadsafe` (the loop's
self-pipe), which returns from epoll at once. No busy waiting anywhere.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import sys
import threading
import time
from collections.abc import Callable
from typing import Any


class PreciseTimer:
    """Runs callbacks on `loop` at `time.perf_counter()` deadlines. Use as a context manager."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, switch_interval_seconds: float | None = 0.0002):
        self._loop = loop
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._running = True
        self._thread = threading.Thread(target=self._main, name="gpulens-timer", daemon=True)
        # The timer thread needs the GIL to poke the loop; a short switch interval bounds how long
        # a busy loop thread can hold it (the default 5 ms would be the send lag under load).
        self._switch = switch_interval_seconds
        self._old_switch = sys.getswitchinterval()

    def __enter__(self) -> PreciseTimer:
        if self._switch is not None:
            sys.setswitchinterval(self._switch)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._cond:
            self._running = False
            self._cond.notify()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=1)
        if self._switch is not None:
            sys.setswitchinterval(self._old_switch)

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> None:
        with self._cond:
            heapq.heappush(self._heap, (when, next(self._seq), callback, args))
            if self._heap[0][0] == when:
                self._cond.notify()

    async def sleep_until(self, when: float) -> None:
        if when <= time.perf_counter():
            return
        fut = self._loop.create_future()
        self.call_at(when, _resolve, fut)
        await fut

    def _main(self) -> None:
        cond = self._cond
        with cond:
            while self._running:
                if not self._heap:
                    cond.wait()
                    continue
                delay = self._heap[0][0] - time.perf_counter()
                if delay > 0:
                    cond.wait(delay)
                    continue
                _when, _seq, cb, args = heapq.heappop(self._heap)
                try:
                    self._loop.call_soon_threadsafe(cb, *args)
                except RuntimeError:  # the loop closed under us
                    return


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)
