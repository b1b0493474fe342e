"""The agent: samples a GPU backend every interval, writes the store, feeds the exporter, and runs
the evaluators (alert rules) on a steady cadence. Stops cleanly with everything flushed."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gpulens.export.prometheus import LatestReadings
from gpulens.gpu.backend import GpuBackend
from gpulens.sampling import SampleWriter
from gpulens.store import Store

log = logging.getLogger(__name__)


class ColocationWatch:
    """Every few seconds, marks GPUs shared by a training job and a serving process (an Evaluator)."""

    def __init__(self, store: Store, every_seconds: float = 5.0):
        self.store = store
        self.every_seconds = every_seconds
        self._last: float | None = None

    def evaluate(self, now: float) -> None:
        if self._last is not None and now - self._last < self.every_seconds:
            return
        self._last = now
        from gpulens.diagnose.colocation import update_colocation_series

        update_colocation_series(self.store, now)

    def close(self) -> None:
        pass


class Evaluator(Protocol):
    """Something run after each flush with the current (sample) time, e.g. the alert runtime."""

    def evaluate(self, now: float) -> object: ...

    def close(self) -> None: ...


@dataclass
class AgentStats:
    ticks: int = 0
    values_written: int = 0
    xid_events: int = 0
    evaluations: int = 0
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    first_sample_t: float | None = None
    last_sample_t: float | None = None


class Agent:
    def __init__(
        self,
        backend: GpuBackend,
        store: Store,
        *,
        interval_seconds: float = 1.0,
        flush_seconds: float = 5.0,
        evaluate_seconds: float = 1.0,
        retention_check_seconds: float = 3600.0,
        keep_seconds: dict[str, float] | None = None,
        host: str | None = None,
        readings: LatestReadings | None = None,
        evaluators: list[Evaluator] | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.backend = backend
        self.store = store
        self.interval_seconds = interval_seconds
        # Commit once per flush_seconds: one transaction (and roll-up fold) for many ticks. A crash
        # loses at most that much; evaluators always see flushed data (they flush first).
        self.flush_seconds = max(flush_seconds, interval_seconds)
        self.evaluate_seconds = max(evaluate_seconds, interval_seconds)
        self.retention_check_seconds = retention_check_seconds
        self.keep_seconds = keep_seconds  # per table: raw, rollup_1m, rollup_1h, events (store defaults otherwise)
        self.writer = SampleWriter(store, host=host)
        self.readings = readings or LatestReadings(self.writer.host)
        self.evaluators = list(evaluators or [])
        self.clock = clock
        self.stop_event = threading.Event()
        self.stats = AgentStats()
        self._paced = bool(getattr(backend, "paced", False))
        self._models = {g.index: g.name for g in backend.gpus()}

    def stop(self) -> None:
        self.stop_event.set()

    def tick(self) -> int:
        """Sample once, write, and hand the readings to the exporter. Returns values written."""
        samples = self.backend.sample()
        if not samples:
            return 0
        n = self.writer.write_samples(samples)
        # For a replay, the exporter also shows the recorded time of what it serves.
        self.readings.update(samples, source_time=getattr(self.backend, "last_recorded_t", None))
        for ev in self.backend.drain_xid_events():
            log.warning("XID %d on GPU %d (%s)", ev.xid, ev.gpu, ev.uuid)
            self.writer.write_xid(ev, self._models.get(ev.gpu, ""))
            self.readings.add_xid(ev.gpu, ev.xid)
            self.stats.xid_events += 1
        self.stats.ticks += 1
        self.stats.values_written += n
        t = samples[0].t
        self.stats.first_sample_t = t if self.stats.first_sample_t is None else self.stats.first_sample_t
        self.stats.last_sample_t = t
        return n

    def _evaluate(self, now: float) -> None:
        for ev in self.evaluators:
            try:
                ev.evaluate(now)
            except Exception:  # an evaluator must never stop sampling
                log.exception("evaluator %r failed", ev)
        self.stats.evaluations += 1

    def run(self, duration_seconds: float | None = None) -> AgentStats:
        """Loop until stopped, the duration has passed, or a finite backend is exhausted."""
        wall0, cpu0 = time.monotonic(), time.process_time()
        next_tick = time.monotonic()
        last_flush = last_eval = last_retention = time.monotonic()
        sample_t_last_eval: float | None = None
        try:
            while not self.stop_event.is_set():
                if duration_seconds is not None and time.monotonic() - wall0 >= duration_seconds:
                    break
                if self.backend.exhausted:
                    break
                self.tick()
                now_m = time.monotonic()
                if self._paced:
                    # A replay carries its own clock: flush and evaluate on the recorded timeline.
                    t = self.stats.last_sample_t
                    if t is not None and (sample_t_last_eval is None or t - sample_t_last_eval >= self.evaluate_seconds):
                        self.store.flush()
                        self._evaluate(t)
                        sample_t_last_eval = t
                else:
                    if now_m - last_flush >= self.flush_seconds:
                        self.store.flush()
                        last_flush = now_m
                    if self.evaluators and now_m - last_eval >= self.evaluate_seconds:
                        self.store.flush()
                        self._evaluate(self.clock())
                        last_eval = now_m
                    if now_m - last_retention >= self.retention_check_seconds:
                        self.store.apply_retention(self.clock(), self.keep_seconds)
                        last_retention = now_m
                    next_tick += self.interval_seconds
                    delay = next_tick - time.monotonic()
                    if delay < 0:  # fell behind (a slow NVML call): skip, do not burst
                        next_tick = time.monotonic()
                        delay = 0
                    if self.stop_event.wait(delay):
                        break
        finally:
            self.store.flush()
            self.stats.wall_seconds = time.monotonic() - wall0
            self.stats.cpu_seconds = time.process_time() - cpu0
        return self.stats

    def close(self) -> None:
        for ev in self.evaluators:
            try:
                ev.close()
            except Exception:
                log.exception("evaluator %r failed to close", ev)
        self.backend.close()
        self.store.flush()
