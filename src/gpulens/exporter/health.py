"""The agent's own health on /metrics: notifications that failed, and whether the store's writes
fail. Read at each scrape from memory, so they stay right while the store's disk is full."""

from __future__ import annotations

from collections.abc import Iterator

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
