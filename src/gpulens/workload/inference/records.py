"""A served request as one typed record, with one write path and one parser.

`InferenceMonitor` (and the ASGI middleware through it) and the trace importer build a
`RequestRecord` and call `write_request`; the analyzers (diagnose/inference.py, colocation) read
events back with `request_from_event`, which does the fallbacks once (arrival from `intended` or
`start`, start from arrival, end from the event time). The stored event format is unchanged:
`arrival`, `start`, `first_token`, `end`, `status`, `output_tokens`, `tpot_s`, `pid`, plus whatever
else the source recorded (kept in `extra`), so existing stores and the H200 trace read the same.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpulens.store import Event, Store
from gpulens.vocab import names as N
from gpulens.workload.fields import count, number, time_point

# The data keys this record owns; anything else a source recorded rides along in `extra`.
_OWN = ("arrival", "start", "first_token", "end", "status", "output_tokens", "prompt_tokens", "tpot_s",
        "pid", "batch_size", "queue_depth_at_start")


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request. Times are unix seconds; `status` is one of `names.REQUEST_STATUSES` (ok | error | timeout | rejected | aborted)."""

    arrival_t: float
    start_t: float  # service began (after any queue)
    end_t: float
    status: str = "ok"
    first_token_t: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    tpot_seconds: float | None = None  # time per output token after the first
    pid: int | None = None
    batch_size: int | None = None
    queue_depth_at_start: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def latency_seconds(self) -> float:
        return self.end_t - self.arrival_t

    @property
    def service_seconds(self) -> float:
        return self.end_t - self.start_t

    @property
    def queue_wait_seconds(self) -> float:
        return max(self.start_t - self.arrival_t, 0.0)

    @property
    def ttft_seconds(self) -> float | None:
        return None if self.first_token_t is None else self.first_token_t - self.arrival_t

    @property
    def intended_t(self) -> float | None:
        """When a load generator meant to send it (open-loop traces), else the arrival if recorded."""
        v = time_point(self.extra.get("intended"))
        return v if v is not None else self.arrival_t

    def to_event_data(self) -> dict[str, Any]:
        data: dict[str, Any] = dict(self.extra)
        data.update(arrival=self.arrival_t, start=self.start_t, first_token=self.first_token_t, end=self.end_t,
                    status=self.status, output_tokens=self.output_tokens, tpot_s=self.tpot_seconds)
        for k, v in (("pid", self.pid), ("prompt_tokens", self.prompt_tokens), ("batch_size", self.batch_size),
                     ("queue_depth_at_start", self.queue_depth_at_start)):
            if v is not None:
                data[k] = v
        return data


def _int(v: Any) -> int | None:
    """A count, also as a string of digits (some recorders write them so)."""
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return count(v)


def request_from_dict(d: Mapping[str, Any], t: float | None = None) -> RequestRecord | None:
    """Parse a request's data (a stored event's or a trace record's); None without an end time
    (`t` is used when `end` is missing)."""
    end = time_point(d.get("end"))
    end = end if end is not None else t
    if end is None:
        return None
    start = time_point(d.get("start"))
    arrival = next((v for v in (time_point(d.get("arrival")), time_point(d.get("intended")), start) if v is not None), end)
    return RequestRecord(
        arrival_t=arrival,
        start_t=start if start is not None else arrival,
        end_t=end,
        status=str(d.get("status") or "ok"),
        first_token_t=time_point(d.get("first_token")),
        prompt_tokens=_int(d.get("prompt_tokens")),
        output_tokens=_int(d.get("output_tokens")),
        tpot_seconds=number(d.get("tpot_s")),
        pid=_int(d.get("pid")),
        batch_size=_int(d.get("batch_size", d.get("batch"))),
        queue_depth_at_start=_int(d.get("queue_depth_at_start")),
        extra={k: v for k, v in d.items() if k not in _OWN},
    )


def request_fault(rec: RequestRecord) -> str | None:
    """What makes a request's times impossible, or None: it ends before it starts or arrives, or its
    first token comes before its start or after its end."""
    if rec.end_t < rec.start_t:
        return f"it ends {rec.start_t - rec.end_t:.3g} s before it starts"
    if rec.end_t < rec.arrival_t:
        return f"it ends {rec.arrival_t - rec.end_t:.3g} s before it arrives"
    if rec.first_token_t is not None and rec.first_token_t < rec.start_t:
        return f"its first token comes {rec.start_t - rec.first_token_t:.3g} s before it starts"
    if rec.first_token_t is not None and rec.first_token_t > rec.end_t:
        return f"its first token comes {rec.first_token_t - rec.end_t:.3g} s after it ends"
    return None


def request_from_event(e: Event) -> RequestRecord | None:
    """The request a stored `request` event holds (the pid may also be a label)."""
    rec = request_from_dict(e.data, e.t)
    if rec is not None and rec.pid is None and e.labels.get("pid"):
        from dataclasses import replace

        rec = replace(rec, pid=_int(e.labels["pid"]))
    return rec


# (series name, t, value, extra labels) -> None: a writer that may cache series ids
SeriesWriter = Callable[..., None]


def write_request(
    store: Store, labels: Mapping[str, str], record: RequestRecord, write: SeriesWriter | None = None, *, event: bool = True
) -> None:
    """Write one request: its per-request series (latency, service, queue wait, TTFT, TPOT, token
    counts, batch size) at its end time, and (unless `event` is False) its `request` event.
    `write(name, t, value, **labels)` lets a monitor use its cached series ids; by default samples
    go through `store.write`. Counters (in flight, totals by status) stay with the source."""
    if write is None:
        def write(name: str, t: float, value: float | None, **extra: str) -> None:
            if value is not None:
                store.write(name, {**labels, **extra} if extra else labels, t, value)

    end = record.end_t
    if record.status in ("ok", "timeout"):
        write(N.INFER_LATENCY_SECONDS, end, record.latency_seconds)
        write(N.INFER_SERVICE_SECONDS, end, record.service_seconds)
        write(N.INFER_QUEUE_WAIT_SECONDS, end, record.start_t - record.arrival_t)
    if record.status == "ok":
        if record.ttft_seconds is not None:
            write(N.INFER_TTFT_SECONDS, end, record.ttft_seconds)
        write(N.INFER_TPOT_SECONDS, end, record.tpot_seconds)
        write(N.INFER_OUTPUT_TOKENS, end, record.output_tokens)
        write(N.INFER_PROMPT_TOKENS, end, record.prompt_tokens)
    write(N.INFER_BATCH_SIZE, end, record.batch_size)
    if event:
        store.event(N.EV_REQUEST, end, labels, record.to_event_data())
