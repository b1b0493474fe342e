"""`gpulens_desired_replicas{service}` on /metrics: the replica count the HPA rule asks for now, per
service that served a request recently (`gpulens.scaling`, docs/scale.md). The collector keeps each
service's scale-down stabilization between scrapes, as an HPA keeps it between its evaluations."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from gpulens.scaling import ScalePolicy, ServiceScaler, Targets
from gpulens.scaling.desired import DEFAULT_WINDOW_SECONDS
from gpulens.scaling.signals import request_log
from gpulens.store import Store
from gpulens.vocab import names as wn

DESIRED_REPLICAS = "gpulens_desired_replicas"


class ScalingCollector:
    def __init__(self, store: Store, *, clock: Callable[[], float] = time.time, window_seconds: float = DEFAULT_WINDOW_SECONDS,
                 targets: Targets | None = None, policy: ScalePolicy | None = None):
        self.store, self.clock, self.window_seconds = store, clock, window_seconds
        self.targets, self.policy = targets or Targets(), policy or ScalePolicy()
        self._scalers: dict[str, ServiceScaler] = {}
        self._lock = threading.Lock()  # scrapes may overlap; the stabilizer's history is shared

    def _active_services(self, now: float) -> list[str]:
        # A service is shown while its last request is within the window and the stabilization window.
        horizon = self.window_seconds + self.policy.stabilization_seconds
        return sorted({v.key.labels["service"] for v in self.store.latest(wn.INFER_LATENCY_SECONDS)
                       if v.key.labels.get("service") and now - v.t <= horizon})

    def collect(self) -> Iterator[Metric]:
        now = self.clock()
        fam = GaugeMetricFamily(DESIRED_REPLICAS, "Replicas the HPA rule asks for now (scale-down stabilized), per service.",
                                labels=["service"])
        with self._lock:
            for service in self._active_services(now):
                log = request_log(self.store, service, start=now - self.window_seconds, end=now)
                scaler = self._scalers.get(service)
                if scaler is None:
                    scaler = self._scalers[service] = ServiceScaler(service, log, window_seconds=self.window_seconds,
                                                                    targets=self.targets, policy=self.policy)
                scaler.log = log
                fam.add_metric([service], float(scaler.at(now).desired_replicas))
        if fam.samples:
            yield fam
