"""The one sampling loop of a node: read the GPU backend, hand each frame to the sinks, flush the
store and run the evaluating sinks on a steady cadence. `gpulens agent`, `demo`, `replay`, `record`
and `top` all run this loop (built by `pipeline.node.build_node`); only their sinks differ.

Pacing comes from the backend: a live backend (NVML, fake) is sampled every `interval_seconds` of
wall clock; a paced one (a replay) waits for each recorded moment itself, and flushing and
evaluation follow the recorded timeline instead, so a replay raises the alerts a live agent would.

Every wait, the loop's own and a replay's, is `wait_or_stop`: it ends at once on `stop()` (SIGTERM,
SIGINT) and at the end of the run's duration, so no recorded gap or interval outlasts either.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gpulens.errors import GpulensError, StoreError
from gpulens.gpu.backend import GpuBackend
from gpulens.gpu.types import GpuSample, XidEvent
from gpulens.store import Store

log = logging.getLogger(__name__)


class StopEvent(threading.Event):
    """The loop's stop: an Event that also wakes waits it cannot reach (a scrape blocked on a socket).
    Each `on_set` callback runs in a thread of its own when the event is set, so setting it from a
    signal handler never takes a lock the interrupted thread may hold."""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], None]] = []

    def on_set(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def set(self) -> None:
        super().set()
        for cb in list(self._callbacks):
            threading.Thread(target=cb, name="gpulens-stop", daemon=True).start()


@dataclass(frozen=True)
class Frame:
    """One reading of every GPU, the XID events seen with it, and (for a replay) its recorded time."""

    samples: list[GpuSample]
    xids: list[XidEvent] = field(default_factory=list)
    source_time: float | None = None

    @property
    def t(self) -> float:
        return self.samples[0].t


class Sink(Protocol):
    """Something the loop feeds. `on_frame` runs for every frame (keep it cheap); `on_tick` runs on the
    evaluation cadence, after the store was flushed, with the current time (the samples' time for a
    replay), for sinks whose `ticks` is true; `close` once at the end. A sink that raises is logged
    and never stops the loop. A live loop whose ticking sinks all have `reads_unflushed` true (they
    see what the store buffered, or need no fresh data) commits only every flush interval."""

    ticks: bool

    def on_frame(self, frame: Frame) -> None: ...

    def on_tick(self, now: float) -> None: ...

    def close(self) -> None: ...


@dataclass
class _WriteHealth:
    """Whether the store's writes fail (a full disk), and when to try again (exponential backoff)."""

    failing: bool = False
    backoff_seconds: float = 0.0
    retry_at: float = 0.0  # monotonic
    failures: int = 0


# Backoff between write attempts while the store fails: from 1 s, doubling, at most a minute.
WRITE_RETRY_FIRST_SECONDS = 1.0
WRITE_RETRY_MAX_SECONDS = 60.0


@dataclass
class LoopStats:
    ticks: int = 0
    values_written: int = 0
    xid_events: int = 0
    evaluations: int = 0
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    first_sample_t: float | None = None
    last_sample_t: float | None = None


class SamplingLoop:
    def __init__(
        self,
        backend: GpuBackend,
        sinks: list[Sink],
        *,
        store: Store | None = None,
        interval_seconds: float = 1.0,
        flush_seconds: float = 5.0,
        evaluate_seconds: float = 1.0,
        clock: Callable[[], float] = time.time,
        stop_event: StopEvent | None = None,
    ):
        self.backend = backend
        self.sinks = list(sinks)
        self.store = store
        self.interval_seconds = interval_seconds
        # Commit once per flush_seconds: one transaction (and roll-up fold) for many ticks. A crash
        # loses at most that much; evaluating sinks always see flushed data (the loop flushes first).
        self.flush_seconds = max(flush_seconds, interval_seconds)
        self.evaluate_seconds = max(evaluate_seconds, interval_seconds)
        self.clock = clock
        self.stop_event = stop_event if stop_event is not None else StopEvent()  # set: the run ends
        self.stats = LoopStats()
        self._failed: set[int] = set()
        self._ticking = [s for s in self.sinks if s.ticks]
        # Whether a live evaluation must commit first: yes unless every ticking sink reads the buffer.
        self._flush_before_tick = any(not getattr(s, "reads_unflushed", False) for s in self._ticking)
        self.write_health = _WriteHealth()

    def stop(self) -> None:
        self.stop_event.set()

    def _waiter(self, deadline: float | None) -> Callable[[float], bool]:
        """wait(seconds) -> True when the loop must end: stopped, or the duration's `deadline`
        (monotonic) reached. Never waits past the deadline."""

        def wait_or_stop(seconds: float) -> bool:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= seconds:
                    self.stop_event.wait(max(left, 0.0))
                    return True
            return self.stop_event.wait(max(seconds, 0.0))

        return wait_or_stop

    def _each(self, method: str, *args: object, sinks: list[Sink] | None = None) -> None:
        for sink in self.sinks if sinks is None else sinks:
            try:
                getattr(sink, method)(*args)
            except GpulensError as e:  # a known failure (e.g. the store's disk is full): its sentence, no traceback
                if id(sink) not in self._failed:
                    self._failed.add(id(sink))
                    log.warning("%s.%s failed: %s", type(sink).__name__, method, e)
                else:
                    log.debug("%s.%s failed: %s", type(sink).__name__, method, e)
            except Exception:  # a sink must never stop sampling; say so once per sink
                if id(sink) not in self._failed:
                    self._failed.add(id(sink))
                    log.exception("%s.%s failed (further failures of it are logged at debug level)", type(sink).__name__, method)
                else:
                    log.debug("%s.%s failed", type(sink).__name__, method, exc_info=True)

    def tick(self) -> Frame | None:
        """Sample once and feed the sinks. None when the backend gave nothing."""
        samples = self.backend.sample()
        if not samples:
            return None
        frame = Frame(samples, self.backend.drain_xid_events(), self.backend.source_time)
        for ev in frame.xids:
            log.warning("XID %d on GPU %d (%s)", ev.xid, ev.gpu, ev.uuid)
        self._each("on_frame", frame)
        s = self.stats
        s.ticks += 1
        s.xid_events += len(frame.xids)
        s.first_sample_t = frame.t if s.first_sample_t is None else s.first_sample_t
        s.last_sample_t = frame.t
        return frame

    def flush(self, *, force: bool = False) -> None:
        """Commit the store's buffer. When that fails (a full disk, another storage fault) the loop
        goes on: the rows stay buffered, the failure is logged once and told to the sinks
        (`on_store_health`: the GpulensStoreWriteFailing alert, /metrics), and writes are retried
        with backoff until one succeeds, which writes everything buffered."""
        store, h = self.store, self.write_health
        if store is None or (h.failing and not force and time.monotonic() < h.retry_at):
            return
        try:
            written = store.flush()
        except StoreError as e:
            h.failures += 1
            h.backoff_seconds = WRITE_RETRY_FIRST_SECONDS if not h.failing else min(h.backoff_seconds * 2, WRITE_RETRY_MAX_SECONDS)
            h.retry_at = time.monotonic() + h.backoff_seconds
            if not h.failing:
                h.failing = True
                log.error("%s Sampling, /metrics and the alert rules go on; new samples are kept in memory and "
                          "written once the store works again (retrying with backoff).", e)
                self._store_health(False, str(e))
            return
        if h.failing:
            h.failing = False
            log.warning("the store %s is writable again: %d buffered rows written after %d failed attempts",
                        store.path, written, h.failures)
            h.failures = 0
            self._store_health(True, "")

    def _store_health(self, writable: bool, message: str) -> None:
        sinks = [s for s in self.sinks if hasattr(s, "on_store_health")]
        self._each("on_store_health", writable, message, self.clock(), sinks=sinks)  # type: ignore[arg-type]

    def evaluate(self, now: float, *, flush: bool = True) -> None:
        if flush:
            self.flush()
        self._each("on_tick", now, sinks=self._ticking)
        self.stats.evaluations += 1

    def run(self, duration_seconds: float | None = None) -> LoopStats:
        """Loop until stopped, the duration has passed, or a finite backend is exhausted."""
        wall0, cpu0 = time.monotonic(), time.process_time()
        next_tick = last_flush = last_eval = time.monotonic()
        sample_t_last_eval: float | None = None
        paced = self.backend.paced
        wait = self._waiter(None if duration_seconds is None else wall0 + duration_seconds)
        hand_wait = getattr(self.backend, "wait_with", None)  # a replay waits for its frames through it
        if callable(hand_wait):
            hand_wait(wait)
        try:
            while not self.stop_event.is_set():
                if duration_seconds is not None and time.monotonic() - wall0 >= duration_seconds:
                    break
                if self.backend.exhausted:
                    break
                self.tick()
                if paced:
                    # A replay carries its own clock: flush and evaluate on the recorded timeline.
                    t = self.stats.last_sample_t
                    if t is not None and (sample_t_last_eval is None or t - sample_t_last_eval >= self.evaluate_seconds):
                        self.evaluate(t)
                        sample_t_last_eval = t
                    continue
                now_m = time.monotonic()
                # half a tick of slack: the tick that is due evaluates, whatever the jitter of the wait before it
                # (a strict >= skipped about one evaluation in three at 1 s)
                if self._ticking and now_m - last_eval >= self.evaluate_seconds - self.interval_seconds / 2:
                    flush = self._flush_before_tick or (self.store is not None and now_m - last_flush >= self.flush_seconds)
                    self.evaluate(self.clock(), flush=flush)
                    last_eval = now_m
                    last_flush = now_m if flush else last_flush
                elif self.store is not None and now_m - last_flush >= self.flush_seconds:
                    self.flush()
                    last_flush = now_m
                next_tick += self.interval_seconds
                delay = next_tick - time.monotonic()
                if delay < 0:  # fell behind (a slow NVML call): skip, do not burst
                    next_tick = time.monotonic()
                    delay = 0
                if wait(delay):
                    break
        finally:
            self.flush(force=True)
            self.stats.wall_seconds = time.monotonic() - wall0
            self.stats.cpu_seconds = time.process_time() - cpu0
        return self.stats

    def close(self) -> None:
        """Close every sink, then the backend; flush what is left."""
        self._each("close")
        self.backend.close()
        self.flush(force=True)  # what still cannot be written is the store's to report when it closes
