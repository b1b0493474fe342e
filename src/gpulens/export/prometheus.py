"""Prometheus exposition of the agent's latest readings (custom collectors, fresh families per scrape).

Two naming schemes: gpulens's own (base units, `_bytes`, `_ratio`, `_total`, labels gpu/uuid/model/host)
and dcgm-exporter's (`DCGM_FI_DEV_*` in DCGM's units, labels gpu/UUID/modelName/Hostname) so that
existing DCGM dashboards keep working. Workload series (train_*, infer_*) written to the store by
monitors in other processes are exported with their latest value while fresh.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Literal

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpulens.gpu.metrics import (
    GPU_CLOCK_EVENT_ACTIVE,
    GPU_METRICS,
    GPU_PROCESS_COUNT,
    GPU_PROCESS_MEMORY,
    GPU_UP,
    GPU_XID_LAST,
    GPU_XID_TOTAL,
    METRICS_BY_NAME,
    gpu_labels,
    sample_values,
)
from gpulens.gpu.types import GpuSample
from gpulens.store import Store

MetricNames = Literal["gpulens", "dcgm"]

_HELP_EXTRA = {
    GPU_UP: "1 while the GPU answers NVML, 0 once it is lost.",
    GPU_CLOCK_EVENT_ACTIVE: "1 while the clock-event (throttle) reason in label `reason` is active.",
    GPU_PROCESS_COUNT: "Compute processes on the GPU.",
    GPU_PROCESS_MEMORY: "GPU memory held by one compute process.",
    GPU_XID_TOTAL: "XID errors seen by this agent, by XID code.",
    GPU_XID_LAST: "Code of the last XID error seen (0 if none).",
}


class LatestReadings:
    """The newest sample of each GPU and the XID counts, shared by the agent loop and the scrapes."""

    def __init__(self, host: str):
        self.host = host
        self._lock = threading.Lock()
        self._samples: dict[int, GpuSample] = {}
        self._xids: dict[tuple[int, int], int] = {}
        self._xid_last: dict[int, int] = {}
        self.source_time: float | None = None  # recorded time of the newest sample (replays)

    def update(self, samples: list[GpuSample], source_time: float | None = None) -> None:
        with self._lock:
            for s in samples:
                self._samples[s.gpu] = s
            if source_time is not None:
                self.source_time = source_time

    def add_xid(self, gpu: int, xid: int) -> None:
        with self._lock:
            self._xids[(gpu, xid)] = self._xids.get((gpu, xid), 0) + 1
            self._xid_last[gpu] = xid

    def snapshot(self) -> tuple[list[GpuSample], dict[tuple[int, int], int], dict[int, int]]:
        with self._lock:
            return sorted(self._samples.values(), key=lambda s: s.gpu), dict(self._xids), dict(self._xid_last)


class GpuCollector:
    """Yields GPU metric families from `LatestReadings` at each scrape."""

    def __init__(self, readings: LatestReadings, metric_names: MetricNames = "gpulens"):
        self.readings = readings
        self.metric_names = metric_names

    def collect(self) -> Iterator[Metric]:
        samples, xids, xid_last = self.readings.snapshot()
        if self.metric_names == "dcgm":
            yield from self._collect_dcgm(samples, xid_last)
            return
        families: dict[str, Metric] = {}
        extra_label_names: dict[str, list[str]] = {}
        base_names = ["gpu", "uuid", "model", "host"]
        for s in samples:
            base = gpu_labels(s, self.readings.host)
            for name, extra, value in sample_values(s):
                fam = families.get(name)
                if fam is None:
                    spec = METRICS_BY_NAME.get(name)
                    help_text = spec.help if spec else _HELP_EXTRA.get(name, name)
                    extra_label_names[name] = sorted(extra)
                    labels = base_names + extra_label_names[name]
                    if spec is not None and spec.type == "counter":
                        fam = CounterMetricFamily(name, help_text, labels=labels)
                    else:
                        fam = GaugeMetricFamily(name, help_text, labels=labels)
                    families[name] = fam
                fam.add_metric([base[k] for k in base_names] + [extra[k] for k in extra_label_names[name]], value)  # type: ignore[attr-defined]
        yield from families.values()
        xid_total = CounterMetricFamily(GPU_XID_TOTAL, _HELP_EXTRA[GPU_XID_TOTAL], labels=base_names + ["xid"])
        last = GaugeMetricFamily(GPU_XID_LAST, _HELP_EXTRA[GPU_XID_LAST], labels=base_names)
        by_gpu = {s.gpu: gpu_labels(s, self.readings.host) for s in samples}
        for (gpu, xid), n in sorted(xids.items()):
            b = by_gpu.get(gpu)
            if b:
                xid_total.add_metric([b[k] for k in base_names] + [str(xid)], float(n))
        for s in samples:
            b = by_gpu[s.gpu]
            last.add_metric([b[k] for k in base_names], float(xid_last.get(s.gpu, 0)))
        yield xid_total
        yield last
        if self.readings.source_time is not None:
            src = GaugeMetricFamily(
                "gpulens_source_time_seconds", "Recorded time of the newest sample (for a replay: its time in the trace)."
            )
            src.add_metric([], self.readings.source_time)
            yield src

    def _collect_dcgm(self, samples: list[GpuSample], xid_last: dict[int, int]) -> Iterator[Metric]:
        names = ["gpu", "UUID", "modelName", "Hostname"]
        fams: dict[str, GaugeMetricFamily] = {}
        for s in samples:
            if s.lost:
                continue
            lv = [str(s.gpu), s.uuid, s.name, self.readings.host]
            for m in GPU_METRICS:
                v = getattr(s, m.field)
                if v is None or m.dcgm_name is None:
                    continue
                fam = fams.get(m.dcgm_name)
                if fam is None:
                    fam = fams[m.dcgm_name] = GaugeMetricFamily(m.dcgm_name, f"{m.help} (dcgm-exporter name and unit)", labels=names)
                fam.add_metric(lv, float(v) * m.dcgm_scale)
            fam = fams.get("DCGM_FI_DEV_XID_ERRORS")
            if fam is None:
                fam = fams["DCGM_FI_DEV_XID_ERRORS"] = GaugeMetricFamily(
                    "DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error (dcgm-exporter name)", labels=names
                )
            fam.add_metric(lv, float(xid_last.get(s.gpu, 0)))
        yield from fams.values()


class WorkloadCollector:
    """Latest value of each training / inference series in the store, while it is fresh."""

    PREFIXES = ("train_", "infer_")

    def __init__(self, store: Store, *, max_age_seconds: float = 120.0, clock: Callable[[], float] = time.time):
        self.store = store
        self.max_age_seconds = max_age_seconds
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        now = self.clock()
        for name in self.store.metric_names():
            if not name.startswith(self.PREFIXES):
                continue
            values = [v for v in self.store.latest(name) if now - v.t <= self.max_age_seconds]
            if not values:
                continue
            label_names = sorted({k for v in values for k in v.key.labels})
            cls = CounterMetricFamily if name.endswith("_total") else GaugeMetricFamily
            fam = cls(name, f"gpulens workload series {name}", labels=label_names)
            for v in values:
                fam.add_metric([v.key.labels.get(k, "") for k in label_names], v.value)
            yield fam


def make_registry(
    readings: LatestReadings, *, metric_names: MetricNames = "gpulens", store: Store | None = None
) -> CollectorRegistry:
    """A private registry (no global state) with the GPU collector, and the workload one when a store is given."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(readings, metric_names))  # type: ignore[arg-type]
    if store is not None and metric_names == "gpulens":
        registry.register(WorkloadCollector(store))  # type: ignore[arg-type]
    return registry


def serve_metrics(registry: CollectorRegistry, host: str, port: int):  # type: ignore[no-untyped-def]
    """Serve /metrics on host:port in a daemon thread. Returns the server (call .shutdown() to stop)."""
    from prometheus_client import start_http_server

    from gpulens.errors import PortInUseError

    try:
        result = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise PortInUseError(
            f"Cannot listen on {host}:{port}: {e.strerror or e}.",
            hint="Pick another address with --listen HOST:PORT (or stop whatever holds that port).",
        ) from None
    server = result[0] if isinstance(result, tuple) else result
    return server
