"""/metrics cannot be exhausted by slow or numerous clients (issue 27, item 4): 300 slowloris
connections while a real client is answered, a bounded thread count, heads cut at the header
timeout, a body at the body timeout, oversized heads refused, load beyond the workers shed with 503
and Retry-After, and normal answers within seconds of a burst ending. Real servers, real sockets;
short limits configured for the test."""

from __future__ import annotations

import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from testlib import wait_until

from gpulens import FakeBackend
from gpulens.exporter.exposition import start_metrics_server
from gpulens.exporter.listener import BoundedHttpServer, ConnectionLimits
from gpulens.exporter.prometheus import LatestReadings, make_registry

FAST = ConnectionLimits(header_timeout_seconds=1.0, body_timeout_seconds=1.0, workers=2, max_queued=4,
                        queue_wait_seconds=1.0)


@contextmanager
def _server(limits: ConnectionLimits = FAST, slow_render: threading.Event | None = None) -> Iterator[BoundedHttpServer]:
    fake = FakeBackend(gpus=2)
    readings = LatestReadings(host="node-a", gpus=fake.gpus())
    readings.update(fake.sample())
    registry = make_registry(readings)
    if slow_render is not None:  # a collector that holds each render until the test lets go
        class Held:
            def collect(self):  # noqa: ANN202
                slow_render.wait(60)
                return iter(())

        registry.register(Held())  # type: ignore[arg-type]
    server = start_metrics_server(registry, "127.0.0.1", 0, limits=limits)
    try:
        yield server
    finally:
        if slow_render is not None:
            slow_render.set()
        server.shutdown()
        server.server_close()


def _url(server: BoundedHttpServer, path: str = "/metrics") -> str:
    return f"http://127.0.0.1:{server.server_address[1]}{path}"


def _get(url: str, method: str = "GET", timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def _threads() -> int:
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else threading.active_count()


def _slowloris(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-a: ")  # a head that never ends
        socks.append(s)
    return socks


def _closed_by_server(sock: socket.socket, within_seconds: float) -> bool:
    sock.settimeout(within_seconds)
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
    except TimeoutError:
        return False
    except OSError:
        return True


def test_300_slowloris_connections_hold_no_threads_and_a_real_client_is_answered():
    with _server(ConnectionLimits(header_timeout_seconds=30.0)) as server:
        assert _get(_url(server))[0] == 200  # the loop and its workers run
        before = _threads()
        slow = _slowloris(server.server_address[1], 300)
        try:
            for s in slow[::10]:  # a byte more now and then: still no complete head
                s.sendall(b"a")
            t0 = time.monotonic()
            status, _, body = _get(_url(server), timeout=20)
            assert status == 200 and b"gpu_up" in body
            # stuck behind the slow heads it would wait for their 30 s timeout; half that leaves a loaded machine room
            assert time.monotonic() - t0 < 15.0
            assert _threads() <= before  # no thread per connection
        finally:
            for s in slow:
                s.close()


def test_slow_heads_and_bodies_are_closed_at_their_timeouts():
    with _server() as server:
        port = server.server_address[1]
        slow = _slowloris(port, 20)
        silent = socket.create_connection(("127.0.0.1", port))
        body = socket.create_connection(("127.0.0.1", port))
        body.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly part")
        try:
            # cut at the 1 s timeouts; 30 s each to see it leaves a loaded machine room, and a
            # connection never cut still fails
            assert all(_closed_by_server(s, 30.0) for s in [*slow, silent, body])
            assert server.refused["header timeout"] >= 21
            assert server.refused["body timeout"] == 1
            assert _get(_url(server))[0] == 200
        finally:
            for s in [*slow, silent, body]:
                s.close()


def test_an_oversized_head_is_refused_with_431_even_in_one_packet():
    with _server() as server, socket.create_connection(("127.0.0.1", server.server_address[1])) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-big: " + b"a" * (62 * 1024) + b"\r\n\r\n")
        s.settimeout(5)
        assert s.recv(4096).startswith(b"HTTP/1.1 431 ")
        assert server.refused["head too large"] == 1


def test_head_answers_like_get_without_a_body():
    with _server() as server:
        status, headers, body = _get(_url(server), "HEAD")
        get_status, get_headers, get_body = _get(_url(server))
        assert (status, body) == (200, b"")
        assert get_status == 200 and len(get_body) > 0
        assert headers["Content-Type"] == get_headers["Content-Type"]
        assert _get(_url(server, "/health"), "HEAD")[:3:2] == (200, b"")


def test_keep_alive_serves_many_requests_on_one_connection():
    import http.client

    with _server() as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
        try:
            for _ in range(5):
                conn.request("GET", "/health")
                r = conn.getresponse()
                assert (r.status, r.read()) == (200, b"ok\n")
            assert conn.sock is not None  # the same connection all along
        finally:
            conn.close()


def test_load_beyond_the_workers_is_shed_with_503_and_retry_after_then_recovers():
    held = threading.Event()
    with _server(FAST, slow_render=held) as server:
        results: list[tuple[int, dict[str, str]]] = []

        def one() -> None:
            status, headers, _ = _get(_url(server), timeout=30)
            results.append((status, headers))

        threads = [threading.Thread(target=one) for _ in range(20)]  # 2 workers + 4 queued: the rest is shed
        for t in threads:
            t.start()
        wait_until(lambda: server.refused["busy"] >= 10, 60, "requests past the queue to be shed")
        shed = [h for s, h in results if s == 503]
        assert shed and all(h.get("Retry-After") == "1" for h in shed)
        held.set()  # the load stops: the held renders finish
        for t in threads:
            t.join(30)
        assert len(results) == 20 and {s for s, _ in results} <= {200, 503}
        wait_until(lambda: _get(_url(server), timeout=5)[0] == 200, 30, "a normal answer after the burst")


@pytest.mark.parametrize("head", [
    b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n",
    b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
])
def test_bodies_it_will_not_read_are_refused_at_once(head):
    with _server() as server, socket.create_connection(("127.0.0.1", server.server_address[1])) as s:
        s.sendall(head)
        s.settimeout(5)
        assert s.recv(4096)[:12] in (b"HTTP/1.1 411", b"HTTP/1.1 413", b"HTTP/1.1 400")


def test_connections_that_never_finish_the_tls_handshake_are_closed_and_hold_no_thread(tmp_path):
    import ssl

    from tlslib import make_certs

    from gpulens.webconfig import load_web_config

    certs = make_certs(tmp_path)
    (tmp_path / "web.yml").write_text(f"tls_server_config:\n  cert_file: {certs.server_cert}\n  key_file: {certs.server_key}\n")
    fake = FakeBackend(gpus=1)
    readings = LatestReadings(host="node-a", gpus=fake.gpus())
    readings.update(fake.sample())
    server = start_metrics_server(make_registry(readings), "127.0.0.1", 0, limits=FAST,
                                  web_config=load_web_config(tmp_path / "web.yml"))
    port = server.server_address[1]
    try:
        client = ssl.create_default_context(cafile=str(certs.ca))
        url = f"https://127.0.0.1:{port}/metrics"
        assert urllib.request.urlopen(url, context=client, timeout=10).status == 200
        before = _threads()
        stalled = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]  # TCP only, no ClientHello
        stalled[0].sendall(b"\x16\x03\x01")  # a ClientHello begun, never finished
        try:
            with urllib.request.urlopen(url, context=client, timeout=10) as r:
                assert r.status == 200 and b"gpu_up" in r.read()
            assert _threads() <= before
            assert all(_closed_by_server(s, 30.0) for s in stalled)  # cut at the 1 s header timeout
            assert server.refused["header timeout"] >= 50
        finally:
            for s in stalled:
                s.close()
    finally:
        server.shutdown()
        server.server_close()


def test_refusals_are_counted_on_metrics_by_cause():
    with _server() as server, socket.create_connection(("127.0.0.1", server.server_address[1])) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-big: " + b"a" * (20 * 1024) + b"\r\n\r\n")
        s.settimeout(5)
        assert s.recv(4096).startswith(b"HTTP/1.1 431 ")
        body = _get(_url(server))[2].decode()
        assert 'gpulens_http_refused_total{cause="head too large"} 1.0' in body
        assert 'gpulens_http_refused_total{cause="busy"} 0.0' in body
