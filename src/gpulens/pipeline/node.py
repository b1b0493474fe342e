"""One node, wired once: `build_node(NodeConfig)` is what `gpulens agent`, `demo` (`make run`),
`replay`, `record` and `top` all call, so every door gets the same features.

    node = build_node(NodeConfig(backend="fake:2", store_path=Path("g.db"), listen=("127.0.0.1", 9464)))
    node.run(duration_seconds=30)
    node.close()

What a node is made of, in the order its sinks see each frame:
  backend (nvml | fake | replay) ─▶ sampling loop ─▶ trace events (replays) ─▶ store ─▶ workload
  records from the ingest socket ─▶ readings for /metrics ─▶ recording ─▶ view (top) ─▶ co-location
  watch ─▶ alert rules ─▶ engine scrapers
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from gpulens.errors import BadInputError
from gpulens.exporter.readings import LatestReadings
from gpulens.gpu.backend import GpuBackend
from gpulens.http_client import check_http_url
from gpulens.k8s.attribution import DeviceAttribution
from gpulens.k8s.node import node_host
from gpulens.pipeline.loop import Frame, LoopStats, SamplingLoop, Sink, StopEvent
from gpulens.pipeline.sinks import (
    ColocationWatch,
    EvaluatorSink,
    PodResourcesSink,
    ReadingsSink,
    RecorderSink,
    ScrapeSink,
    StoreSink,
    TraceEventsSink,
    ViewSink,
)
from gpulens.store import Store

if TYPE_CHECKING:
    from gpulens.exporter.prometheus import MetricNames
    from gpulens.webconfig import WebConfig  # (it loads ssl: only a node serving TLS needs it)


@dataclass
class AlertsConfig:
    learn_seconds: float = 7 * 86400.0
    rules_file: Path | None = None
    notify: list[str] = field(default_factory=list)


@dataclass
class NodeConfig:
    """Everything a door decides; each field has the default `gpulens agent` uses."""

    backend: str | GpuBackend | None = None  # a spec (nvml, fake[:N], replay[:PATH]) or a backend; None: nvml
    speed: float | None = 1.0  # replays: 1 = recorded pace, None = as fast as possible
    rebase: bool = True  # replays: shift the recording to start now (False keeps recorded times)
    loop: bool = False  # replays: start over at the end
    max_gap_seconds: float | None = None  # replays: the longest recorded gap played (None: replay_pacing's default)
    faults: list[str] = field(default_factory=list)  # fake backend: injected faults (gpu.fake.schedule_fault)
    store_path: Path | None = None  # None: no store (top, record)
    interval_seconds: float = 1.0
    evaluate_seconds: float = 1.0
    # Commits of the store: each has a fixed cost (the index page of every series is written again),
    # about a second's rows at 8 GPUs; a crash loses at most this much (Telegraf's flush_interval default)
    flush_seconds: float = 10.0
    keep_seconds: dict[str, float] | None = None  # retention per table (store defaults otherwise)
    host: str | None = None  # the host label; default: this machine's name ("replay" for imports)
    listen: tuple[str, int] | None = None  # where /metrics, /health and /ready are served (IPv4 or IPv6)
    web_config: WebConfig | None = None  # TLS and basic auth for them (the exporter-toolkit web-config file)
    ready_stale_seconds: float | None = None  # /ready: no frame for this long is a stall (default: 3 intervals, >= 10 s)
    metric_names: MetricNames = "gpulens"
    alerts: AlertsConfig | None = field(default_factory=AlertsConfig)  # None: no alert rules
    evaluators: list[Any] = field(default_factory=list)  # evaluators the caller holds (an AlertRuntime); not closed
    colocation: bool = True  # mark GPUs shared by training and serving
    replay_events: bool = True  # replays: feed the trace's workload events (steps, requests) in step
    import_context: Any = None  # replays: labels for imported workload events (workload.importers.ImportContext)
    scrape_urls: list[str] = field(default_factory=list)  # serving engines' /metrics (vLLM, TGI, Triton)
    scrape_service: str = "default"
    scrape_seconds: float = 5.0
    record_to: IO[str] | None = None  # a gpulens recording of every frame
    view: Callable[[Frame], None] | None = None  # called with every frame (top)
    # the kubelet's pod-resources socket: `pod` / `namespace` / `container` labels on GPU series
    pod_resources_socket: str | None = None
    pod_resources_seconds: float = 10.0
    single_writer: bool = False  # take the store's writer lock (agents): a second agent on it is refused
    # where workloads' monitors send their records (a workload.wire.AgentAddress: a Unix socket or
    # loopback TCP); None: nowhere. Needs a store: the records are written into it by the loop.
    ingest: Any = None
    ingest_limits: Any = None  # pipeline.ingest_server.IngestLimits; None: its defaults
    # an OpenTelemetry Collector the node's metrics are pushed to (exporter.otlp_config.OtlpConfig); None: none
    otlp: Any = None
    # set to end the run (signal handlers installed before the node is built hold it); None: the loop's own
    stop_event: StopEvent | None = None


@dataclass
class Node:
    config: NodeConfig
    backend: GpuBackend
    store: Store | None
    loop: SamplingLoop
    readings: LatestReadings
    sinks: list[Sink]
    trace_events: TraceEventsSink | None = None
    store_sink: StoreSink | None = None
    server: Any = None
    owns_store: bool = True
    writer_lock: Any = None  # store.writer_lock.WriterLock, held while the node runs
    ingest: Any = None  # pipeline.ingest_sink.IngestSink when the node takes workload records
    otlp: Any = None  # exporter.otlp.OtlpExport while the node pushes to a Collector

    @property
    def ingest_address(self) -> Any:
        """The address workloads send records to (workload.wire.AgentAddress), or None."""
        return self.ingest.server.address if self.ingest is not None else None

    @property
    def metrics_url(self) -> str | None:
        if self.server is None:
            return None
        host, port = self.server.server_address[:2]
        host = f"[{host}]" if ":" in host else host
        scheme = self.config.web_config.scheme if self.config.web_config is not None else "http"
        return f"{scheme}://{host}:{port}/metrics"

    def run(self, duration_seconds: float | None = None) -> LoopStats:
        stats = self.loop.run(duration_seconds)
        if self.trace_events is not None and self.backend.exhausted:
            self.trace_events.finish()  # a trace's workload may outlast its telemetry
        stats.values_written = self.store_sink.values_written if self.store_sink else 0
        return stats

    def stop(self) -> None:
        self.loop.stop()

    def close(self) -> None:
        try:
            self.loop.close()
        finally:
            if self.otlp is not None:
                self.otlp.close()  # the last export reads the store: before it closes
            if self.server is not None:
                self.server.shutdown()
                self.server.server_close()
            try:
                if self.store is not None and self.owns_store:
                    self.store.close()  # a last write that fails (a full disk) still raises, after the lock goes
            finally:
                if self.writer_lock is not None:
                    self.writer_lock.release()


def _open_backend(config: NodeConfig) -> GpuBackend:
    from gpulens.gpu import FakeBackend, open_backend

    be = config.backend if config.backend is not None and not isinstance(config.backend, str) else open_backend(
        config.backend, speed=config.speed, rebase=config.rebase, loop=config.loop, max_gap_seconds=config.max_gap_seconds
    )
    if config.faults:
        if not isinstance(be, FakeBackend):
            raise BadInputError("--fault works only with the fake backend.", hint="Add --backend fake or fake:N.")
        from gpulens.gpu.fake import schedule_fault

        for spec in config.faults:
            schedule_fault(be, spec)
    return be


def build_node(config: NodeConfig, *, store: Store | None = None) -> Node:
    """Open the backend and the store, wire the sinks, and start serving /metrics (when `listen`).
    Pass `store` to use an open one (the node then leaves it open)."""
    lock = None
    if config.single_writer and config.store_path is not None:
        from gpulens.store.writer_lock import WriterLock

        lock = WriterLock(config.store_path).acquire()
    try:
        backend = _open_backend(config)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    owns_store = store is None
    if store is None and config.store_path is not None:
        try:
            store = Store(config.store_path)
        except BaseException:
            backend.close()
            if lock is not None:
                lock.release()
            raise
    host = node_host(config.host)
    attribution = DeviceAttribution() if config.pod_resources_socket else None
    readings = LatestReadings(host=host, gpus=backend.gpus(), attribution=attribution)
    sinks: list[Sink] = []
    trace_events = store_sink = ingest = otlp = None
    try:
        if store is not None:
            if config.replay_events and getattr(backend, "events_path", None) is not None:
                from gpulens.gpu.replay import iter_events
                from gpulens.workload.importers import ImportContext

                ctx = config.import_context or ImportContext()
                # a live replay's workload lands beside its samples, under the node's host (the recording's own
                # host maps onto it), with the replayed GPU's model (MFU's peak)
                ctx.host = ctx.host or host
                recorded = getattr(backend, "recorded_host", None)
                if recorded:
                    ctx.host_map.setdefault(recorded, ctx.host)
                ctx.gpu_model = ctx.gpu_model or next((g.name for g in backend.gpus()), "")
                trace_events = TraceEventsSink(backend, store, ctx, list(iter_events(backend.events_path)))  # type: ignore[attr-defined]
                sinks.append(trace_events)  # before the samples of the same moment, as recorded
            models = {g.index: g.name for g in backend.gpus()}
            store_sink = StoreSink(store, host=host, keep_seconds=config.keep_seconds, gpu_models=models)
            sinks.append(store_sink)
            if config.ingest is not None:
                from gpulens.pipeline.ingest_server import IngestLimits, IngestServer
                from gpulens.pipeline.ingest_sink import IngestSink

                ingest = IngestSink(store, IngestServer(config.ingest, config.ingest_limits or IngestLimits()), host=host)
                sinks.append(ingest)
        sinks.append(ReadingsSink(readings))
        if attribution is not None:
            sinks.append(_pod_resources_sink(config, attribution))
        if config.record_to is not None:
            sinks.append(RecorderSink(config.record_to, backend))
        if config.view is not None:
            sinks.append(ViewSink(config.view))
        scrapers: list[Any] = []
        if store is not None:
            if config.colocation:
                sinks.append(ColocationWatch(store))  # before the alert rules, which read its series
            if config.alerts is not None:
                # live: the rules read the loop's buffer, so the store commits every flush interval
                recent = None if backend.paced else 2 * max(config.flush_seconds, config.interval_seconds) + 2 * config.evaluate_seconds
                sinks.append(EvaluatorSink(_alert_runtime(store, config.alerts, recent)))
            sinks += [EvaluatorSink(ev, owned=False) for ev in config.evaluators]
            if config.scrape_urls:
                from gpulens.workload.inference.scrape import EngineScraper

                for url in config.scrape_urls:
                    check_scrape_url(url)
                    scraper = EngineScraper(url, store, service=config.scrape_service)
                    scraper.scrape_once()  # a wrong URL fails here, at once
                    scrapers.append(scraper)
                sinks.append(ScrapeSink(scrapers, config.scrape_seconds))
        loop = SamplingLoop(backend, sinks, store=store, interval_seconds=config.interval_seconds,
                            evaluate_seconds=config.evaluate_seconds, flush_seconds=config.flush_seconds,
                            stop_event=config.stop_event)
        for sink in sinks:
            if isinstance(sink, ScrapeSink):
                loop.stop_event.on_set(sink.interrupt)  # SIGTERM cuts a scrape blocked on its socket
        node = Node(config, backend, store, loop, readings, sinks, trace_events, store_sink, owns_store=owns_store,
                    writer_lock=lock, ingest=ingest)
        tally = None
        if store is not None and (config.listen is not None or config.otlp is not None):
            # the exporter (and prometheus_client) load only for a node that serves /metrics or pushes OTLP
            from gpulens.exporter.prometheus import WorkloadTally

            tally = WorkloadTally(store)  # one count of the workload's distributions, for both
        if config.otlp is not None:
            from gpulens.exporter.otlp import OtlpExport

            otlp = OtlpExport(config.otlp, readings, store=store, tally=tally)  # before the catch-up: it sees every value
            node.otlp = otlp
        if tally is not None:
            tally.catch_up()  # count what the store already holds before the first scrape (and export)
        if config.listen is not None:
            from gpulens.exporter.health import ReadinessCheck, stale_after_seconds
            from gpulens.exporter.prometheus import make_registry, serve_metrics

            registry = make_registry(readings, metric_names=config.metric_names, store=store, scrapers=scrapers, tally=tally,
                                     ingest_counters=ingest.server.counters if ingest is not None else None)
            stale_s = config.ready_stale_seconds or stale_after_seconds(config.interval_seconds)
            ready = ReadinessCheck(readings, stale_s, has_store=store is not None)
            node.server = serve_metrics(registry, *config.listen, web_config=config.web_config, readiness=ready)
        return node
    except BaseException:
        if otlp is not None:
            otlp.close()
        if ingest is not None:
            ingest.server.close()
        backend.close()
        if store is not None and owns_store:
            store.close()
        if lock is not None:
            lock.release()
        raise


def _pod_resources_sink(config: NodeConfig, attribution: DeviceAttribution) -> Sink:
    from gpulens.k8s.podresources import PodResourcesClient, PodResourcesPoller

    client = PodResourcesClient(config.pod_resources_socket or "")
    try:
        attribution.replace(client.list_devices())  # a wrong socket fails here, at once
    except BaseException:
        client.close()
        raise
    return PodResourcesSink(PodResourcesPoller(client, attribution), config.pod_resources_seconds)
def check_scrape_url(url: str) -> None:
    """An engine's /metrics address must be http(s)://HOST[:PORT]/...: anything else is one sentence."""
    check_http_url(url, "--scrape", "the engine's metrics address, e.g. --scrape http://127.0.0.1:8000/metrics")


def _alert_runtime(store: Store, cfg: AlertsConfig, recent_seconds: float | None = None) -> Any:
    from gpulens.alerts.runtime import AlertRuntime

    return AlertRuntime(store, learn_seconds=cfg.learn_seconds, rules_file=cfg.rules_file, notify=list(cfg.notify),
                        recent_seconds=recent_seconds)
