"""The callback engine that runs plain-HTTP load (bench/serve/plain_engine.py) against real local
servers: the paths a task per request used to cover and the throughput work must keep, i.e. a
connection bound with requests waiting (their clock running), a stop that cancels what is in flight
and counts the rest of the schedule as not sent, the retry of a reused connection the server closed,
timeouts from the sweep, https, where bodies end (chunked over many reads, at close, cut short); and
batched histogram recording equal to recording one by one."""

from __future__ import annotations

import asyncio
import random
import ssl
import subprocess
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest
from testlib import which_or_skip

from gpulens.bench.serve import LoadSpec, Target, precise_loop, run_load
from gpulens.bench.serve.runner import CANCELLED_ERROR, Progress, _Run
from gpulens.bench.serve.stats import Distribution


def test_batched_recording_equals_recording_each_value():
    rng = random.Random(7)
    values = [rng.lognormvariate(-6, 2) for _ in range(5000)] + [0.0, 1e-7, 4e-4, 5000.0, 3600.0]
    one, batch = Distribution(), Distribution()
    for v in values:
        one.record(v)
    batch.record_many(values[:1000])
    batch.record_many(values[1000:])
    h1, h2 = one._h, batch._h
    assert np.array_equal(np.ctypeslib.as_array(h1.counts)[: h1.counts_len], np.ctypeslib.as_array(h2.counts)[: h2.counts_len])
    assert (h1.total_count, h1.min_value, h1.max_value, one.clamped) == (h2.total_count, h2.min_value, h2.max_value, batch.clamped) == (
        len(values), 1, 3600 * 1_000_000, 1)
    a, b = one.summary(), batch.summary()
    assert (a.p50, a.p99, a.p99_9, a.max, a.count) == (b.p50, b.p99, b.p99_9, b.max, b.count)
    assert a.mean == pytest.approx(b.mean, rel=1e-12)
    merged = Distribution()
    merged.merge_encoded(batch.encode())  # what --workers sends between processes
    assert merged.summary().p99 == a.p99 and merged.count == len(values)


def test_a_connection_bound_queues_requests_and_charges_their_wait(timed_server):
    """2 connections to a 20 ms server serve 100 req/s; 200 req/s for 0.25 s (50 requests) must
    queue, and the last ones wait about 0.25 s from their intended send. A slow machine only adds."""
    s = run_load(LoadSpec(Target(f"{timed_server}/fixed/bound?ms=20"), rate=200, duration_seconds=0.25,
                          max_connections=2)).summary
    assert s.requests.ok == s.requests.total == 50
    assert s.latency.max >= 0.2 and s.latency.p50 >= 0.02
    assert s.latency_uncorrected.max >= 0.2  # sent on schedule into the queue: the wait is the server's side


def test_a_stop_cancels_what_is_in_flight_and_counts_the_rest_as_not_sent(timed_server):
    spec = LoadSpec(Target(f"{timed_server}/fixed/stop?ms=20000"), rate=20, duration_seconds=2, timeout_seconds=60)

    stopped_at: list[float] = []

    async def main():
        run = _Run(spec, 0, 1, Progress())

        async def stop_once_running():
            # 0.3 s after the run's clock starts: before it, a run collects garbage once (gc_pauses), which
            # in a whole suite's large heap can itself outlast 0.3 s
            while run.progress.started_at is None:
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.3)
            run.stop.set()
            stopped_at.append(time.perf_counter() - run.progress.started_at)

        stopper = asyncio.get_running_loop().create_task(stop_once_running())
        result = await run.run(None)
        await stopper
        return result

    result = precise_loop.run(main())
    # ~7 sent in the first 0.3 s; however late a loaded machine set the stop, nothing was sent after it
    assert result.interrupted and len(result.records) >= 3
    assert all(r.intended <= stopped_at[0] for r in result.records), (stopped_at, [r.intended for r in result.records])
    assert all(r.error == CANCELLED_ERROR and r.end is None for r in result.records)
    assert len(result.records) + result.not_sent == 40
    # nobody waited for the answers: the first is due 20 s after the start; 15 s leaves a loaded machine room
    assert result.wall_seconds < 15


class _CloseAfterEach(asyncio.Protocol):
    """Answers every request with a keep-alive 500, then closes: the client's next request, already
    sent on the reused connection, has not been read."""

    def __init__(self, seen: list[bytes]) -> None:
        self.seen, self.buf = seen, b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if b"\r\n\r\n" in self.buf:
            self.seen.append(self.buf)
            self.buf = b""
            self.t.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\noops")  # type: ignore[attr-defined]
            self.t.close()


class _Ok(_CloseAfterEach):
    """Answers every request with a keep-alive 200."""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            self.seen.append(self.buf[:end])
            self.buf = self.buf[end + 4 :]
            self.t.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")  # type: ignore[attr-defined]


@contextmanager
def _serving(protocol, ssl_context=None):
    """A real asyncio server on its own thread and loop; yields (port, requests seen)."""
    seen: list[bytes] = []
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(loop.create_server(lambda: protocol(seen), "127.0.0.1", 0, ssl=ssl_context))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield server.sockets[0].getsockname()[1], seen
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        server.close()
        loop.close()


def test_a_reused_connection_the_server_closed_is_retried_once():
    with _serving(_CloseAfterEach) as (port, seen):
        res = run_load(LoadSpec(Target(f"http://127.0.0.1:{port}/"), concurrency=1, max_requests=5,
                                duration_seconds=None, timeout_seconds=5), max_error_ratio=1)
    assert [r.http_status for r in res.records] == [500] * 5, [r.error for r in res.records]
    assert res.records[0].error == "HTTP 500 Internal Server Error: oops"
    assert len(seen) == 5  # each request reached the server exactly once


def test_timeouts_end_at_their_deadline_and_free_the_connection(timed_server):
    # 1 s of sending (it was 0.5 s): each user's second request must leave within it, after its first
    # timed out at 0.2 s, so a loaded machine has 0.8 s to run that timeout, not 0.3 s
    s = run_load(LoadSpec(Target(f"{timed_server}/fixed/late?ms=3000"), concurrency=2, duration_seconds=1.0,
                          timeout_seconds=0.2), max_error_ratio=1)
    recs = s.records
    assert s.summary.requests.timeout == len(recs) >= 4  # each user's requests time out one after another
    assert all(r.end == pytest.approx(r.sent + 0.2, abs=1e-9) for r in recs)
    assert s.summary.latency.p50 >= 0.2


def test_https_through_the_engine_verifies_unless_insecure(tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run([which_or_skip("openssl"), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    with _serving(_Ok, ctx) as (port, seen):
        url = f"https://127.0.0.1:{port}/"
        strict = run_load(LoadSpec(Target(url), concurrency=1, max_requests=2, duration_seconds=None,
                                   timeout_seconds=5), max_error_ratio=1).summary
        insecure = run_load(LoadSpec(Target(url), concurrency=2, max_requests=20, duration_seconds=None,
                                     timeout_seconds=5, verify_tls=False)).summary
    assert strict.requests.error == 2 and "CERTIFICATE_VERIFY_FAILED" in strict.first_error
    assert insecure.requests.ok == 20 and len(seen) == 20


def _answering(answer: bytes, close: bool):
    class _Fixed(_CloseAfterEach):
        def data_received(self, data: bytes) -> None:
            self.buf += data
            if b"\r\n\r\n" in self.buf:
                self.seen.append(self.buf)
                self.buf = b""
                self.t.write(answer)  # type: ignore[attr-defined]
                if close:
                    self.t.close()

    return _Fixed


@pytest.mark.parametrize(("answer", "close", "ok"), [
    # chunked, larger than the engine's read buffer: many reads for one answer
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"10000\r\n" + b"x" * 0x10000 + b"\r\n" * 1
     + (b"10000\r\n" + b"y" * 0x10000 + b"\r\n") * 4 + b"0\r\n\r\n", False, True),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nthe body ends when the connection does", True, True),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\ntoo short", True, False),
])
def test_bodies_end_where_http_says(answer, close, ok):
    with _serving(_answering(answer, close)) as (port, seen):
        s = run_load(LoadSpec(Target(f"http://127.0.0.1:{port}/"), concurrency=2, max_requests=6, duration_seconds=None,
                              timeout_seconds=5), max_error_ratio=1).summary
    assert len(seen) == 6
    if ok:
        assert s.requests.ok == 6, s.first_error
    else:
        assert s.requests.error == 6 and "closed the connection before the answer ended" in s.first_error
