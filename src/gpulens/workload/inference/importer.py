"""Recorded inference events (a trace's events.jsonl) -> the store, as a live monitor would write them.

Two request shapes are accepted:
- the H200 session's: arrival, start, first_token, end, batch, queue_depth_at_start, status, tpot_s,
  prompt_tokens, output_tokens;
- the co-location recording's: intended (scheduled send time), start, first_token, end, pid, role,
  prompt_tokens, output_tokens (no status: every request completed).
Latency counts from `arrival` (or `intended`), so queueing is part of it. `cold_start` records become
`infer_cold_start_seconds`, `mem` records the allocator series. Series carry service, model, host:
a record's own `service` and `host` (mapped onto the recording's host, see `ImportContext`), else
the import's; counters (in flight, totals by status) are kept per service, so two services in one
recording stay two.

A live monitor sending to its node's agent (workload.wire) adds its own counters to each request
(`requests_total` for its status, `in_flight` after it, `itl_s`), which are stored as they are (an
agent's restart must not reset a counter), under its pid (each worker of a pre-fork server counts its
own), and sends its gauges as `infer_gauges` records.
"""

from __future__ import annotations

import bisect
import weakref
from dataclasses import replace
from typing import Any

from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.workload.fields import duration, field, time_point
from gpulens.workload.importers import ImportContext, register_importer
from gpulens.workload.inference.records import request_fault, request_from_dict, write_request


class _State:
    """Per-import running state: status counters and the ends of requests still in flight."""

    def __init__(self) -> None:
        self.totals: dict[str, int] = {}
        self.ends: list[float] = []  # sorted ends of requests that arrived before the current one
        self.model: str | None = None  # the model of the last cold start: the one now serving


# ImportContext is an unhashable dataclass: key by id and keep a weak reference to tell a reused id
_STATES: dict[int, tuple[weakref.ref, dict[tuple[str, str], _State]]] = {}


def _state(ctx: ImportContext, record: dict[str, Any]) -> _State:
    """The running state of the record's service on its host."""
    entry = _STATES.get(id(ctx))
    if entry is None or entry[0]() is not ctx:
        for k in [k for k, (ref, _s) in _STATES.items() if ref() is None]:
            del _STATES[k]
        entry = _STATES[id(ctx)] = (weakref.ref(ctx), {})
    key = (_service(record, ctx), ctx.host_of(record))
    st = entry[1].get(key)
    if st is None:
        st = entry[1][key] = _State()
    return st


def _service(record: dict[str, Any], ctx: ImportContext) -> str:
    v = record.get("service")
    return str(v) if isinstance(v, str | int) and not isinstance(v, bool) and str(v) else ctx.service


def labels_for(record: dict[str, Any], ctx: ImportContext) -> dict[str, str]:
    model = record.get("model") or _state(ctx, record).model or ctx.model or ""
    return {"service": _service(record, ctx), "model": str(model), "host": ctx.host_of(record)}




# What a live monitor adds to a request record (its own counters), not part of the stored event.
LIVE_REQUEST_FIELDS = ("requests_total", "in_flight", "itl_s", "store_event")
# An `infer_gauges` record's fields -> the series each one is.
GAUGE_FIELDS = (("in_flight", N.INFER_IN_FLIGHT), ("queue_depth", N.INFER_QUEUE_DEPTH),
                ("allocated_bytes", N.INFER_MEMORY_ALLOCATED_BYTES), ("reserved_bytes", N.INFER_MEMORY_RESERVED_BYTES),
                ("kv_cache_usage_ratio", N.INFER_KV_CACHE_USAGE_RATIO))


@register_importer(N.EV_REQUEST)
def import_request(record: dict[str, Any], store: Store, ctx: ImportContext) -> None:
    data = {k: v for k, v in record.items() if k not in ("kind", "phase")}
    if "phase" in record:  # kept for tests as ground truth; analyzers never read it
        data["recorded_phase"] = record["phase"]
    live = {k: data.pop(k) for k in LIVE_REQUEST_FIELDS if k in data}
    req = request_from_dict(data)
    if req is None:
        raise ValueError(f"a {N.EV_REQUEST} record needs an end time")
    fault = request_fault(req)
    if fault:
        raise ValueError(fault)
    field(data, "tpot_s", duration)  # present, it is a duration the store keeps (else the record is skipped)
    if "requests_total" in live:
        _import_live_request(req, live, labels_for(record, ctx), store)
        return
    if req.tpot_seconds is None and req.first_token_t is not None and req.output_tokens and req.output_tokens > 1:
        req = replace(req, tpot_seconds=(req.end_t - req.first_token_t) / (req.output_tokens - 1))
    labels = labels_for(record, ctx)
    st = _state(ctx, record)
    st.totals[req.status] = st.totals.get(req.status, 0) + 1
    end = req.end_t

    def w(name: str, value: float | None, t: float = end, **extra: str) -> None:
        if value is not None:
            store.write(name, {**labels, **extra} if extra else labels, t, value)

    # in flight at this arrival: earlier requests not yet ended (records come in arrival order)
    del st.ends[: bisect.bisect_right(st.ends, req.arrival_t)]
    bisect.insort(st.ends, end)
    w(N.INFER_IN_FLIGHT, float(len(st.ends)), t=req.arrival_t)
    w(N.INFER_REQUESTS_TOTAL, float(st.totals[req.status]), status=req.status)
    w(N.INFER_QUEUE_DEPTH, req.queue_depth_at_start, t=req.start_t)
    write_request(store, labels, req)


def _import_live_request(req: Any, live: dict[str, Any], labels: dict[str, str], store: Store) -> None:
    """A request as its live monitor counted it: the series and event `InferenceMonitor` writes itself."""
    total = field(live, "requests_total")
    if total is None or req.status not in N.REQUEST_STATUSES:
        raise ValueError("a live request needs a number in requests_total and a documented status")
    end = req.end_t
    counted = _counted_by(labels, req.pid)
    store.write(N.INFER_IN_FLIGHT, counted, end, field(live, "in_flight"))
    store.write(N.INFER_REQUESTS_TOTAL, {**counted, "status": req.status}, end, total)
    if req.status == "ok":
        store.write(N.INFER_ITL_SECONDS, labels, end, field(live, "itl_s", duration))
    write_request(store, labels, req, event=live.get("store_event", True) is not False)


@register_importer(N.REC_INFER_GAUGES)
def import_gauges(record: dict[str, Any], store: Store, ctx: ImportContext) -> None:
    """A live monitor's gauges at one moment (in flight, queue depth, memory, KV cache)."""
    t = field(record, "t", time_point)
    if t is None:
        raise ValueError(f"an {N.REC_INFER_GAUGES} record needs t")
    labels = labels_for(record, ctx)
    values = [(name, field(record, key)) for key, name in GAUGE_FIELDS]  # all read before any is written
    pid = field(record, N.PID_LABEL)
    counted = _counted_by(labels, int(pid) if pid is not None else None)
    for name, value in values:
        store.write(name, counted if name in N.PER_PROCESS_SERIES else labels, t, value)


def _counted_by(labels: dict[str, str], pid: int | None) -> dict[str, str]:
    """The labels of what one live process counts itself (N.PER_PROCESS_SERIES): its pid added."""
    return labels if pid is None else {**labels, N.PID_LABEL: str(pid)}


@register_importer(N.EV_INFER_START)
def import_infer_start(record: dict[str, Any], store: Store, ctx: ImportContext) -> None:
    """Who serves (pid, service, model), for the co-location guard."""
    t = field(record, "t", time_point)
    if t is None:
        raise ValueError(f"an {N.EV_INFER_START} record needs t")
    store.event(N.EV_INFER_START, t, labels_for(record, ctx), {k: v for k, v in record.items() if k not in ("kind", "t")})


@register_importer(N.EV_COLD_START)
def import_cold_start(record: dict[str, Any], store: Store, ctx: ImportContext) -> None:
    t, seconds = field(record, "t", time_point), field(record, "seconds", duration)
    if t is None or seconds is None:
        return
    if record.get("model"):
        _state(ctx, record).model = str(record["model"])
    labels = labels_for(record, ctx)
    store.write(N.INFER_COLD_START_SECONDS, labels, t, seconds)
    store.event(N.EV_COLD_START, t, labels, {k: v for k, v in record.items() if k != "kind"})


@register_importer("mem")
def import_mem(record: dict[str, Any], store: Store, ctx: ImportContext) -> None:
    t = field(record, "t", time_point)
    if t is None:
        return
    labels = labels_for(record, ctx)
    values = [(name, field(record, key)) for key, name in (("alloc", N.INFER_MEMORY_ALLOCATED_BYTES),
                                                           ("reserved", N.INFER_MEMORY_RESERVED_BYTES))]
    for name, v in values:
        if v is not None:
            store.write(name, labels, t, v)
    store.event("mem", t, labels, {k: v for k, v in record.items() if k != "kind"})
