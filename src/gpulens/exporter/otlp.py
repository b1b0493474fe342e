"""The node's metrics pushed to an OpenTelemetry Collector over OTLP/HTTP (`gpulens agent --otlp URL`),
through the OpenTelemetry SDK: a `MeterProvider` whose `PeriodicExportingMetricReader` hands each
collection to the SDK's `OTLPMetricExporter`, from the SDK's own thread (the sampling loop never waits
for a Collector).

What is exported is what `/metrics` shows, read the same way (docs/metrics.md, "OTLP"):
- GPU series: observable gauges (and observable counters for the GPU's counters), read from the
  agent's latest readings through the `/metrics` GPU collector, with the same labels as attributes;
- workload gauges and counters: from the `/metrics` workload collector (its counters cumulative);
- per-event distributions (step time and its parts, request latency, TTFT, TPOT, queue wait...):
  SDK histograms with explicit bucket boundaries equal to `vocab.names.HISTOGRAM_BUCKETS` (one `View`
  each), fed every value the `/metrics` tally counts, so both show the same count and sum.
Temporality is cumulative throughout. Counter instruments are named without `_total` (OpenTelemetry's
convention; a Collector's Prometheus exporter adds it back).

A Collector that cannot be reached or answers errors is logged once per cause (refused, timed out,
HTTP 503...) with the URL redacted, and once when exports work again; the SDK's own per-export lines
are silenced. Header values are never shown. Needs `gpulens[otel]` (imported only by an agent with --otlp)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gpulens.errors import UnavailableError
from gpulens.exporter.otlp_config import OtlpConfig
from gpulens.exporter.prometheus import GpuCollector, WorkloadCollector, WorkloadTally, _export_labels
from gpulens.exporter.readings import LatestReadings
from gpulens.http_client import redact_url
from gpulens.store import Store
from gpulens.store.types import SeriesKey
from gpulens.vocab import names as wn
from gpulens.vocab.gpu import (
    GPU_CLOCK_EVENT_ACTIVE,
    GPU_METRICS,
    GPU_PROCESS_COUNT,
    GPU_PROCESS_MEMORY,
    GPU_UP,
    GPU_XID_LAST,
    GPU_XID_TOTAL,
)

log = logging.getLogger(__name__)
SERVICE_NAME = "gpulens-agent"  # the resource's service.name
CLOSE_GRACE_SECONDS = 2.0  # the last export on a clean exit may take this long, no more
_SDK_LOGGERS = ("opentelemetry.exporter.otlp",)  # their per-export lines are replaced by ours, once per cause


def _import_sdk() -> dict[str, Any]:
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics import export as sdk_export
        from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
        from opentelemetry.sdk.resources import Resource
    except ImportError:
        raise UnavailableError("OTLP export needs the OpenTelemetry SDK, which is not installed.",
                               hint="Install it with pip install 'gpulens[otel]'.") from None
    return {"OTLPMetricExporter": OTLPMetricExporter, "MeterProvider": MeterProvider, "export": sdk_export,
            "View": View, "ExplicitBucketHistogramAggregation": ExplicitBucketHistogramAggregation, "Resource": Resource}


def gpu_instrument_names() -> tuple[list[str], list[str]]:
    """(gauges, counters) of the GPU collector's families, by family name (a counter's without `_total`)."""
    gauges = [GPU_UP, GPU_CLOCK_EVENT_ACTIVE, GPU_PROCESS_COUNT, GPU_PROCESS_MEMORY, GPU_XID_LAST]
    counters = [GPU_XID_TOTAL.removesuffix("_total")]
    for m in GPU_METRICS:
        (counters if m.is_counter else gauges).append(m.name.removesuffix("_total") if m.is_counter else m.name)
    return gauges, counters


def workload_instrument_names() -> tuple[list[str], list[str]]:
    """(gauges, counters) the workload collector may yield: every train_/infer_ series of the vocabulary
    that is not a distribution, plus the engines' means."""
    series = {v for k, v in vars(wn).items() if isinstance(v, str) and k.isupper() and not k.startswith(("EV_", "REC_"))
              and not k.endswith("_LABEL") and v.startswith(WorkloadCollector.PREFIXES)}
    series -= set(wn.HISTOGRAM_BUCKETS)
    counters = sorted(n.removesuffix("_total") for n in wn.WORKLOAD_COUNTERS)
    gauges = sorted((series - wn.WORKLOAD_COUNTERS) | set(wn.ENGINE_MEAN_SERIES.values()))
    return gauges, counters


class _Snapshot:
    """The /metrics collectors' families of one collection, by family name; each instrument's callback
    takes its own. Taken once per collection, before the SDK runs the callbacks."""

    def __init__(self, collectors: list[Any]):
        self.collectors = collectors
        self.families: dict[str, Any] = {}

    def take(self) -> None:
        fams: dict[str, Any] = {}
        for c in self.collectors:
            for fam in c.collect():
                if fam.type in ("gauge", "counter"):
                    fams[fam.name] = fam
        self.families = fams

    def callback(self, name: str) -> Callable[[Any], Iterator[Any]]:
        from opentelemetry.metrics import Observation

        def observe(options: Any) -> Iterator[Any]:
            fam = self.families.get(name)
            if fam is None:
                return
            for s in fam.samples:
                if fam.type == "counter" and not s.name.endswith("_total"):
                    continue  # a counter's `_created`, if any
                yield Observation(s.value, dict(s.labels))

        return observe


class _OncePerCause:
    """Failed exports said once per cause, and once when they work again."""

    def __init__(self, endpoint: str):
        self.shown = redact_url(endpoint)
        self.seen: set[str] = set()
        self.failing = False
        self.lock = threading.Lock()

    def failed(self, cause: str) -> None:
        with self.lock:
            self.failing = True
            if cause in self.seen:
                return
            self.seen.add(cause)
        log.warning("OTLP export to %s failed: %s; sampling goes on, and this cause is not logged again until "
                    "exports work.", self.shown, cause)

    def succeeded(self) -> None:
        with self.lock:
            was, self.failing = self.failing, False
            self.seen.clear()
        if was:
            log.warning("OTLP export to %s works again.", self.shown)


def _cause_of(error: BaseException | None, status: int | None, timeout_s: float) -> str:
    """A failure as words that hold no URL, header or body (they may carry secrets)."""
    if status is not None:
        return f"the Collector answered HTTP {status}"
    if error is None:
        return "the export failed"
    import requests

    if isinstance(error, requests.exceptions.Timeout):
        return f"no answer within {timeout_s:g} s"
    if isinstance(error, requests.exceptions.SSLError):
        return "the TLS handshake failed"
    if isinstance(error, requests.exceptions.ConnectionError):
        text = str(error).lower()  # read for its kind only, never shown
        if "refused" in text:
            return "the connection was refused (is a Collector listening there?)"
        if "name or service" in text or "resolve" in text or "nodename" in text:
            return "its host name does not resolve"
        return "it cannot be reached"
    return f"{type(error).__name__}"


def _build(config: OtlpConfig, sdk: dict[str, Any], outcome: _OncePerCause, prepare: Callable[[], None]) -> tuple[Any, Any]:
    """The SDK's exporter and periodic reader, wrapped to say failures once and to read the store
    before each collection."""
    import requests

    class CauseSession(requests.Session):
        """Remembers how the last request ended: an HTTP status or the exception (nothing of its text)."""

        last: tuple[BaseException | None, int | None] = (None, None)

        def request(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            try:
                resp = super().request(*args, **kwargs)
            except BaseException as e:
                self.last = (e, None)
                raise
            self.last = (None, None if resp.status_code < 400 else resp.status_code)
            return resp

    session = CauseSession()
    exp = sdk["export"]

    class Exporter(sdk["OTLPMetricExporter"]):  # type: ignore[misc]
        def export(self, metrics_data: Any, timeout_millis: float | None = 10_000, **kwargs: Any) -> Any:
            session.last = (None, None)
            try:
                result = super().export(metrics_data, timeout_millis=timeout_millis, **kwargs)
            except Exception as e:  # never into the SDK's thread as a traceback
                session.last = (e, None)
                result = exp.MetricExportResult.FAILURE
            if result == exp.MetricExportResult.SUCCESS:
                outcome.succeeded()
            else:
                outcome.failed(_cause_of(*session.last, config.timeout_seconds))
            return result

    class Reader(exp.PeriodicExportingMetricReader):  # type: ignore[misc,name-defined]
        def collect(self, timeout_millis: float = 10_000) -> None:
            try:
                prepare()
            except Exception as e:  # a store that cannot be read now: GPU readings still go out
                outcome.failed(f"the store could not be read ({type(e).__name__})")
            super().collect(timeout_millis=timeout_millis)

    temporality = {k: exp.AggregationTemporality.CUMULATIVE for k in _instrument_classes()}
    exporter = Exporter(endpoint=config.endpoint, headers=dict(config.headers), timeout=config.timeout_seconds,
                        session=session, preferred_temporality=temporality)
    reader = Reader(exporter, export_interval_millis=config.interval_seconds * 1000,
                    export_timeout_millis=config.timeout_seconds * 1000)
    return exporter, reader


def _instrument_classes() -> list[type]:
    from opentelemetry.sdk.metrics import (
        Counter,
        Histogram,
        ObservableCounter,
        ObservableGauge,
        ObservableUpDownCounter,
        UpDownCounter,
    )

    return [Counter, UpDownCounter, Histogram, ObservableCounter, ObservableUpDownCounter, ObservableGauge]


class OtlpExport:
    """Pushes the node's metrics to a Collector until `close()`. `tally` is the one `/metrics` counts
    with (shared, so both show the same histograms); it must be new, or `catch_up()` not yet called:
    every value it counts from then on is recorded here too."""

    def __init__(self, config: OtlpConfig, readings: LatestReadings, *, store: Store | None = None,
                 tally: WorkloadTally | None = None):
        sdk = _import_sdk()
        for name in _SDK_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)
        self.config = config
        self.outcome = _OncePerCause(config.endpoint)
        collectors: list[Any] = [GpuCollector(readings, "gpulens")]
        self.tally = tally
        if store is not None:
            self.tally = tally or WorkloadTally(store)
            collectors.append(WorkloadCollector(store, tally=self.tally))
        self._snapshot = _Snapshot(collectors)
        self._exporter, reader = _build(config, sdk, self.outcome, self._prepare)
        views = [sdk["View"](instrument_name=name, aggregation=sdk["ExplicitBucketHistogramAggregation"](boundaries=list(bounds)))
                 for name, bounds in wn.HISTOGRAM_BUCKETS.items()]
        resource = sdk["Resource"].create({"service.name": SERVICE_NAME, "host.name": readings.host})
        self.provider = sdk["MeterProvider"](metric_readers=[reader], resource=resource, views=views, shutdown_on_exit=False)
        meter = self.provider.get_meter("gpulens")
        self._declare(meter, store is not None)
        self._hist = {name: meter.create_histogram(name, description=f"gpulens workload distribution {name}")
                      for name in wn.HISTOGRAM_BUCKETS} if store is not None else {}
        if self.tally is not None:
            self.tally.listeners.append(self._record)

    def _declare(self, meter: Any, workload: bool) -> None:
        gauges, counters = gpu_instrument_names()
        if workload:
            wg, wc = workload_instrument_names()
            gauges, counters = gauges + wg, counters + wc
        for name in gauges:
            meter.create_observable_gauge(name, callbacks=[self._snapshot.callback(name)])
        for name in counters:
            meter.create_observable_counter(name, callbacks=[self._snapshot.callback(name)])

    def _record(self, key: SeriesKey, value: float) -> None:
        """One per-event value the tally counted (called under its lock, in whichever thread caught up)."""
        hist = self._hist.get(key.name)
        if hist is not None:
            hist.record(value, attributes=_export_labels(key.labels))

    def _prepare(self) -> None:
        if self.tally is not None:
            self.tally.catch_up()  # every value committed so far into the histograms, before they are read
        self._snapshot.take()

    def close(self) -> None:
        """One last export (bounded: a Collector that is away costs at most CLOSE_GRACE_SECONDS), then stop."""
        try:
            self.provider.shutdown(timeout_millis=CLOSE_GRACE_SECONDS * 1000)
        finally:
            if self.tally is not None and self._record in self.tally.listeners:
                self.tally.listeners.remove(self._record)

    @staticmethod
    def instrument_names() -> Iterable[str]:
        g, c = gpu_instrument_names()
        wg, wc = workload_instrument_names()
        return [*g, *c, *wg, *wc, *wn.HISTOGRAM_BUCKETS]
