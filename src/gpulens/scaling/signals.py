"""The load signals a service's replica count follows, read from the store at one time `t` over the
window before it, each as a total over all replicas with its per-replica target.

- `concurrency`: requests in flight, the mean over the window by Little's law: the latency of the
  requests that ended in the window, summed, over the window's length. It is what
  `rate(infer_request_latency_seconds_sum[W])` gives on Prometheus, so the recording rule
  (`scaling/promql.py`) computes the same figure from /metrics. Target: requests in flight per
  replica (`concurrency_per_replica`).
- `arrival_rate`: requests per second that ended in the window (`rate(infer_requests_total[W])`),
  against a replica's capacity in requests per second; only with a capacity given.
- `kv_cache`: the engine's KV-cache usage (`infer_kv_cache_usage_ratio`, from `--scrape`), the mean
  of its readings in the window, against a usage per replica; only where engine scrapes hold it.
- `queue`: requests waiting for service, the mean over the window by Little's law (the queue waits of
  the requests that ended in it, summed, over its length; `rate(infer_queue_wait_seconds_sum[W])`),
  against requests waiting per replica; only with a target given.
- `p95_latency`, `p95_ttft`: the 95th percentile of the latency (or time to first token) of the
  successful requests that ended in the window, against a target for it. Latency does not add up
  over replicas, so it enters the HPA rule as an average per replica (total = replicas × p95): the
  rule asks for replicas × p95 / target, the form an HPA or KEDA scaler on a latency metric uses.
  That assumes latency falls in proportion to the load each replica takes, which holds where
  requests queue and not where one request alone is slow (then no replica count helps; `gpulens
  diagnose` says which). Only with a target given, and only from a store's per-request records.

Current replicas: the hosts that served the service in the window (at least one).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from gpulens.stats import percentile
from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.workload.inference.records import request_from_event

DEFAULT_CONCURRENCY_PER_REPLICA = 4.0
DEFAULT_KV_CACHE_USAGE_PER_REPLICA = 0.8


LATENCY_PERCENTILE = 95.0
MIN_REQUESTS_FOR_PERCENTILE = 5  # fewer in a window: no latency signal there (a p95 of two requests says little)


@dataclass(frozen=True)
class Targets:
    concurrency_per_replica: float = DEFAULT_CONCURRENCY_PER_REPLICA
    capacity_rps_per_replica: float | None = None
    kv_cache_usage_per_replica: float = DEFAULT_KV_CACHE_USAGE_PER_REPLICA
    queue_per_replica: float | None = None  # requests waiting
    p95_latency_seconds: float | None = None
    p95_ttft_seconds: float | None = None


@dataclass(frozen=True)
class Signal:
    driver: str  # concurrency, arrival_rate, kv_cache
    value: float  # the total over all replicas
    target: float  # per replica


@dataclass(frozen=True)
class RequestLog:
    """A service's requests, sorted by end time, for fast windows. From a store, one entry per
    request. From a fleet's Prometheus (gpulens.scaling.exported), one entry per scrape of a host's
    counters: `latency_seconds` the latencies summed over the requests that scrape first showed,
    `count` how many requests ended (None: one per entry)."""

    end: list[float]
    latency_seconds: list[float]
    host: list[str]
    count: list[float] | None = None
    queue_seconds: list[float] | None = None  # summed like latency_seconds; None where not known
    ok: list[bool] | None = None  # per request (a store's log only): latency percentiles read successes
    ttft_seconds: list[float | None] | None = None  # per request, None where no first token was timed

    def between(self, start: float, end: float) -> range:
        """Indexes of the requests that ended in (start, end]."""
        return range(bisect.bisect_right(self.end, start), bisect.bisect_right(self.end, end))


def _num(x: object) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def request_log(store: Store, service: str, start: float | None = None, end: float | None = None) -> RequestLog:
    rows = []
    for e in store.events(N.EV_REQUEST, start=start, end=end, labels={"service": service}):
        d = e.data
        stop = _num(d.get("end")) or e.t
        begin = next((v for v in (_num(d.get(k)) for k in ("intended", "arrival", "start")) if v is not None), stop)
        rec = request_from_event(e)
        queue = rec.queue_wait_seconds if rec is not None else 0.0
        ttft = rec.ttft_seconds if rec is not None else None
        ok = rec is not None and rec.status == "ok"
        rows.append((stop, max(stop - begin, 0.0), e.labels.get("host", ""), queue, ok, ttft))
    rows.sort(key=lambda r: r[0])
    return RequestLog([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                      queue_seconds=[r[3] for r in rows], ok=[r[4] for r in rows], ttft_seconds=[r[5] for r in rows])


def services(store: Store) -> list[str]:
    """Services with request records."""
    return sorted({k.labels["service"] for k in store.series(N.INFER_LATENCY_SECONDS) if k.labels.get("service")})


def signals_at(log: RequestLog, t: float, window_seconds: float, targets: Targets,
               kv_cache: tuple[list[float], list[float]] | None = None) -> tuple[int, list[Signal]]:
    """Current replicas and the signals at `t` over (t − window, t]."""
    idx = log.between(t - window_seconds, t)
    current = max(len({log.host[i] for i in idx}), 1)
    out = [Signal("concurrency", sum(log.latency_seconds[i] for i in idx) / window_seconds, targets.concurrency_per_replica)]
    if targets.capacity_rps_per_replica is not None:
        n = len(idx) if log.count is None else sum(log.count[i] for i in idx)
        out.append(Signal("arrival_rate", n / window_seconds, targets.capacity_rps_per_replica))
    if kv_cache is not None:
        kt, kv = kv_cache
        vals = kv[bisect.bisect_right(kt, t - window_seconds):bisect.bisect_right(kt, t)]
        if vals:
            # The mean per replica reading, times the replicas: a total comparable with the others.
            out.append(Signal("kv_cache", sum(vals) / len(vals) * current, targets.kv_cache_usage_per_replica))
    if targets.queue_per_replica is not None and log.queue_seconds is not None:
        out.append(Signal("queue", sum(log.queue_seconds[i] for i in idx) / window_seconds, targets.queue_per_replica))
    if log.ok is not None:
        ok = [i for i in idx if log.ok[i]]
        for driver, target, values in (
                ("p95_latency", targets.p95_latency_seconds, [log.latency_seconds[i] for i in ok]),
                ("p95_ttft", targets.p95_ttft_seconds,
                 [v for i in ok if log.ttft_seconds is not None and (v := log.ttft_seconds[i]) is not None])):
            if target is not None and len(values) >= MIN_REQUESTS_FOR_PERCENTILE:
                p95 = percentile(values, LATENCY_PERCENTILE)
                if p95 is not None:
                    out.append(Signal(driver, p95 * current, target))  # an average per replica, as the HPA reads it
    return current, out


def kv_cache_readings(store: Store, service: str) -> tuple[list[float], list[float]] | None:
    pts = []
    for s in store.stored_series(N.INFER_KV_CACHE_USAGE_RATIO):
        if s.labels.get("service") == service:
            pts.extend(store.window(s.id, float("-inf"), float("inf"), include_start=True))
    if not pts:
        return None
    pts.sort()
    return [p.t for p in pts], [p.value for p in pts]
