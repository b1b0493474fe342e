"""`InferenceMonitor`: what a serving process records about itself, per request.

    monitor = InferenceMonitor("gpulens.db", service="chat", model="llama-8b")
    with monitor.model_load():            # cold start: model construction and move to the GPU
        model = load()
    h = monitor.start_request()           # arrival
    h.started()                           # left the queue, processing begins (optional)
    h.token()                             # each streamed token (the first one sets TTFT)
    h.finish("ok", output_tokens=32, batch_size=4)

Every finished request becomes one sample of each `infer_*` series at its end time (labels service,
model, host) and one `request` event holding its timestamps, which is what diagnosis reads. What the
process counts itself, requests in flight and finished by status, is labelled with its pid too: the
workers of a pre-fork server each count their own, and readers add them up.
Writes are buffered and committed once a second; whatever is buffered when the process ends
(a normal exit, or SIGTERM from a job runner) is committed then, so `close()` is optional. While the
store refuses writes the buffer is bounded (`max_buffered_rows`, the oldest go, counted in
`dropped_rows`).

With `agent="unix:/run/gpulens/ingest.sock"` (or $GPULENS_AGENT, which the Helm chart sets) and no
store, the same things go to the node's agent over its socket as records (`workload.wire`): a
sender thread batches them, keeps them while the agent restarts (bounded; `dropped_rows` counts
what a full buffer dropped) and sends what is left at exit. The agent stores them through the
inference importer, as the same series and events.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gpulens.clock import Clock, as_clock
from gpulens.errors import MonitorUsageError, StoreError
from gpulens.k8s.node import node_host
from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.workload import exit_flush
from gpulens.workload.agent_client import AgentSender, agent_address_for
from gpulens.workload.inference.records import RequestRecord, write_request

log = logging.getLogger(__name__)

RequestStatus = Literal["ok", "error", "timeout", "rejected", "aborted"]
STATUSES: tuple[str, ...] = N.REQUEST_STATUSES  # aborted: the client went away before the answer


@dataclass
class RequestHandle:
    """One request in flight. Times are unix seconds from the monitor's clock."""

    monitor: InferenceMonitor
    arrival: float
    start: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    tokens: int = 0
    itl_sum: float = 0.0
    finished: bool = False
    fields: dict[str, Any] = field(default_factory=dict)

    def started(self) -> None:
        """Processing begins (the request left the server's queue)."""
        if self.start is None:
            self.start = self.monitor.clock()

    def token(self, n: int = 1) -> None:
        """`n` output tokens were produced (streamed); the first call sets time to first token."""
        now = self.monitor.clock()
        if self.start is None:
            self.start = self.arrival
        if self.first_token is None:
            self.first_token = now
        elif self.last_token is not None:
            self.itl_sum += now - self.last_token
        self.last_token = now
        self.tokens += n

    def set(self, **fields: Any) -> None:
        """Attach what the server knows: output_tokens, prompt_tokens, batch_size."""
        self.fields.update(fields)

    def finish(self, status: RequestStatus = "ok", **fields: Any) -> None:
        if self.finished:
            raise MonitorUsageError("This request was already finished.", hint="Call finish() once per request.")
        if status not in STATUSES:
            raise MonitorUsageError(f"Unknown request status {status!r}.", hint=f"Use one of {', '.join(STATUSES)}.")
        self.finished = True
        self.fields.update(fields)
        self.monitor._finish(self, status, self.monitor.clock())


# The parent's store and sender copies in a forked child: never used, never closed (see _forked_copy).
_INHERITED: list[tuple[object, object]] = []
_restart_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _restart_lock
    _restart_lock = threading.Lock()  # another thread may have held it at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class InferenceMonitor:
    """Records requests, gauges and model loads of one service into a store. Thread-safe.

    clock: a `gpulens.clock.Clock` (a `FakeClock` in tests) or a bare function returning unix
    seconds; default the real clock. Request times are its `time()` (they are stored as
    timestamps, and durations are their differences); a model load is timed on its `monotonic()`.
    max_buffered_rows: how many rows a store that refuses writes may hold for later (for a store
    passed in, its own `max_pending_rows` holds); with an agent, how many records wait for it.
    agent: the node agent's address, "unix:PATH" or "127.0.0.1:PORT", to send to instead of a store
    file (then `store` may be None); default $GPULENS_AGENT unless a `Store` is passed; "off": the store.
    """

    def __init__(
        self,
        store: Store | str | Path | None = None,
        *,
        service: str,
        model: str = "",
        host: str | None = None,
        clock: Clock | Callable[[], float] | None = None,
        write_events: bool = True,
        flush_interval_seconds: float | None = 1.0,
        max_buffered_rows: int = 1_000_000,
        agent: str | None = None,
    ):
        address = agent_address_for(agent, store)
        self._sender: AgentSender | None = None
        if address is not None:
            self._own_store = False
            self.store = None
            self._sender = AgentSender(address, max_buffered_records=max_buffered_rows, name="gpulens-inference-sender")
        elif store is None:
            raise MonitorUsageError("InferenceMonitor needs a store or an agent to write to.",
                                    hint="Pass a store path (InferenceMonitor('gpulens.db', service=...)) or agent='unix:PATH'.")
        else:
            self._own_store = not isinstance(store, Store)
            self.store = Store(store, max_pending_rows=max_buffered_rows) if self._own_store else store  # type: ignore[arg-type]
        self._closed = False
        self.labels = {"service": service, "model": model, "host": node_host(host)}
        self.clock = as_clock(clock)  # calling it gives unix seconds, as the older bare-function clocks did
        self.write_events = write_events
        self._flush_interval_seconds = flush_interval_seconds
        self._start_in_this_process()

    def _start_in_this_process(self) -> None:
        """The per-process half: counters, lock, flusher thread, exit hook, and the announcement of
        who serves (the co-location guard matches this pid to the GPU's process list)."""
        self._lock = threading.Lock()
        self._ids: dict[tuple[str, str], int] = {}  # a fork's counters are its own series (its pid's)
        self._pid = os.getpid()
        self._in_flight = 0
        self._totals = dict.fromkeys(STATUSES, 0)
        self._unresolved: deque[tuple[tuple[str, str], dict[str, str], float, float]] = deque()
        self._stop = threading.Event()
        self._flusher = None
        if self._sender is not None:
            self._sender.send({"kind": N.EV_INFER_START, "t": self.clock(), "pid": self._pid, **self.labels})
        else:
            self.store.event(N.EV_INFER_START, self.clock(), self.labels, {"pid": self._pid, **self.labels})
        if self._flush_interval_seconds and self._sender is None:  # a sender has its own thread
            # Commit in the background so the request path only appends to a buffer.
            self._flusher = threading.Thread(target=self._flush_loop, args=(self._flush_interval_seconds,), daemon=True,
                                             name="gpulens-inference-flush")
            self._flusher.start()
        exit_flush.register(self, self.close)  # nothing given to the monitor is lost at exit
        self._made_in_pid = exit_flush.current_pid  # last: other threads of a fork wait until all above is new

    def _forked_copy(self) -> bool:
        """In a process forked after this monitor was made (a gunicorn --preload worker), start it
        over here, once, on first use: its own store connection or agent connection, flusher and
        counters. The parent's buffered rows are the parent's to write, and the copies of its
        connection are kept unclosed (`_INHERITED`): SQLite's must not be used or closed across a
        fork, and the agent socket is still the parent's. True where it records nothing: closed
        before the fork, or its store could not be opened here (said once; the request is served)."""
        if self._made_in_pid == exit_flush.current_pid:
            return False
        with _restart_lock:
            if self._made_in_pid != exit_flush.current_pid and not self._closed:
                self._restart_in_fork()
        return self._made_in_pid != exit_flush.current_pid

    def _restart_in_fork(self) -> None:
        _INHERITED.append((self._sender, self.store))
        try:
            if self._sender is not None:
                old = self._sender
                self._sender = AgentSender(old.address, max_buffered_records=old.max_buffered_records,
                                           name="gpulens-inference-sender")
            else:
                self.store = Store(self.store.path, max_pending_rows=self.store.max_pending_rows)
                self._own_store = True
            self._start_in_this_process()
        except (StoreError, OSError) as e:
            self._closed = True
            self._release_new_connection()
            log.error("gpulens: the InferenceMonitor made in process %d could not start over in %d, a fork of it: %s. "
                      "Nothing is recorded in this process.", self._made_in_pid, os.getpid(), e)

    def _release_new_connection(self) -> None:
        """After a failed start-over: close what it had opened here (never the parent's copies)."""
        fresh = self._sender if self.store is None else self.store
        if any(fresh is kept for pair in _INHERITED for kept in pair):
            return
        try:
            fresh.close()  # type: ignore[union-attr]
        except (StoreError, OSError):
            pass

    # ------------------------------------------------------------------ requests
    def start_request(self, arrival: float | None = None) -> RequestHandle:
        now = self.clock() if arrival is None else arrival
        if self._forked_copy():
            return RequestHandle(self, now)
        with self._lock:
            self._in_flight += 1
            if self._sender is not None:
                self._sender.send({"kind": N.REC_INFER_GAUGES, "t": now, **self.labels, "in_flight": self._in_flight,
                                   N.PID_LABEL: self._pid})
            else:
                self._write(N.INFER_IN_FLIGHT, now, self._in_flight, pid=str(self._pid))
        return RequestHandle(self, now)

    @contextmanager
    def request(self) -> Iterator[RequestHandle]:
        """`with monitor.request() as h:` finishes ok, or error when the block raises."""
        h = self.start_request()
        try:
            yield h
        except TimeoutError:
            if not h.finished:
                h.finish("timeout")
            raise
        except BaseException:
            if not h.finished:
                h.finish("error")
            raise
        if not h.finished:
            h.finish("ok")

    def _finish(self, h: RequestHandle, status: str, end: float) -> None:
        if self._forked_copy():
            return
        start = h.start if h.start is not None else h.arrival
        out_tokens = h.fields.get("output_tokens", h.tokens or None)
        tpot = None
        if h.first_token is not None and out_tokens and out_tokens > 1:
            tpot = (end - h.first_token) / (out_tokens - 1)
        itl = h.itl_sum / (h.tokens - 1) if h.tokens > 1 else None
        fields = {k: v for k, v in h.fields.items() if k != "output_tokens"}
        record = RequestRecord(
            arrival_t=h.arrival, start_t=start, end_t=end, status=status, first_token_t=h.first_token,
            prompt_tokens=fields.pop("prompt_tokens", None), output_tokens=out_tokens, tpot_seconds=tpot,
            pid=os.getpid(), batch_size=fields.pop("batch_size", None),
            queue_depth_at_start=fields.pop("queue_depth_at_start", None), extra=fields,
        )
        with self._lock:
            self._in_flight -= 1
            self._totals[status] += 1
            if self._sender is not None:
                # the monitor's own counters ride along, so the agent's restarts never reset them
                self._sender.send({"kind": N.EV_REQUEST, **self.labels, **record.to_event_data(),
                                   "requests_total": self._totals[status], "in_flight": self._in_flight, "itl_s": itl,
                                   **({} if self.write_events else {"store_event": False})})
                return
            w = self._write
            w(N.INFER_IN_FLIGHT, end, self._in_flight, pid=str(self._pid))
            w(N.INFER_REQUESTS_TOTAL, end, self._totals[status], status=status, pid=str(self._pid))
            if status == "ok":
                w(N.INFER_ITL_SECONDS, end, itl)
            write_request(self.store, self.labels, record, w, event=self.write_events)

    # ------------------------------------------------------------------ gauges and loads
    def set_queue_depth(self, depth: int, t: float | None = None) -> None:
        if self._forked_copy():
            return
        with self._lock:
            if self._sender is not None:
                self._send_gauges(self.clock() if t is None else t, queue_depth=depth)
                return
            self._write(N.INFER_QUEUE_DEPTH, self.clock() if t is None else t, depth)

    def set_memory(self, allocated_bytes: float | None = None, reserved_bytes: float | None = None,
                   kv_cache_usage_ratio: float | None = None, t: float | None = None) -> None:
        t = self.clock() if t is None else t
        if self._forked_copy():
            return
        with self._lock:
            if self._sender is not None:
                self._send_gauges(t, allocated_bytes=allocated_bytes, reserved_bytes=reserved_bytes,
                                  kv_cache_usage_ratio=kv_cache_usage_ratio)
                return
            self._write(N.INFER_MEMORY_ALLOCATED_BYTES, t, allocated_bytes)
            self._write(N.INFER_MEMORY_RESERVED_BYTES, t, reserved_bytes)
            self._write(N.INFER_KV_CACHE_USAGE_RATIO, t, kv_cache_usage_ratio)

    def record_cold_start(self, seconds: float, *, t: float | None = None, **data: Any) -> None:
        """A model load of `seconds` that ended at `t` (now by default)."""
        t = self.clock() if t is None else t
        if self._forked_copy():
            return
        with self._lock:
            if self._sender is not None:
                self._sender.send({"kind": N.EV_COLD_START, **self.labels, **data, "t": t, "seconds": seconds})
                return
            self._write(N.INFER_COLD_START_SECONDS, t, seconds)
            self.store.event(N.EV_COLD_START, t, self.labels, {"seconds": seconds, **data})

    @contextmanager
    def model_load(self, **data: Any) -> Iterator[None]:
        """Time a model load (construction, weights, move to the GPU, warm-up) as a cold start."""
        t0 = self.clock.monotonic()
        yield
        self.record_cold_start(self.clock.monotonic() - t0, **data)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def dropped_rows(self) -> int:
        """Rows dropped because the store refused writes (or the agent was away) for longer than the buffer holds."""
        return self._sender.records_dropped if self._sender is not None else self.store.dropped_rows

    def _send_gauges(self, t: float, **values: float | None) -> None:
        measured = {k: v for k, v in values.items() if v is not None}
        if measured:
            self._sender.send({"kind": N.REC_INFER_GAUGES, "t": t, **self.labels, **measured})  # type: ignore[union-attr]

    # ------------------------------------------------------------------ plumbing
    def _write(self, name: str, t: float, value: float | None, **extra: str) -> None:
        if value is None:
            return
        key = (name, extra.get("status", ""))
        sid = self._ids.get(key)
        if sid is None and not self._unresolved:  # once the store refused a series, retry at the next flush
            try:
                sid = self._ids[key] = self.store.series_id(name, {**self.labels, **extra})
            except StoreError:  # store locked or gone: hold the row below
                pass
        if sid is None:
            self._unresolved.append((key, extra, t, float(value)))
            if len(self._unresolved) > self.store.max_pending_rows:  # bounded like the store's own buffer
                self._unresolved.popleft()
                self.store.dropped_rows += 1
            return
        self.store.write_id(sid, t, float(value))

    def _resolve_held(self) -> None:
        """Buffer the rows whose series could not be created before, in order, while it works."""
        with self._lock:
            while self._unresolved:
                key, extra, t, value = self._unresolved[0]
                sid = self._ids.get(key)
                if sid is None:
                    sid = self._ids[key] = self.store.series_id(key[0], {**self.labels, **extra})
                self.store.write_id(sid, t, value)
                self._unresolved.popleft()

    def _flush_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.flush()
            except Exception:  # a busy or full disk must not kill the server; the data stays buffered
                pass

    def flush(self, timeout_seconds: float = 10.0) -> None:
        if self._sender is not None:
            self._sender.flush(timeout_seconds)
            return
        self._resolve_held()
        self.store.flush()

    @property
    def pending_rows(self) -> int:
        """Rows given to the monitor and not yet committed (records not yet stored by the agent)."""
        if self._sender is not None:
            return self._sender.pending
        return self.store.pending_count + len(self._unresolved)

    def close(self) -> None:
        """Commit what is buffered and stop the flusher. Idempotent; also run at exit and on SIGTERM."""
        if self._closed:
            return
        self._closed = True
        exit_flush.unregister(self)
        self._stop.set()
        if self._flusher is not None and self._flusher is not threading.current_thread():
            self._flusher.join(timeout=2)
        if self._sender is not None:
            self._sender.close()
            return
        try:
            self._resolve_held()
            if self._own_store:
                self.store.close()
            else:
                self.store.flush()
        except StoreError as e:  # the store is gone: say how much is lost rather than raise at exit
            log.error("gpulens: %d buffered rows could not be written to %s: %s", self.pending_rows,
                      self.store.path, e)

    def __enter__(self) -> InferenceMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
