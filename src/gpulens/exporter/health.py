"""The agent's own health: on /metrics, notifications that failed and whether the store's writes
fail; on /ready, whether the loop samples and the store takes writes. Read from memory at each
request, so they stay right while the store's disk is full."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpulens.exporter.readings import LatestReadings

NOTIFICATIONS_FAILED = "gpulens_notifications_failed"  # exposed as ..._total (a counter)
STORE_WRITE_FAILING = "gpulens_store_write_failing"


class HealthCollector:
    def __init__(self, readings: LatestReadings):
        self.readings = readings

    def collect(self) -> Iterator[Metric]:
        from gpulens.alerts.notify import notifications_failed

        failed = CounterMetricFamily(NOTIFICATIONS_FAILED, "Alert notifications given up on or dropped, by notifier.",
                                     labels=["notifier"])
        for kind, n in sorted({"webhook": 0, **notifications_failed()}.items()):
            failed.add_metric([kind], float(n))
        yield failed
        failing = GaugeMetricFamily(STORE_WRITE_FAILING, "1 while the store cannot be written (samples are buffered in memory).")
        failing.add_metric([], 1.0 if self.readings.store_write_failing else 0.0)
        yield failing


# /ready waits this many sampling intervals (at least READY_MIN_STALE_SECONDS) for a frame before it
# says the loop has stalled: one slow NVML call is not a stall, three missed ticks are.
READY_STALE_INTERVALS = 3
READY_MIN_STALE_SECONDS = 10.0


@dataclass(frozen=True)
class Readiness:
    """The answer of `/ready`: ready, or why not in one sentence (a 503 for Kubernetes' readiness probe)."""

    ready: bool
    reason: str


class ReadinessCheck:
    """Ready while the sampling loop has produced a frame within `stale_after_seconds` and the store's
    writes succeed. Liveness (`/health`) is only that the process answers; restarting the agent cures
    neither a hung driver nor a full disk, so those belong to readiness, not liveness."""

    def __init__(self, readings: LatestReadings, stale_after_seconds: float, *, has_store: bool = True,
                 clock: Callable[[], float] = time.monotonic):
        self.readings = readings
        self.stale_after_seconds = stale_after_seconds
        self.has_store = has_store
        self.clock = clock

    def __call__(self) -> Readiness:
        last = self.readings.last_frame_monotonic
        if last is None:
            return Readiness(False, "The sampling loop has not produced a frame yet.")
        age_s = self.clock() - last
        if age_s > self.stale_after_seconds:
            return Readiness(False, f"The sampling loop has produced no frame for {age_s:.1f} s "
                                    f"(more than {self.stale_after_seconds:g} s): the GPU backend may be hung.")
        if self.has_store and self.readings.store_write_failing:
            why = self.readings.store_write_error.rstrip(".") or "its writes fail"
            return Readiness(False, f"The store cannot be written: {why}.")
        return Readiness(True, "ready")


def stale_after_seconds(interval_seconds: float) -> float:
    return max(READY_STALE_INTERVALS * interval_seconds, READY_MIN_STALE_SECONDS)
