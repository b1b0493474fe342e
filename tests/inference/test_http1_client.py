"""The load tester's HTTP/1.1 client against real local servers that answer with chosen bytes:
content-length, chunked and read-until-close bodies, keep-alive reuse, a connection closed under a
reused request, malformed answers, refused connections."""

from __future__ import annotations

import asyncio
import time

import pytest

from gpulens.bench.serve import LoadSpec, Target, precise_loop
from gpulens.bench.serve.http1 import ConnectError, ConnectionPool, HttpClientError, build_request
from gpulens.errors import BadInputError


class _Scripted(asyncio.Protocol):
    """Answers the n-th request on a connection with `answers[n]`; `close_after` closes after it."""

    def __init__(self, answers: list[bytes], close_after: set[int], seen: list[bytes], connections: list[int]):
        self.answers, self.close_after, self.seen = answers, close_after, seen
        connections.append(1)
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head, self.buf = self.buf[:end], self.buf[end + 4 :]
            n = len(self.seen)
            self.seen.append(head)
            self.t.write(self.answers[min(n, len(self.answers) - 1)])  # type: ignore[attr-defined]
            if n in self.close_after:
                self.t.close()
                return


async def _with_server(answers, body, close_after=frozenset()):
    seen: list[bytes] = []
    connections: list[int] = []
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Scripted(answers, set(close_after), seen, connections), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        return await body(f"http://127.0.0.1:{port}/x?q=1"), seen, connections
    finally:
        server.close()


def _run(coro):
    return precise_loop.run(coro)


def test_content_length_keep_alive_and_reuse():
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"

    async def body(url):
        pool = ConnectionPool(url, max_connections=4, connect_timeout_seconds=2)
        raw = build_request("GET", url, {"X-Test": "1"}, None)
        out = []
        for _ in range(3):
            async with pool.request(raw) as resp:
                out.append((resp.status, resp.reason, await resp.read()))
        pool.close()
        return out

    out, seen, connections = _run(_with_server([ok], body))
    assert out == [(200, "OK", b"hello")] * 3
    assert len(connections) == 1  # one kept-alive connection for all three
    assert seen[0].startswith(b"GET /x?q=1 HTTP/1.1\r\nHost: 127.0.0.1:") and b"X-Test: 1" in seen[0]


def test_chunked_stream_lines_and_read_until_close():
    pieces = [b"data: ", b"a\n\ndata: ", b"b\n\n"]  # lines split across chunks, as streams do
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n")
    until_close = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nno length here"

    async def body(url):
        pool = ConnectionPool(url, max_connections=1, connect_timeout_seconds=2)
        raw = build_request("POST", url, {}, b"{}")
        async with pool.request(raw) as resp:
            lines = [line async for line in resp.iter_lines()]
        async with pool.request(raw) as resp:
            rest = await resp.read()
        pool.close()
        return lines, rest

    (lines, rest), seen, connections = _run(_with_server([chunked, until_close], body, close_after={1}))
    assert lines == [b"data: a", b"", b"data: b", b""]
    assert rest == b"no length here"
    assert b"Content-Length: 2" in seen[0]


def test_a_reused_connection_closed_by_the_server_is_retried_once():
    """uvicorn answers an app's exception with a keep-alive 500, then closes: the next request,
    already on its way, must not count as a failure of the server."""
    err = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\noops"

    async def body(url):
        pool = ConnectionPool(url, max_connections=1, connect_timeout_seconds=2)
        raw = build_request("GET", url, {}, None)
        statuses = []
        for _ in range(3):
            async with pool.request(raw) as resp:
                await resp.read()
                statuses.append(resp.status)
        pool.close()
        return statuses

    statuses, seen, connections = _run(_with_server([err], body, close_after={0, 1, 2}))
    assert statuses == [500, 500, 500]
    assert len(seen) == 3  # each request reached the server exactly once


def test_malformed_answer_and_refused_connection_are_client_errors():
    async def malformed(url):
        pool = ConnectionPool(url, max_connections=1, connect_timeout_seconds=2)
        with pytest.raises(HttpClientError, match="not valid HTTP"):
            async with pool.request(build_request("GET", url, {}, None)) as resp:
                await resp.read()

    _run(_with_server([b"SSH-2.0-OpenSSH_9.2\r\n\r\n"], malformed))

    async def refused():
        from testlib import free_port

        url = f"http://127.0.0.1:{free_port()}/"
        pool = ConnectionPool(url, max_connections=1, connect_timeout_seconds=2)
        with pytest.raises(ConnectError, match="cannot connect"):
            async with pool.request(build_request("GET", url, {}, None)):
                pass

    _run(refused())


def test_request_bytes_and_a_header_that_would_break_them():
    raw = build_request("POST", "https://example.com/v1/chat completions", {"Content-Type": "application/json"}, b"{}")
    assert raw.startswith(b"POST /v1/chat%20completions HTTP/1.1\r\nHost: example.com\r\n")
    assert raw.endswith(b"Content-Length: 2\r\n\r\n{}")
    spec = LoadSpec(Target("http://127.0.0.1:1/", headers={"X-Evil": "a\r\nInjected: 1"}), rate=1, duration_seconds=1)
    with pytest.raises(BadInputError, match="line break"):
        spec.validate()


def test_precise_loop_keeps_sub_millisecond_timers():
    """A stock asyncio loop wakes up to 1 ms late (epoll's whole milliseconds); the precise loop's
    lateness must be a fraction of that. Compared in the same run, not against a constant.

    A loaded machine adds its wake-up delay to both loops' timers alike, which would close a ratio of
    medians; so the precise loop is read at its 10th percentile (the timers the machine did not delay)
    and the stock loop at its median, its ~0.7 ms of rounding, which load lengthens far more often than it
    shortens (only a preemption between the sleep's start and its epoll call would)."""

    async def lateness():
        late = []
        for _ in range(100):
            due = time.perf_counter() + 0.0023
            await asyncio.sleep(due - time.perf_counter())
            late.append(time.perf_counter() - due)
        return sorted(late)

    precise = precise_loop.run(lateness())
    stock = asyncio.run(lateness())
    assert precise[0] >= 0
    assert precise[len(precise) // 10] < stock[len(stock) // 2] / 2, (precise[::10], stock[::10])


def test_https_verifies_the_certificate_unless_insecure(tmp_path):
    """A real TLS server with a self-signed certificate (made by the openssl program): refused by
    default with the reason, measured with verify_tls=False (`--insecure`)."""
    import ssl
    import subprocess

    from testlib import which_or_skip

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run([which_or_skip("openssl"), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    async def main():
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert, key)
        server = await asyncio.get_running_loop().create_server(
            lambda: _Scripted([ok], set(), [], []), "127.0.0.1", 0, ssl=ctx)
        url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
        raw = build_request("GET", url, {}, None)
        try:
            strict = ConnectionPool(url, max_connections=1, connect_timeout_seconds=5)
            with pytest.raises(ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                async with strict.request(raw):
                    pass
            insecure = ConnectionPool(url, max_connections=1, connect_timeout_seconds=5, verify_tls=False)
            async with insecure.request(raw) as resp:
                body = (resp.status, await resp.read())
            insecure.close()
            return body
        finally:
            server.close()

    assert _run(main()) == (200, b"ok")


def test_head_is_refused_with_a_reason():
    spec = LoadSpec(Target("http://127.0.0.1:1/", method="HEAD"), rate=1, duration_seconds=1)
    with pytest.raises(BadInputError, match="HEAD"):
        spec.validate()
