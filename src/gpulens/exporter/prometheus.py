"""Prometheus exposition of a node: the agent's latest GPU readings and the workload series that
monitors in other processes write to the store (custom collectors, fresh families per scrape).

The contract (docs/metrics.md, tested against a real Prometheus that scrapes an agent):
- no exported label is named `job` or `instance` (a scrape owns them): training series carry `train_job`;
- per-event distributions (request latency, TTFT, TPOT, inter-token latency, queue wait, step time and
  its parts) are Prometheus histograms counted from every sample in the store, so `histogram_quantile`
  is right over any window and aggregation; engine histograms read by `--scrape` are passed through;
- counters are typed `counter` in both naming modes;
- `--metric-names dcgm` renames the GPU families only (dcgm-exporter's names, units and labels, the
  host as `Hostname`); `gpu_up` and `gpu_xid_errors_total` (DCGM has no XID counter) keep their names
  but carry dcgm's labels, so `on(UUID)` joins them to DCGM series; a GPU in MIG mode is exported as
  its instances for the fields they have (as dcgm-exporter's default), never both; every workload
  series keeps its names and labels.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Literal

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpulens.exporter.health import HealthCollector, Readiness
from gpulens.exporter.ranks import RankInfoCollector
from gpulens.exporter.readings import LatestReadings
from gpulens.exporter.scaling import ScalingCollector
from gpulens.gpu.metrics import MIG_METRICS, gpu_labels, sample_values
from gpulens.gpu.types import GpuSample
from gpulens.k8s.attribution import POD_LABELS, index_id
from gpulens.store import Store
from gpulens.store.types import SeriesKey, canonical_labels
from gpulens.vocab import names as wn
from gpulens.vocab.gpu import (
    DCGM_HELP,
    DCGM_XID_ERRORS,
    GPU_CLOCK_EVENT_ACTIVE,
    GPU_METRICS,
    GPU_PROCESS_COUNT,
    GPU_PROCESS_MEMORY,
    GPU_UP,
    GPU_XID_LAST,
    GPU_XID_TOTAL,
    METRICS_BY_NAME,
)
from gpulens.webconfig import WebConfig

MetricNames = Literal["gpulens", "dcgm"]

_HELP_EXTRA = {
    GPU_UP: "1 while the GPU answers NVML, 0 once it is lost.",
    GPU_CLOCK_EVENT_ACTIVE: "1 while the clock-event (throttle) reason in label `reason` is active.",
    GPU_PROCESS_COUNT: "Compute processes on the GPU.",
    GPU_PROCESS_MEMORY: "GPU memory held by one compute process.",
    GPU_XID_TOTAL: "XID errors seen by this agent, by XID code.",
    GPU_XID_LAST: "Code of the last XID error seen (0 if none).",
}
# The fields a MIG instance is read for: in dcgm mode a MIG GPU's values of these are its instances'.
_MIG_FIELDS = frozenset(m.field for m in MIG_METRICS)
# dcgm-exporter's host label (its releases; an unreleased HEAD renamed it `hostname`).
DCGM_HOST_LABEL = "Hostname"
# Labels a scrape owns; an exported label of either name would come back as exported_job/_instance.
RESERVED_LABELS = frozenset({"job", "instance"})


class GpuCollector:
    """Yields GPU metric families from `LatestReadings` at each scrape.

    With pod attribution on (`readings.attribution`), every GPU and process series also carries
    `pod`, `namespace` and `container`: one series per container that holds the GPU ("" for none)."""

    def __init__(self, readings: LatestReadings, metric_names: MetricNames = "gpulens"):
        self.readings = readings
        self.metric_names = metric_names

    def _holders(self, device_id: str, index: str) -> list[dict[str, str]]:
        """The pod label sets of one device (by UUID, or by index where the device plugin reports
        indices): [{}] without attribution, one per holding container with it."""
        att = self.readings.attribution
        if att is None:
            return [{}]
        return [c.labels() for c in att.containers(device_id, index)] or [dict.fromkeys(POD_LABELS, "")]

    def _base_names(self) -> list[str]:
        return ["gpu", "uuid", "model", "host", *(POD_LABELS if self.readings.attribution is not None else ())]

    def collect(self) -> Iterator[Metric]:
        samples, xids, xid_last = self.readings.snapshot()
        if self.metric_names == "dcgm":
            yield from self._collect_dcgm(samples, xid_last)
            yield from self._dcgm_up_and_xids(samples, xids)
            return
        families: dict[str, Metric] = {}
        extra_label_names: dict[str, list[str]] = {}
        base_names = self._base_names()
        for s in samples:
            holders = self._holders(s.uuid, index_id(s.gpu))
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
                for pod in holders:
                    base = {**gpu_labels(s, self.readings.host), **pod}
                    fam.add_metric([base[k] for k in base_names] + [extra[k] for k in extra_label_names[name]], value)  # type: ignore[attr-defined]
        yield from families.values()
        yield self._xid_counter(samples, xids)
        last = GaugeMetricFamily(GPU_XID_LAST, _HELP_EXTRA[GPU_XID_LAST], labels=base_names)
        for s in samples:
            for pod in self._holders(s.uuid, index_id(s.gpu)):
                b = {**gpu_labels(s, self.readings.host), **pod}
                last.add_metric([b[k] for k in base_names], float(xid_last.get(s.gpu, 0)))
        yield last
        if self.readings.source_time is not None:
            src = GaugeMetricFamily(
                "gpulens_source_time_seconds", "Recorded time of the newest sample (for a replay: its time in the trace)."
            )
            src.add_metric([], self.readings.source_time)
            yield src

    def _xid_counter(self, samples: list, xids: dict[tuple[int, int], int]) -> Metric:
        base_names = self._base_names()
        xid_total = CounterMetricFamily(GPU_XID_TOTAL, _HELP_EXTRA[GPU_XID_TOTAL], labels=base_names + ["xid"])
        by_gpu = {s.gpu: s for s in samples}
        for (gpu, xid), n in sorted(xids.items()):
            s = by_gpu.get(gpu)
            if s is None:
                continue
            for pod in self._holders(s.uuid, index_id(s.gpu)):
                b = {**gpu_labels(s, self.readings.host), **pod}
                xid_total.add_metric([b[k] for k in base_names] + [str(xid)], float(n))
        return xid_total

    def _dcgm_up_and_xids(self, samples: list[GpuSample], xids: dict[tuple[int, int], int]) -> Iterator[Metric]:
        """gpulens's own `gpu_up` and XID counter, which DCGM's names lack (its rules need them), under
        dcgm-exporter's labels, so `gpu_up * on(UUID) group_left DCGM_FI_DEV_GPU_TEMP` joins."""
        up = Metric(GPU_UP, _HELP_EXTRA[GPU_UP], "gauge")
        xid_total = Metric(GPU_XID_TOTAL.removesuffix("_total"), _HELP_EXTRA[GPU_XID_TOTAL], "counter")
        by_gpu = {s.gpu: s for s in samples}
        for s in samples:
            for pod in self._holders(s.uuid, index_id(s.gpu)):
                up.add_sample(GPU_UP, {**self._dcgm_labels(s), **pod}, 0.0 if s.lost else 1.0)
        for (gpu, xid), n in sorted(xids.items()):
            s = by_gpu.get(gpu)
            if s is not None:
                for pod in self._holders(s.uuid, index_id(s.gpu)):
                    xid_total.add_sample(GPU_XID_TOTAL, {**self._dcgm_labels(s), **pod, "xid": str(xid)}, float(n))
        yield up
        yield xid_total

    def _dcgm_labels(self, s: GpuSample) -> dict[str, str]:
        """dcgm-exporter's labels for one GPU. The host is `Hostname`, as dcgm-exporter's releases write
        it (one spelling: two would double every series a `by (Hostname, hostname)` keeps apart)."""
        info = self.readings.infos.get(s.gpu)
        labels = {"gpu": str(s.gpu), "UUID": s.uuid, "modelName": s.name, DCGM_HOST_LABEL: self.readings.host}
        if info is not None:
            if info.pci_bus_id:
                labels["pci_bus_id"] = info.pci_bus_id
            if info.minor_number is not None:
                labels["device"] = f"nvidia{info.minor_number}"
            if info.driver_version:
                labels["DCGM_FI_DRIVER_VERSION"] = info.driver_version
        return labels

    def _collect_dcgm(self, samples: list[GpuSample], xid_last: dict[int, int]) -> Iterator[Metric]:
        fams: dict[str, Metric] = {}

        def add(name: str, help_text: str, counter: bool, labels: dict[str, str], value: float) -> None:
            fam = fams.get(name)
            if fam is None:
                # dcgm-exporter's counters keep their names (no `_total` added): see exposition.py
                fam = fams[name] = Metric(name, DCGM_HELP.get(name, help_text), "counter" if counter else "gauge")
            fam.add_sample(name, labels, value)

        for s in samples:
            if s.lost:
                continue
            gpu_lv = self._dcgm_labels(s)
            # In MIG mode dcgm-exporter's default emits the instances, not the parent, for the fields
            # an instance has (memory, GPM): a sum over the GPU's UUID then counts its memory once.
            per_instance = _MIG_FIELDS if s.mig_instances else frozenset()
            for pod in self._holders(s.uuid, index_id(s.gpu)):
                lv = {**gpu_lv, **pod}
                for m in GPU_METRICS:
                    v = getattr(s, m.field)
                    if v is None or m.dcgm_name is None or m.field in per_instance:
                        continue
                    for name, scale in ((m.dcgm_name, m.dcgm_scale), *m.dcgm_aliases):
                        add(name, f"{m.help} (dcgm-exporter name and unit)", m.is_counter, lv, float(v) * scale)
                add(DCGM_XID_ERRORS, "Value of the last XID error (dcgm-exporter name)", False, lv,
                    float(xid_last.get(s.gpu, 0)))
            for k, mig in enumerate(s.mig_instances or ()):
                # a MIG instance is its own entity: the GPU's labels plus GPU_I_ID / GPU_I_PROFILE
                mig_lv = {**gpu_lv, "GPU_I_ID": str(mig.gpu_instance_id), "GPU_I_PROFILE": mig.profile}
                slot = mig.device_index if mig.device_index is not None else k  # a recording may lack the slot
                for pod in self._holders(mig.uuid, index_id(s.gpu, slot)):
                    for m in MIG_METRICS:
                        v = getattr(mig, m.field)
                        if v is not None and m.dcgm_name is not None:
                            add(m.dcgm_name, f"{m.help} (dcgm-exporter name and unit)", m.is_counter, {**mig_lv, **pod},
                                float(v) * m.dcgm_scale)
        yield from fams.values()


class WorkloadTally:
    """Counts every per-event workload sample in the store into cumulative histograms (and request
    counts), following the store's commits (`Store.samples_after`), whichever process wrote them.

    Counting starts from everything the store keeps, so an agent restarted on the same store goes on
    from the same totals; retention deleting old samples shows up as a counter reset. Series carrying a
    `quantile` label (an engine's percentiles kept by `--scrape`) are left out: the engine's own
    histogram is passed through instead.

    `listeners` are called with each per-event value counted into a histogram (series, value), in
    the thread that catches up, under the tally's lock: the OTLP export records the same values."""

    def __init__(self, store: Store):
        self.store = store
        self.listeners: list[Callable[[SeriesKey, float], None]] = []
        self._lock = threading.Lock()
        self._cursor = 0
        # series -> [cumulative bucket counts..., +Inf count], sum
        self._hist: dict[SeriesKey, tuple[list[int], list[float]]] = {}
        self._counts: dict[SeriesKey, int] = {}
        self._names = [*wn.HISTOGRAM_BUCKETS, *wn.WORKLOAD_COUNTERS]

    def catch_up(self) -> None:
        with self._lock:
            while True:
                rows, cursor = self.store.samples_after(self._names, self._cursor)
                if not rows:
                    return
                self._cursor = cursor
                for key, _t, value in rows:
                    self._add(key, value)

    def _add(self, key: SeriesKey, value: float) -> None:
        if "source" in key.labels or "quantile" in key.labels:
            return  # read from an engine: its own counter and histogram are exported instead
        bounds = wn.HISTOGRAM_BUCKETS.get(key.name)
        if bounds is None:  # a counter sample: one per finished request, whichever worker counted it
            key = _without_pid(key)
            self._counts[key] = self._counts.get(key, 0) + 1
            return
        if not math.isfinite(value):
            return
        h = self._hist.get(key)
        if h is None:
            h = self._hist[key] = ([0] * (len(bounds) + 1), [0.0])
        counts = h[0]
        for i, b in enumerate(bounds):  # cumulative: every bucket whose bound holds the value
            if value <= b:
                counts[i] += 1
        counts[-1] += 1
        h[1][0] += value
        for listener in self.listeners:
            listener(key, value)

    def snapshot(self) -> tuple[dict[SeriesKey, tuple[list[int], float]], dict[SeriesKey, int]]:
        self.catch_up()
        with self._lock:
            return {k: (list(c), s[0]) for k, (c, s) in self._hist.items()}, dict(self._counts)


class WorkloadCollector:
    """Training and inference series from the store: distributions as histograms, the request counter
    as a counter, and every other series (throughput, ratios, memory, queue depth) as its latest value
    while fresh."""

    PREFIXES = ("train_", "infer_")

    def __init__(self, store: Store, *, max_age_seconds: float = 120.0, clock: Callable[[], float] = time.time,
                 tally: WorkloadTally | None = None):
        self.store = store
        self.max_age_seconds = max_age_seconds
        self.clock = clock
        self.tally = tally or WorkloadTally(store)

    def collect(self) -> Iterator[Metric]:
        hists, counts = self.tally.snapshot()
        yield from _histogram_families(hists)
        now = self.clock()
        yield from self._engine_means(now)
        means = set(wn.ENGINE_MEAN_SERIES.values())
        for name in self.store.metric_names():
            if not name.startswith(self.PREFIXES) or name in wn.HISTOGRAM_BUCKETS or name in means:
                continue
            latest = self.store.latest(name)
            if name in wn.WORKLOAD_COUNTERS:
                rows = [(key.labels, float(n)) for key, n in sorted(counts.items(), key=lambda kv: kv[0].labels_json)
                        if key.name == name]
                rows += [(v.key.labels, v.value) for v in latest if "source" in v.key.labels]  # an engine's own, by --scrape
                if name == wn.INFER_REQUESTS_TOTAL:
                    rows = _every_status(rows)
                fam = Metric(name.removesuffix("_total"), f"gpulens workload counter {name}", "counter")
                for labels, value in rows:
                    fam.add_sample(name, _export_labels(labels), value)
                if fam.samples:
                    yield fam
                continue
            values = [(v.key.labels, v.value) for v in latest if now - v.t <= self.max_age_seconds]
            if not values:
                continue
            if name in wn.PER_PROCESS_SERIES:
                values = _summed_over_pids(values)
            fam = Metric(name, f"gpulens workload series {name} (latest value)", "gauge")
            for labels, value in values:
                fam.add_sample(name, _export_labels(labels), value)
            yield fam


    def _engine_means(self, now: float) -> Iterator[Metric]:
        """An engine's mean per request (Triton's durations are counters: Δduration / Δrequests between
        scrapes), as the gauge `names.ENGINE_MEAN_SERIES` names, while fresh; labels as the store's
        minus `quantile`."""
        for hist_name, mean_name in wn.ENGINE_MEAN_SERIES.items():
            values = [v for v in self.store.latest(hist_name)
                      if v.key.labels.get("quantile") == "mean" and "source" in v.key.labels and now - v.t <= self.max_age_seconds]
            if not values:
                continue
            fam = Metric(mean_name, f"Mean {hist_name} per request between the engine's last two scrapes (the engine's own counters).",
                         "gauge")
            for v in sorted(values, key=lambda v: v.key.labels_json):
                fam.add_sample(mean_name, _export_labels({k: x for k, x in v.key.labels.items() if k != "quantile"}), v.value)
            yield fam


def _every_status(rows: list[tuple[dict[str, str], float]]) -> list[tuple[dict[str, str], float]]:
    """The request counter with every documented status (`names.REQUEST_STATUSES`) of each label set
    that has served a request: a status not seen yet is 0, so `rate(...{status="error"}[5m])` reads 0
    instead of an empty result that no alert and no panel can tell from "not scraped"."""
    seen = {tuple(sorted(labels.items())) for labels, _ in rows}
    out = list(rows)
    for labels, _ in rows:
        if "status" not in labels:
            continue
        for status in wn.REQUEST_STATUSES:
            other = {**labels, "status": status}
            key = tuple(sorted(other.items()))
            if key not in seen:
                seen.add(key)
                out.append((other, 0.0))
    return out


# Its own, not reader.counters.without_pid: importing the reader package would cost the agent numpy.
def _without_pid(key: SeriesKey) -> SeriesKey:
    if wn.PID_LABEL not in key.labels:
        return key
    return SeriesKey(key.name, {k: v for k, v in key.labels.items() if k != wn.PID_LABEL})


def _summed_over_pids(values: list[tuple[dict[str, str], float]]) -> list[tuple[dict[str, str], float]]:
    """A per-process gauge (requests in flight) of a service's workers, added up: what the service
    has, and no series per pid for Prometheus to keep after each worker restart."""
    total: dict[str, tuple[dict[str, str], float]] = {}
    for labels, value in values:
        rest = {k: v for k, v in labels.items() if k != wn.PID_LABEL}
        key = canonical_labels(rest)
        total[key] = (rest, total.get(key, (rest, 0.0))[1] + value)
    return [total[k] for k in sorted(total)]


def _export_labels(labels: dict[str, str]) -> dict[str, str]:
    """A store label set as exported: a reserved name that slipped in is prefixed, never dropped."""
    return {(f"gpulens_{k}" if k in RESERVED_LABELS else k): v for k, v in labels.items()}


def _histogram_families(hists: dict[SeriesKey, tuple[list[int], float]]) -> Iterator[Metric]:
    by_name: dict[str, list[tuple[SeriesKey, list[int], float]]] = {}
    for key, (counts, total) in hists.items():
        by_name.setdefault(key.name, []).append((key, counts, total))
    for name in sorted(by_name):
        bounds = wn.HISTOGRAM_BUCKETS[name]
        fam = Metric(name, f"gpulens workload distribution {name} (histogram, seconds)", "histogram")
        for key, counts, total in sorted(by_name[name], key=lambda r: r[0].labels_json):
            add_histogram(fam, name, _export_labels(key.labels), bounds, counts, total)
        yield fam


def add_histogram(fam: Metric, name: str, labels: dict[str, str], bounds: Iterable[float], cumulative: list[float] | list[int], total: float) -> None:
    """Add one histogram's `_bucket` (cumulative, ending with +Inf), `_sum` and `_count` samples."""
    bounds = list(bounds)
    for b, c in zip([*bounds, math.inf], cumulative, strict=False):
        fam.add_sample(f"{name}_bucket", {**labels, "le": _le(b)}, float(c))
    fam.add_sample(f"{name}_sum", labels, float(total))
    fam.add_sample(f"{name}_count", labels, float(cumulative[-1]))


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


SCRAPE_REFUSED = "gpulens_scrape_refused"  # exposed as ..._total (a counter)
SCRAPE_REFUSED_CAUSES = ("body too large", "too many samples", "too many series")


def _shown_url(url: str) -> str:
    """A scrape URL as a label: without user, password or query (they may hold credentials)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{f':{parts.port}' if parts.port else ''}{parts.path}"


class EngineHistogramCollector:
    """Serving engines' own histograms, read by `--scrape`, passed through under gpulens's names with
    the engine's buckets (labels service, model, host, source); and the scrapes refused past a bound."""

    def __init__(self, scrapers: list):
        self.scrapers = scrapers

    def collect(self) -> Iterator[Metric]:
        refused = CounterMetricFamily(SCRAPE_REFUSED, "Engine scrapes refused whole, past a bound of the scrape, by cause.",
                                      labels=["service", "url", "cause"])
        for scraper in self.scrapers:
            for cause in sorted({*SCRAPE_REFUSED_CAUSES, *scraper.refused}):
                refused.add_metric([scraper.base["service"], _shown_url(scraper.url), cause], float(scraper.refused[cause]))
        yield refused
        fams: dict[str, Metric] = {}
        for scraper in self.scrapers:
            for name, labels, buckets in scraper.histograms():
                fam = fams.get(name)
                if fam is None:
                    fam = fams[name] = Metric(name, f"{name} as the serving engine counts it (passed through)", "histogram")
                add_histogram(fam, name, _export_labels(labels), buckets.bounds[:-1], list(buckets.counts), buckets.sum)
        yield from fams.values()


def make_registry(
    readings: LatestReadings, *, metric_names: MetricNames = "gpulens", store: Store | None = None,
    scrapers: list | None = None, tally: WorkloadTally | None = None, ingest_counters: object | None = None,
) -> CollectorRegistry:
    """A private registry (no global state): the GPU collector, and the workload ones when a store is
    given, in both naming modes."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(readings, metric_names))  # type: ignore[arg-type]
    registry.register(HealthCollector(readings))  # type: ignore[arg-type]
    if store is not None:
        registry.register(WorkloadCollector(store, tally=tally))  # type: ignore[arg-type]
        registry.register(RankInfoCollector(store))  # type: ignore[arg-type]
        registry.register(ScalingCollector(store))  # type: ignore[arg-type]
    if scrapers:
        registry.register(EngineHistogramCollector(scrapers))  # type: ignore[arg-type]
    if ingest_counters is not None:
        from gpulens.exporter.ingest import IngestCollector

        registry.register(IngestCollector(ingest_counters))  # type: ignore[arg-type]
    return registry


def serve_metrics(registry: CollectorRegistry, host: str, port: int, *, web_config: WebConfig | None = None,
                  readiness: Callable[[], Readiness] | None = None):  # type: ignore[no-untyped-def]
    """Serve /metrics (and /health, /ready) on host:port in a daemon thread. Returns the server
    (call .shutdown() to stop). A taken port and an address this machine does not have are
    different sentences: only the first is a port conflict."""
    import errno

    from gpulens.errors import BadInputError, PortInUseError
    from gpulens.exporter.exposition import start_metrics_server

    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        return start_metrics_server(registry, host, port, web_config=web_config, readiness=readiness)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise PortInUseError(
                f"Cannot listen on {shown}: the port is already in use.",
                hint="Pick another address with --listen HOST:PORT (or stop whatever holds that port).",
            ) from None
        raise BadInputError(
            f"Cannot listen on {shown}: {e.strerror or e}.",
            hint="Use an address of this machine, e.g. --listen 127.0.0.1:9464, --listen '[::1]:9464' or --listen '[::]:9464'.",
        ) from None
