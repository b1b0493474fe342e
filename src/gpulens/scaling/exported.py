"""The scaling signals read from a fleet's Prometheus (`gpulens scale --prometheus URL`), through the
reader seam (gpulens.reader.prometheus.PrometheusAnalysisReader), from the series every agent exports:

- `concurrency`: the increases of `infer_request_latency_seconds_sum` (the latencies summed) at each
  scrape of each host, summed over the window (t − W, t] and divided by W: Little's law as over a
  store. Exact as a sum, with two differences: a request counts at the scrape that first showed it
  (up to one scrape interval after it ended), and the histogram holds the requests that ended `ok`
  or `timeout` (an error's or a rejection's time in flight is not in it; over a store every request
  counts), timed from their arrival (a load generator's intended send time is not exported).
- `arrival_rate`: the increases of `infer_requests_total` (every status), as counted requests per
  second: exact, at scrape times. Where an agent does not export the counter, the increases of the
  histogram's `_count` stand in.
- `kv_cache`: `infer_kv_cache_usage_ratio` as Prometheus scraped it (each scrape holds the host's
  latest reading): the mean of those samples in the window, times the replicas. A reading between
  two scrapes is not seen; at a scrape interval no longer than the engine's, it is every reading.
- current replicas: the hosts whose counters rose in the window, as over a store.
No percentile enters the rule, so nothing here is a bucket estimate.

Layer: scaling, above reader (the seam it reads through).
"""

from __future__ import annotations

from collections.abc import Mapping

from gpulens.reader.counters import counter_increases
from gpulens.reader.prometheus import LOOKBACK_SECONDS
from gpulens.reader.protocols import AnalysisReader
from gpulens.scaling.signals import RequestLog
from gpulens.vocab import names as N

SERVICE_LABEL = "service"
HOST_LABEL = "host"


def exported_services(reader: AnalysisReader) -> list[str]:
    """Services whose request latency histogram the agents export."""
    return sorted({s[SERVICE_LABEL] for s in reader.series_labels(N.INFER_LATENCY_SECONDS) if s.get(SERVICE_LABEL)})


def _increases(reader: AnalysisReader, metric: str, service: str, lo: float, hi: float) -> dict[tuple[str, float], float]:
    """(host, scrape time) -> the rise of every `metric` series of the service on that host, from `lo` on."""
    out: dict[tuple[str, float], float] = {}
    for w in reader.series_windows(metric, {SERVICE_LABEL: service}, start=lo - LOOKBACK_SECONDS, end=hi):
        host = w.labels.get(HOST_LABEL, "")
        for t, d in counter_increases(w.t, w.value, born_inside=bool(w.t) and w.t[0] >= lo):
            if t >= lo:
                out[(host, t)] = out.get((host, t), 0.0) + d
    return out


def exported_request_log(reader: AnalysisReader, service: str, lo: float, hi: float) -> RequestLog:
    """The service's requests in [lo, hi] as one entry per host per scrape: the latencies summed and
    the requests counted that the scrape first showed."""
    latency = _increases(reader, N.INFER_LATENCY_SECONDS + "_sum", service, lo, hi)
    counted = _increases(reader, N.INFER_REQUESTS_TOTAL, service, lo, hi)
    if not counted:  # an agent without the request counter: the histogram's count of requests
        counted = _increases(reader, N.INFER_LATENCY_SECONDS + "_count", service, lo, hi)
    queued = _increases(reader, N.INFER_QUEUE_WAIT_SECONDS + "_sum", service, lo, hi)
    keys = sorted(set(latency) | set(counted), key=lambda k: (k[1], k[0]))
    return RequestLog([t for _, t in keys], [latency.get(k, 0.0) for k in keys], [h for h, _ in keys],
                      [counted.get(k, 0.0) for k in keys], queue_seconds=[queued.get(k, 0.0) for k in keys] if queued else None)


def exported_kv_cache(reader: AnalysisReader, service: str, lo: float, hi: float) -> tuple[list[float], list[float]] | None:
    """Every scraped KV-cache usage sample of the service in [lo, hi], by time; None without any."""
    pts = sorted((t, v) for w in reader.series_windows(N.INFER_KV_CACHE_USAGE_RATIO, {SERVICE_LABEL: service}, start=lo, end=hi)
                 for t, v in zip(w.t, w.value, strict=True))
    return ([p[0] for p in pts], [p[1] for p in pts]) if pts else None


def exported_inputs(reader: AnalysisReader, services: list[str], lo: float, hi: float,
                    window_seconds: float) -> Mapping[str, tuple[RequestLog, tuple[list[float], list[float]] | None]]:
    """Each service's request log and KV-cache readings for evaluations from `lo` to `hi` (read from
    one window before `lo`, so the first evaluation sees a full window)."""
    first = lo - window_seconds
    return {s: (exported_request_log(reader, s, first, hi), exported_kv_cache(reader, s, first, hi)) for s in services}
