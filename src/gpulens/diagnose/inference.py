"""Inference diagnosis: what limits a service, from its requests and the GPU beside them.

The analyzers read `request` events (from the middleware, the monitor or a recorded trace), the
`infer_*` series and the GPU series. Requests are grouped into serving windows (a gap of more than
`WINDOW_GAP_SECONDS` without a request in flight ends a window). Nothing here reads a trace's phase
labels: a live agent has none.

Advice follows the order that pays: hold the latency target first, then raise throughput (dynamic
or continuous batching, then INT8/FP8 quantization with an accuracy check before and after, tensor
parallelism only for a model that does not fit one card), then cost (replicas that follow load).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field

from gpulens.diagnose import evidence as Q
from gpulens.diagnose.base import DiagnoseScope, Finding, register_analyzer
from gpulens.diagnose.engine_signals import Saturation, engine_views, saturations
from gpulens.reader import AnalysisReader
from gpulens.stats import percentile
from gpulens.store import Store
from gpulens.vocab import gpu as G
from gpulens.vocab import names as N
from gpulens.workload.inference.records import RequestRecord, request_from_event

WINDOW_GAP_SECONDS = 30.0
MIN_REQUESTS = 10
BUSY_RATIO_MIN = 0.5  # the server had a request in service at least half of the window
LOW_GPU_UTILIZATION = 0.35  # ... while the GPU ran kernels less than this fraction of that time
QUEUE_SHARE_MIN = 0.4  # queue wait as a share of total request time
QUEUE_BUCKET_SECONDS = 10.0
ERROR_RATIO_WARN, ERROR_RATIO_CRIT = 0.01, 0.05
MEMORY_HEADROOM_RATIO = 0.90
COLD_START_WARN_SECONDS = 30.0
SLO_META_KEY = "inference_slo"  # JSON: a list of SLO texts, or {service: [texts]}, "*" for every service

ADVICE_LATENCY_OVERHEAD = [
    "Hold the latency target first: cut per-token overhead with CUDA graphs or torch.compile, or serve "
    "through a compiled engine (vLLM, TGI, TensorRT-LLM) instead of a Python generate loop.",
    "Then raise throughput: continuous (or dynamic) batching lets many requests share each decode step; "
    "the idle GPU has room for larger batches at little extra latency.",
    "Then try INT8/FP8 weights, measuring accuracy before and after; tensor parallelism helps only a model "
    "that does not fit one card.",
    "Then cost: with the GPU this idle, fewer replicas (scaled on queue depth) serve the same load.",
]
ADVICE_QUEUEING = [
    "Hold the latency target first: more capacity for the arrivals, i.e. more replicas, or autoscaling on "
    "queue depth, and admission control (answer 429 early) so admitted requests keep their latency.",
    "Then raise throughput per replica: dynamic/continuous batching serves the queue in shared forward "
    "passes; then INT8/FP8 quantization with an accuracy check before and after.",
    "Then cost: replicas that follow the load, so the queue stays short at peak without idle cards off-peak.",
]
ADVICE_MEMORY = [
    "Hold the latency target first: cap the batch (max concurrent sequences) or the context length so the "
    "KV cache cannot run out and force preemption or OOM.",
    "Then win memory back: a quantized (FP8) KV cache, paged attention, INT8/FP8 weights with an accuracy "
    "check before and after.",
    "If it still does not fit: a GPU with more memory, or tensor parallelism across cards.",
]
ADVICE_ERRORS = [
    "Read the error responses and server logs first: errors under load are often out-of-memory, "
    "timeouts of a dependency or an overloaded worker.",
    "If they grow with load, the service is past its capacity: see queueing and memory findings, add "
    "replicas, and shed load with 429 rather than failing.",
]
ADVICE_TIMEOUTS = [
    "Timeouts are latency past the client's patience: treat them as an SLO breach and find the cause "
    "(queueing, a stall, a cold start) in the other findings.",
    "Keep the server's own deadline below the client's, so work for abandoned requests is dropped.",
]
ADVICE_COLD_START = [
    "Keep traffic away until the model is warm: a readiness probe that passes only after loading and a "
    "warm-up request, and at least one warm replica when scaling to zero.",
    "Shorten the load: safetensors from local NVMe (memory-mapped), weights already in the serving dtype, "
    "cached compiled graphs (torch.compile cache, CUDA graph capture at start-up).",
]


@dataclass
class Window:
    """Requests of one service with no gap longer than WINDOW_GAP_SECONDS between them."""

    service: str
    labels: dict[str, str]
    requests: list[RequestRecord] = field(default_factory=list)

    @property
    def start(self) -> float:
        return min(r.arrival_t for r in self.requests)

    @property
    def end(self) -> float:
        return max(r.end_t for r in self.requests)


def _pct(values: list[float], p: float) -> float:
    """`gpulens.stats.percentile`, NaN for no values (evidence stays a number)."""
    v = percentile(values, p)
    return float("nan") if v is None else v


def windows(reader: AnalysisReader, scope: DiagnoseScope) -> list[Window]:
    labels = {"service": scope.service} if scope.service else None
    by_service: dict[str, list[tuple[RequestRecord, dict[str, str]]]] = {}
    for e in reader.event_rows(N.EV_REQUEST, start=scope.start, end=scope.end, match=labels):
        rec = request_from_event(e)
        if rec is not None:
            by_service.setdefault(e.labels.get("service", ""), []).append((rec, e.labels))
    out: list[Window] = []
    for service, items in by_service.items():
        items.sort(key=lambda item: item[0].arrival_t)
        cur: Window | None = None
        horizon = float("-inf")
        for rec, lab in items:
            if cur is None or rec.arrival_t > horizon + WINDOW_GAP_SECONDS:
                cur = Window(service, dict(lab))
                out.append(cur)
            cur.requests.append(rec)
            horizon = max(horizon, rec.end_t)
    return out


def _busy_intervals(requests: list[RequestRecord]) -> list[tuple[float, float]]:
    """Union of the requests' service intervals [start, end]."""
    iv = sorted((r.start_t, r.end_t) for r in requests)
    merged: list[list[float]] = []
    for s, t in iv:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], t)
        else:
            merged.append([s, t])
    return [(a, b) for a, b in merged]


def _gpu_values(reader: AnalysisReader, name: str, start: float, end: float, host: str | None) -> list[tuple[float, float]]:
    series = reader.series_windows(name, {"host": host} if host else None, start=start, end=end)
    if not series and host:
        series = reader.series_windows(name, None, start=start, end=end)
    return [(t, v) for s in series for t, v in zip(s.t, s.value, strict=True)]


def _inside(t: float, intervals: list[tuple[float, float]]) -> bool:
    import bisect

    i = bisect.bisect_right([a for a, _ in intervals], t) - 1
    return i >= 0 and t <= intervals[i][1]


@dataclass
class WindowStats:
    n: int
    statuses: dict[str, int]
    latency: list[float]
    service: list[float]
    queue: list[float]
    ttft: list[float]
    tpot: list[float]
    busy_ratio: float
    gpu_util_busy: float | None  # mean GPU utilization while a request was in service


def window_stats(reader: AnalysisReader, w: Window) -> WindowStats:
    statuses: dict[str, int] = {}
    lat, svc, que, ttft, tpot = [], [], [], [], []
    for r in w.requests:
        statuses[r.status] = statuses.get(r.status, 0) + 1
        if r.status in ("ok", "timeout"):
            lat.append(r.latency_seconds)
            svc.append(r.service_seconds)
            que.append(r.queue_wait_seconds)
        if r.status == "ok":
            if r.ttft_seconds is not None:
                ttft.append(r.ttft_seconds)
            if r.tpot_seconds is not None:
                tpot.append(r.tpot_seconds)
    busy = _busy_intervals(w.requests)
    span = max(w.end - w.start, 1e-9)
    busy_ratio = sum(b - a for a, b in busy) / span
    util = [v for t, v in _gpu_values(reader, G.GPU_UTILIZATION_RATIO, w.start, w.end, w.labels.get("host"))
            if _inside(t, busy)]
    return WindowStats(len(w.requests), statuses, lat, svc, que, ttft, tpot, busy_ratio,
                       statistics.fmean(util) if util else None)


def _finding(kind: str, w: Window, start: float, end: float, severity: str, summary: str, evidence: dict,
             advice: list[str]) -> Finding:
    labels = {k: v for k, v in w.labels.items() if k in ("service", "model", "host")}
    return Finding(kind, "inference", start, end, severity, summary, evidence, list(advice), labels)  # type: ignore[arg-type]


def _ms(v: float) -> str:
    return f"{v * 1e3:.0f} ms" if v < 1 else f"{v:.2f} s"


@register_analyzer("inference_latency_bound_low_utilization")
def latency_bound_low_utilization(reader: AnalysisReader, scope: DiagnoseScope) -> list[Finding]:
    out = []
    for w in windows(reader, scope):
        st = window_stats(reader, w)
        if st.n < MIN_REQUESTS or st.gpu_util_busy is None or not st.latency:
            continue
        if st.busy_ratio < BUSY_RATIO_MIN or st.gpu_util_busy >= LOW_GPU_UTILIZATION:
            continue
        queue_share = sum(st.queue) / max(sum(st.latency), 1e-9)
        p50, p99 = _pct(st.latency, 50), _pct(st.latency, 99)
        evidence = {
            "requests": st.n, "latency_p50_seconds": Q.seconds(p50), "latency_p99_seconds": Q.seconds(p99),
            "service_p50_seconds": Q.seconds(_pct(st.service, 50)), "queue_wait_share": Q.ratio(queue_share),
            "busy_ratio": Q.ratio(st.busy_ratio), "gpu_utilization_while_serving_ratio": Q.ratio(st.gpu_util_busy),
        }
        if st.tpot:
            evidence["tpot_p50_seconds"] = Q.seconds(_pct(st.tpot, 50))
        out.append(_finding(
            "latency_bound_low_utilization", w, w.start, w.end, "warning",
            f"Requests took {_ms(p50)} at the median and {_ms(p99)} at p99 while the GPU ran kernels only "
            f"{st.gpu_util_busy:.0%} of the time it was serving them: latency is bound by per-token overhead "
            "(launches, Python, tiny batches), not by the GPU.",
            evidence, _latency_advice(w)))
    return out


def _latency_advice(w: Window) -> list[str]:
    """An idle GPU suggests fewer replicas, unless requests also queued in this window: then
    fewer replicas would deepen the queue (and the queueing finding asks for capacity)."""
    queued = [r for run in _queued_runs(w) for r in run]
    if not queued:
        return ADVICE_LATENCY_OVERHEAD
    wait = _pct([r.queue_wait_seconds for r in queued], 95)
    return ADVICE_LATENCY_OVERHEAD[:-1] + [
        f"Then cost, but not fewer replicas yet: requests also queued in this window (p95 wait {_ms(wait)}), so "
        "removing replicas would lengthen the queue. Once batching drains it, scale replicas on queue depth."]


def _queued_runs(w: Window) -> list[list[RequestRecord]]:
    """Runs of adjacent QUEUE_BUCKET_SECONDS buckets of request ends where queue wait drove latency."""
    done = [r for r in w.requests if r.status in ("ok", "timeout")]
    if len(done) < MIN_REQUESTS:
        return []
    t0 = w.start
    buckets: dict[int, list[RequestRecord]] = {}
    for r in done:
        buckets.setdefault(int((r.end_t - t0) // QUEUE_BUCKET_SECONDS), []).append(r)
    flagged: list[tuple[int, list[RequestRecord]]] = []
    for b in sorted(buckets):
        reqs = buckets[b]
        lat = [r.latency_seconds for r in reqs]
        que = [r.queue_wait_seconds for r in reqs]
        svc = [r.service_seconds for r in reqs]
        if len(reqs) >= 5 and sum(que) / max(sum(lat), 1e-9) >= QUEUE_SHARE_MIN and _pct(lat, 95) >= 2 * _pct(svc, 50):
            flagged.append((b, reqs))
    runs: list[list[RequestRecord]] = []
    last = None
    for b, reqs in flagged:
        if last is not None and b == last + 1:
            runs[-1].extend(reqs)
        else:
            runs.append(list(reqs))
        last = b
    return runs


@register_analyzer("inference_queueing")
def queueing(reader: AnalysisReader, scope: DiagnoseScope) -> list[Finding]:
    """Latency driven by queue wait, found per QUEUE_BUCKET_SECONDS of request ends; adjacent
    flagged buckets become one finding."""
    out = []
    for w in windows(reader, scope):
        for reqs in _queued_runs(w):
            lat = [r.latency_seconds for r in reqs]
            que = [r.queue_wait_seconds for r in reqs]
            depth = [r.queue_depth_at_start for r in reqs if r.queue_depth_at_start is not None]
            ev = {"requests": len(reqs), "queue_wait_share": Q.ratio(sum(que) / max(sum(lat), 1e-9)),
                  "queue_wait_p95_seconds": Q.seconds(_pct(que, 95)), "latency_p95_seconds": Q.seconds(_pct(lat, 95)),
                  "service_p50_seconds": Q.seconds(_pct([r.service_seconds for r in reqs], 50))}
            if depth:
                ev["queue_depth_max"] = max(depth)
            start = min(r.arrival_t for r in reqs)
            end = max(r.end_t for r in reqs)
            out.append(_finding(
                "queueing", w, start, end, "warning",
                f"Requests waited in the queue for {ev['queue_wait_share']:.0%} of their time (p95 wait "
                f"{_ms(ev['queue_wait_p95_seconds'])}): arrivals exceed what the server completes, so latency "
                "grows with the queue.", ev, ADVICE_QUEUEING))
    return out


@register_analyzer("inference_errors_and_timeouts")
def errors_and_timeouts(reader: AnalysisReader, scope: DiagnoseScope) -> list[Finding]:
    out = []
    for w in windows(reader, scope):
        st = window_stats(reader, w)
        errors = st.statuses.get("error", 0) + st.statuses.get("rejected", 0)
        ratio = errors / st.n
        if errors and ratio >= ERROR_RATIO_WARN:
            out.append(_finding(
                "error_rate", w, w.start, w.end, "critical" if ratio >= ERROR_RATIO_CRIT else "warning",
                f"{errors} of {st.n} requests ({ratio:.1%}) failed or were rejected.",
                {"requests": st.n, "errors": st.statuses.get("error", 0), "rejected": st.statuses.get("rejected", 0),
                 "error_ratio": Q.ratio(ratio)}, ADVICE_ERRORS))
        timeouts = st.statuses.get("timeout", 0)
        if timeouts:
            tl = [r.latency_seconds for r in w.requests if r.status == "timeout"]
            out.append(_finding(
                "timeouts", w, w.start, w.end, "critical" if timeouts / st.n >= ERROR_RATIO_CRIT else "warning",
                f"{timeouts} of {st.n} requests timed out, after {_ms(min(tl))} or more.",
                {"requests": st.n, "timeouts": timeouts, "timeout_ratio": Q.ratio(timeouts / st.n),
                 "timeout_latency_min_seconds": Q.seconds(min(tl))}, ADVICE_TIMEOUTS))
    return out


def configured_slos(reader: AnalysisReader, service: str) -> list[str]:
    raw = reader.setting(SLO_META_KEY)
    if not raw:
        return []
    try:
        val = json.loads(raw)
    except ValueError:
        return []
    if isinstance(val, list):
        return [str(v) for v in val]
    if isinstance(val, dict):
        return [str(v) for v in val.get(service, val.get("*", []))]
    return []


def set_slos(store: Store, slos: list[str], service: str = "*") -> None:
    """Record the latency objectives that `slo_violation` checks (validated first). A writer, apart
    from the analyzers: `gpulens diagnose --slo` calls it before its read-only pass."""
    from gpulens.vocab.slo import parse_slos

    parse_slos(slos)
    raw = store.get_meta(SLO_META_KEY)
    current = json.loads(raw) if raw else {}
    if isinstance(current, list):
        current = {"*": current}
    current[service] = list(slos)
    store.set_meta(SLO_META_KEY, json.dumps(current))


@register_analyzer("inference_slo_violation")
def slo_violation(reader: AnalysisReader, scope: DiagnoseScope) -> list[Finding]:
    from gpulens.vocab.slo import parse_slos

    out = []
    for w in windows(reader, scope):
        texts = configured_slos(reader, w.service)
        if not texts:
            continue
        st = window_stats(reader, w)
        values = {"latency": st.latency, "ttft": st.ttft, "tpot": st.tpot}
        missed = []
        for s in parse_slos(texts):
            if s.metric == "error_rate":
                v = sum(n for k, n in st.statuses.items() if k != "ok") / st.n
            else:
                vals = values.get(s.metric) or []
                if not vals:
                    continue
                v = statistics.fmean(vals) if s.stat == "mean" else max(vals) if s.stat == "max" else _pct(vals, s.percentile or 99)
            if not s.holds(v):
                typed = Q.ratio if s.metric.startswith("error_rate") else Q.seconds
                missed.append({"slo": s.text, "value": typed(v), "bound": typed(s.bound)})
        if missed:
            out.append(_finding(
                "slo_violation", w, w.start, w.end, "critical",
                f"The service missed {len(missed)} of its objectives: {Q.missed_text(missed)}.",
                {"requests": st.n, "missed": missed}, [
                    "Hold the target first: find what drives the latency in the findings beside this one "
                    "(queueing, per-token overhead, memory pressure, cold start) and fix that before tuning throughput.",
                    "Measure the highest rate that still meets the objectives with `gpulens bench serve --sweep --slo ...` "
                    "and keep the offered load below it (replicas, admission control).",
                ]))
    return out


@register_analyzer("inference_memory_headroom")
def memory_headroom(reader: AnalysisReader, scope: DiagnoseScope) -> list[Finding]:
    """Memory as the limit of a service. Where the engine reports on itself (KV-cache use, waiting
    requests, preemptions) its own readings decide, never device memory: an engine pre-allocates by
    design (vLLM's `gpu_memory_utilization` reserves 90 % of the card at start for its KV cache), so
    a nearly full card with a comfortable cache and no preemption is no finding. Without engine
    readings, device memory near the card's size is one, unless it was flat from the service's
    start (a pre-allocation) and latency stayed healthy (no queueing, errors or timeouts)."""
    out = []
    views = engine_views(reader, scope.service, scope.start, scope.end)
    for view in views:
        w = Window(view.labels.get("service", ""), dict(view.labels))
        for sat in saturations(view):
            out.append(_engine_finding(w, sat))
    for w in windows(reader, scope):
        if any(v.labels.get("service", "") == w.service and v.covers(w.start, w.end) for v in views):
            continue  # the engine reported on itself over this window: its readings decided above
        finding = _device_memory_finding(reader, w)
        if finding is not None:
            out.append(finding)
    return out


def _engine_finding(w: Window, sat: Saturation) -> Finding:
    parts = []
    if sat.kv_usage_max_ratio is not None:
        parts.append(f"the engine's KV cache was {sat.kv_usage_max_ratio:.0%} full")
    if sat.waiting_max:
        parts.append(f"up to {sat.waiting_max:.0f} requests waited")
    if sat.preemptions:
        parts.append(f"{sat.preemptions:.0f} running requests were preempted")
    evidence: dict = {"waiting_requests_max": int(sat.waiting_max), "preemptions": int(sat.preemptions),
                      "readings_saturated": sat.readings}
    if sat.kv_usage_max_ratio is not None:
        evidence["kv_cache_usage_max_ratio"] = Q.ratio(sat.kv_usage_max_ratio)
    summary = (", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0])
    return _finding(
        "memory_headroom", w, sat.start, sat.end, "warning",
        summary[0].upper() + summary[1:] + ": requests wait for cache space or are recomputed, so latency "
        "grows with load; a longer context or a larger batch will not fit.", evidence, ADVICE_MEMORY)


PREALLOCATED_SPREAD_RATIO = 0.02  # device memory within this share of the card over a window: reserved, not growing


def _device_memory_finding(reader: AnalysisReader, w: Window) -> Finding | None:
    """GPU memory near the card's size on any GPU of the service's host, unless every such GPU held
    it flat over the window (reserved before the first request) and latency stayed healthy."""
    host = w.labels.get("host")
    sel = {"host": host} if host else None
    used = reader.series_windows(G.GPU_MEMORY_USED_BYTES, sel, start=w.start, end=w.end)
    total = reader.series_windows(G.GPU_MEMORY_TOTAL_BYTES, sel, start=w.start, end=w.end)
    if not used and host:
        used = reader.series_windows(G.GPU_MEMORY_USED_BYTES, None, start=w.start, end=w.end)
        total = reader.series_windows(G.GPU_MEMORY_TOTAL_BYTES, None, start=w.start, end=w.end)
    caps = {s.labels.get("gpu"): max(s.value) for s in total if s.value}
    full: list[tuple[float, float, bool]] = []  # (peak, card, flat) of each GPU at or above the ratio
    for s in used:
        cap = caps.get(s.labels.get("gpu")) or max(caps.values(), default=0.0)
        if s.value and cap > 0 and max(s.value) / cap >= MEMORY_HEADROOM_RATIO:
            full.append((max(s.value), cap, (max(s.value) - min(s.value)) / cap <= PREALLOCATED_SPREAD_RATIO))
    if not full or (all(flat for _, _, flat in full) and _latency_healthy(reader, w)):
        return None
    peak, cap, _flat = max(full, key=lambda g: g[0] / g[1])
    return _finding(
        "memory_headroom", w, w.start, w.end, "warning",
        f"GPU memory reached {peak / cap:.0%} of the card while serving: little headroom for longer "
        "contexts or larger batches.",
        {"gpu_memory_used_max_bytes": Q.bytes_(peak), G.GPU_MEMORY_TOTAL_BYTES: Q.bytes_(cap), "used_ratio": Q.ratio(peak / cap)},
        ADVICE_MEMORY)


def _latency_healthy(reader: AnalysisReader, w: Window) -> bool:
    """Nothing that memory running out shows as: no queueing run, errors below ERROR_RATIO_WARN, no timeout."""
    st = window_stats(reader, w)
    failed = st.statuses.get("error", 0) + st.statuses.get("rejected", 0)
    return not _queued_runs(w) and failed / st.n < ERROR_RATIO_WARN and not st.statuses.get("timeout", 0)


@register_analyzer("inference_cold_start")
def cold_start(reader: AnalysisReader, scope: DiagnoseScope) -> list[Finding]:
    out = []
    sel = {"service": scope.service} if scope.service else None
    for e in reader.event_rows(N.EV_COLD_START, start=scope.start, end=scope.end, match=sel):
        seconds = e.data.get("seconds")
        if not isinstance(seconds, int | float):
            continue
        w = Window(e.labels.get("service", ""), dict(e.labels))
        evidence = {"cold_start_seconds": Q.seconds(float(seconds))}
        if e.data.get("params"):
            evidence["parameters"] = e.data["params"]
        # Requests in the first WINDOW_GAP_SECONDS after the load that were slow compared with the rest
        # of their window: the warm-up that follows a load (kernel selection, allocator growth).
        after = reader.event_rows(N.EV_REQUEST, start=e.t, end=e.t + 600, match={"service": w.service} if w.service else None)
        if len(after) >= MIN_REQUESTS:
            recs = [r for r in (request_from_event(a) for a in after) if r is not None]
            lat = [r.latency_seconds for r in recs]
            typical = _pct(lat, 50)
            early = [x for r, x in zip(recs, lat, strict=True) if r.arrival_t < e.t + WINDOW_GAP_SECONDS and x > 3 * typical]
            if early:
                evidence.update(slow_requests_after_load=len(early), slow_request_latency_max_seconds=max(early),
                                typical_latency_seconds=typical)
        summary = f"Loading the model took {float(seconds):.1f} s before it could serve"
        summary += (f"; the first {evidence['slow_requests_after_load']} requests after it were still over 3× "
                    "slower than usual." if "slow_requests_after_load" in evidence else ".")
        out.append(_finding(N.EV_COLD_START, w, e.t - float(seconds), e.t,
                            "warning" if seconds >= COLD_START_WARN_SECONDS or "slow_requests_after_load" in evidence else "info",
                            summary, evidence, ADVICE_COLD_START))
    return out
