"""The load engine for plain HTTP targets: callbacks on the event loop instead of a task per request.

Where a request's microseconds went (cProfile, closed loop, 32 connections, trivial local server):
an asyncio Task woken per request, a Future per response, an `asyncio.timeout` (a timer-heap push
and a cancel), a generator-based context manager around the pool, and three HdrHistogram
`record_value`s in Python (~2.7 µs each). Here instead

- a request is sent from the callback that ends the previous one (closed loop) or from a timer
  callback at its intended time (open loop): no task, no future;
- the answer is parsed by httptools (C) with only the callbacks the figures need;
- timeouts are one sweep over the requests in flight in send order (their deadlines are in the
  same order), a few times a second, instead of a timer per request;
- latencies go into plain lists and are folded into the histograms in batches
  (`Distribution.record_many`), a few times a second and at the end.

Semantics are those of `runner._Run._one` + `client.send_one`: latency from the intended send, a
reused keep-alive connection that the server closed before answering is retried once on a new one,
`max_connections` bounds the connections (requests beyond wait for one, their clock running).
Streaming completions keep the task-per-request path (`client.send_one`), which reads tokens.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol
from urllib.parse import urlsplit

import httptools

from gpulens.bench.serve.client import CANCELLED_ERROR, REJECT_CODES, RequestRecord

SWEEP_SECONDS = 0.1  # how often timeouts are checked and batches folded into the histograms
_ERROR_BODY_BYTES = 200
_READ_BYTES = 256 * 1024
_perf = time.perf_counter


class RunState(Protocol):
    """What the engine reads and fills of one process's run (`runner._Run`)."""

    spec: Any  # runner.LoadSpec
    worker: int
    workers: int
    progress: Any  # runner.Progress
    records: list[RequestRecord]
    dists: dict[str, Any]  # name -> stats.Distribution
    stop: asyncio.Event
    t0: float
    raw: bytes
    plans: list[tuple[bytes, int | None, int | None]] | None
    not_sent: int


class _Conn(asyncio.BufferedProtocol):
    """One keep-alive connection and the request in flight on it, if any. Buffered: answers are
    read into the engine's one buffer (asyncio's plain protocols allocate 256 KiB per read), which
    every connection can share because each read is parsed, and its bytes copied out, before the
    loop reads again."""

    def __init__(self, engine: PlainEngine) -> None:
        self.engine = engine
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.rec: RequestRecord | None = None
        self.raw = b""
        self.reused = False  # an exchange completed on it before the one in flight
        self.retried = False
        self.answered = False
        self.closed = False
        self.status = 0
        self.reason = b""
        self.sized = False  # Content-Length or Transfer-Encoding seen: the body does not end at close
        self.headers_done = False
        self.body: bytearray | None = None
        self.buffer = engine.buffer

    def send(self, rec: RequestRecord, raw: bytes) -> None:
        self.rec, self.raw = rec, raw
        self.answered = self.headers_done = self.sized = False
        self.transport.write(raw)  # type: ignore[union-attr]

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.answered = True
        try:
            self.parser.feed_data(self.buffer[:nbytes])
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as e:
            self.engine.failed(self, f"the server's answer is not valid HTTP/1.1 ({e})")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.engine.lost(self, exc)

    # httptools callbacks
    def on_status(self, status: bytes) -> None:
        self.reason = status

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.sized and name.lower() in (b"content-length", b"transfer-encoding"):
            self.sized = True

    def on_headers_complete(self) -> None:
        self.headers_done = True
        self.status = s = self.parser.get_status_code()
        self.body = bytearray() if s >= 400 else None

    def on_body(self, body: bytes) -> None:
        b = self.body
        if b is not None and len(b) < _ERROR_BODY_BYTES:
            b += body

    def on_message_complete(self) -> None:
        self.engine.completed(self, self.parser.should_keep_alive())


class PlainEngine:
    """One process's share of an open or closed loop, for `runner._Run` (whose records, histograms,
    progress and stop event it fills and watches)."""

    def __init__(self, run: RunState) -> None:
        self.run = run
        spec = run.spec
        self.spec = spec
        self.loop = asyncio.get_running_loop()
        parts = urlsplit(spec.target.url)
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self.ssl = ssl.create_default_context()
            if not spec.verify_tls:
                self.ssl.check_hostname = False
                self.ssl.verify_mode = ssl.CERT_NONE
        self.timeout = spec.timeout_seconds
        self.buffer = memoryview(bytearray(_READ_BYTES))  # shared by the connections (see _Conn)
        self.max_connections = spec.max_connections
        self.t0 = run.t0
        self.idle: list[_Conn] = []
        self.conns: set[_Conn] = set()  # open or opening
        self.opening_tasks: set[asyncio.Task] = set()
        self.waiting: deque[RequestRecord] = deque()  # sent (clock running), waiting for a connection
        self.in_flight: deque[RequestRecord] = deque()  # send order = deadline order; finished ones skipped
        self.active = 0
        self.raws: dict[int, bytes] = {}  # record index -> its bytes, for planned workloads only
        self.done = self.loop.create_future()
        self.on_finished: Callable[[RequestRecord], None] | None = None
        self.feeding = True  # more requests may still come (schedule or users not exhausted)
        # Batches for the histograms: folded in by `flush`.
        self.b_lag: list[float] = []
        self.b_latency: list[float] = []
        self.b_uncorrected: list[float] = []
        self._sweeper: asyncio.TimerHandle | None = None

    # -- requests ---------------------------------------------------------------------------------

    def _raw_for(self, rec: RequestRecord, plan: int | None = None) -> bytes:
        plans = self.run.plans
        if plans is None:
            return self.run.raw
        raw, rec.input_tokens, rec.planned_output_tokens = plans[(rec.index if plan is None else plan) % len(plans)]
        return raw

    def start(self, rec: RequestRecord, raw: bytes, now: float | None = None) -> None:
        """Send `rec` now (`now`: perf_counter, when the caller has just read it): on an idle
        connection, else a new one, else when one frees."""
        run = self.run
        run.records.append(rec)
        p = run.progress
        p.sent += 1
        p.in_flight += 1
        self.active += 1
        self.in_flight.append(rec)
        rec.sent = (_perf() if now is None else now) - self.t0
        idle = self.idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                conn.send(rec, raw)
                return
        if raw is not self.run.raw:
            self.raws[rec.index] = raw
        if len(self.conns) < self.max_connections:
            self._open(rec, raw, retry=False)
        else:
            self.waiting.append(rec)

    def _open(self, rec: RequestRecord, raw: bytes, *, retry: bool) -> None:
        """Open a connection and send `rec` on it. It counts against max_connections from now,
        before its task first runs: several sends in one turn of the loop see each other's."""
        placeholder = _Conn(self)
        self.conns.add(placeholder)
        task = self.loop.create_task(self._open_and_send(placeholder, rec, raw, retry=retry))
        self.opening_tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self.opening_tasks.discard)

    async def _open_and_send(self, placeholder: _Conn, rec: RequestRecord, raw: bytes, *, retry: bool) -> None:
        try:
            _t, conn = await asyncio.wait_for(
                self.loop.create_connection(lambda: _Conn(self), self.host, self.port, ssl=self.ssl), self.timeout)
        except (OSError, TimeoutError) as e:
            self.conns.discard(placeholder)
            if isinstance(e, TimeoutError):
                why = f"cannot connect: no answer within {self.timeout:g} s"
            else:
                why = f"cannot connect: {e.strerror or e}"
            if rec.end is None and rec.error is None:
                rec.error = why
                self.finish(rec)
            self._next_waiting()
            return
        self.conns.discard(placeholder)
        self.conns.add(conn)
        if rec.end is not None or rec.error is not None:  # it timed out or was stopped meanwhile
            self.release(conn)
            return
        conn.retried = retry
        conn.send(rec, raw)

    def release(self, conn: _Conn) -> None:
        """`conn` is free: give it to a waiting request, else keep it idle."""
        while self.waiting:
            rec = self.waiting.popleft()
            if rec.end is None and rec.error is None:
                conn.send(rec, self.raws.pop(rec.index, self.run.raw))
                return
        self.idle.append(conn)

    def _next_waiting(self) -> None:
        """A connection went away: open another for the first waiting request, if any."""
        while self.waiting and len(self.conns) < self.max_connections:
            rec = self.waiting.popleft()
            if rec.end is None and rec.error is None:
                self._open(rec, self.raws.pop(rec.index, self.run.raw), retry=False)
                return

    # -- connection callbacks ---------------------------------------------------------------------

    def completed(self, conn: _Conn, keep_alive: bool) -> None:
        rec = conn.rec
        if rec is None:
            return
        conn.rec = None
        rec.end = _perf() - self.t0
        status = rec.http_status = conn.status
        if status >= 400:
            rec.status = "rejected" if status in REJECT_CODES else "error"
            body = bytes(conn.body or b"")[:_ERROR_BODY_BYTES]
            reason = conn.reason.decode("latin-1")
            rec.error = f"HTTP {status} {reason}".strip() + (
                f": {body.decode(errors='replace').strip()}" if body.strip() else "")
        else:
            rec.status = "ok"
        if keep_alive and not conn.closed:
            conn.reused = True
            conn.retried = False
            if self.waiting:
                self.release(conn)
            else:
                self.idle.append(conn)
        else:
            self._drop(conn)
        self.finish(rec)

    def failed(self, conn: _Conn, message: str) -> None:
        rec = conn.rec
        conn.rec = None
        self._drop(conn)
        if rec is not None and rec.end is None and rec.error is None:
            rec.error = message
            self.finish(rec)

    def lost(self, conn: _Conn, exc: Exception | None) -> None:
        rec = conn.rec
        self._drop(conn)
        if rec is None:
            return
        conn.rec = None
        if conn.headers_done and not conn.sized and exc is None:
            self.completed_at_close(conn, rec)
            return
        if conn.reused and not conn.answered and not conn.retried:
            # A kept-alive connection the server closed as we sent (after an error answer, or at
            # its idle timeout) has most likely not read the request: send it once more on a new
            # one, as browsers, Go's net/http and urllib3 do. The latency includes it.
            self._open(rec, conn.raw, retry=True)
            return
        why = os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else "closed"
        if rec.end is None and rec.error is None:
            rec.error = f"the server closed the connection before the answer ended ({why.lower()})"
            self.finish(rec)

    def completed_at_close(self, conn: _Conn, rec: RequestRecord) -> None:
        """A body without a length ends when the connection does."""
        conn.rec = rec
        self.completed(conn, keep_alive=False)

    def _drop(self, conn: _Conn) -> None:
        if conn in self.conns:
            self.conns.discard(conn)
            conn.close()
            self._next_waiting()

    # -- bookkeeping ------------------------------------------------------------------------------

    def finish(self, rec: RequestRecord) -> None:
        """`rec` ended (any status): count it, batch its values, let the loop send the next."""
        if self.raws:
            self.raws.pop(rec.index, None)
        p = self.run.progress
        p.done += 1
        p.in_flight -= 1
        st = rec.status
        p.by_status[st] += 1
        self.active -= 1
        sent, end, intended = rec.sent, rec.end, rec.intended
        if sent is not None:
            self.b_lag.append(sent - intended if sent > intended else 0.0)
        if end is not None and (st == "ok" or st == "timeout"):
            self.b_latency.append(end - intended)
            if sent is not None:
                self.b_uncorrected.append(end - sent)
        on_finished = self.on_finished
        if on_finished is not None:
            on_finished(rec)
        if not self.active and not self.feeding and not self.done.done():
            self.done.set_result(None)

    def flush(self) -> None:
        """Fold the batched values into the run's histograms."""
        d = self.run.dists
        for name, batch in (("send_lag", self.b_lag), ("latency", self.b_latency),
                            ("latency_uncorrected", self.b_uncorrected)):
            if batch:
                d[name].record_many(batch)
                batch.clear()

    def _sweep(self) -> None:
        """Time out requests past their deadline (oldest first), fold batches in, re-arm."""
        now = _perf() - self.t0
        q = self.in_flight
        while q:
            rec = q[0]
            if rec.end is not None or rec.error is not None:
                q.popleft()
                continue
            if rec.sent is not None and now - rec.sent < self.timeout:
                break
            q.popleft()
            self._time_out(rec)
        self.flush()
        self._sweeper = self.loop.call_later(min(SWEEP_SECONDS, self.timeout / 4), self._sweep)

    def _time_out(self, rec: RequestRecord) -> None:
        rec.end = (rec.sent or 0.0) + self.timeout
        rec.status = "timeout"
        rec.error = f"no complete response within {self.timeout:g} s"
        for conn in list(self.conns):
            if conn.rec is rec:
                conn.rec = None
                self._drop(conn)
                break
        self.finish(rec)

    def _cancel_all(self, message: str) -> None:
        for rec in list(self.in_flight) + list(self.waiting):
            if rec.end is None and rec.error is None:
                rec.error = message
                self.finish(rec)
        self.in_flight.clear()
        self.waiting.clear()

    # -- the two loops ----------------------------------------------------------------------------

    async def _until_done(self) -> None:
        """Wait for every request to end, or for a stop (which cancels the ones in flight)."""
        self._sweep()
        if not self.active and not self.feeding and not self.done.done():
            self.done.set_result(None)
        stop_wait = asyncio.ensure_future(self.run.stop.wait())
        try:
            await asyncio.wait({self.done, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_wait.cancel()
            if self._sweeper is not None:
                self._sweeper.cancel()
            self.feeding = False
            if not self.done.done():
                self._cancel_all(CANCELLED_ERROR)
            for task in list(self.opening_tasks):
                task.cancel()
            for conn in list(self.conns) + self.idle:
                conn.rec = None
                conn.close()
            self.conns.clear()
            self.idle.clear()
            self.flush()

    async def open_loop(self, schedule: Iterator[float]) -> None:
        """Send request i at t0 + schedule[i], from a timer callback, whatever the answers do."""
        run, loop = self.run, self.loop
        offset = loop.time() - _perf()  # the loop's clock against the run's
        workers, worker = run.workers, run.worker
        state: dict = {"index": 0, "handle": None}  # the armed timer: its request is not sent yet

        t0 = self.t0

        def fire(rel: float | None) -> None:
            # Send every request that is due (after a late wake-up, all of them now, rather than
            # one per turn of the loop), then arm the timer for the next.
            while rel is not None:
                if t0 + rel > _perf():
                    state["handle"] = loop.call_at(t0 + rel + offset, fire, rel)
                    return
                if run.stop.is_set():
                    state["handle"] = True  # counted as not sent below
                    return
                i = state["index"]
                state["index"] = i + 1
                rec = RequestRecord(index=i * workers + worker, worker=worker, intended=rel)
                self.start(rec, self._raw_for(rec))
                rel = next(schedule, None)
            state["handle"] = None
            self.feeding = False
            if not self.active and not self.done.done():
                self.done.set_result(None)

        fire(next(schedule, None))
        try:
            await self._until_done()
        finally:
            handle = state["handle"]
            if handle is not None:  # a request due but not sent, and the rest of the schedule
                if handle is not True:
                    handle.cancel()
                run.not_sent += 1 + sum(1 for _ in schedule)

    async def closed_loop(self, users: int, budget: int | None, end_at: float | None) -> None:
        """`users` requests in flight: each answer (or failure) sends the next at once."""
        run = self.run
        workers, worker = run.workers, run.worker
        index, left, users_left = 0, budget, users
        stop, t0, raw, plans = run.stop, self.t0, run.raw, run.plans

        def next_request(_finished: RequestRecord | None = None) -> None:
            nonlocal index, left, users_left
            now = _perf()
            if left == 0 or stop.is_set() or (end_at is not None and now >= end_at):
                users_left -= 1
                if users_left <= 0:
                    self.feeding = False
                return
            if left is not None:
                left -= 1
            # A closed loop sends when the previous answer arrives: that *is* its intended time.
            rec = RequestRecord(index * workers + worker, worker, now - t0)
            index += 1
            self.start(rec, raw if plans is None else self._raw_for(rec), now)

        self.on_finished = next_request
        for _ in range(users):
            next_request()
        await self._until_done()

