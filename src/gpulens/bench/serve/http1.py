"""A lean HTTP/1.1 client for the load tester: keep-alive connections on asyncio protocols,
responses parsed by httptools (llhttp, Node.js's parser, in C), each run's request bytes built
once.

Why not aiohttp here: the client's own work is part of every latency it reports. On a 2-core VM
aiohttp's per-request path added ~0.4 ms to a loopback round trip (0.6 ms against 0.2 ms for a bare
protocol) and held one process near locust's rate. What this leaves out is what a load tester does
not need: redirects, cookies, proxies, decompression, responses to HEAD.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from urllib.parse import quote, urlsplit

import httptools

from gpulens.http_client import split_credentials

_DEFAULT_PORTS = {"http": 80, "https": 443}


class HttpClientError(Exception):
    """The exchange failed below HTTP: no connection, a reset, a malformed answer. `str()` says how."""


class ConnectError(HttpClientError):
    """No connection could be opened."""


def build_request(method: str, url: str, headers: Mapping[str, str], body: bytes | None) -> bytes:
    """The bytes of one request. Every request of a run is the same, so this runs once per run."""
    parts = urlsplit(url)
    target = quote((parts.path or "/") + (f"?{parts.query}" if parts.query else ""), safe="!#$%&'()*+,/:;=?@[]~")
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port and parts.port != _DEFAULT_PORTS.get(parts.scheme):
        host = f"{host}:{parts.port}"
    names = {k.lower() for k in headers}
    if "@" in parts.netloc and "authorization" not in names:
        # credentials in the URL (http://user:pw@host/) are sent as http_client sends them
        headers = {**headers, "Authorization": split_credentials(url)[1] or ""}
        names.add("authorization")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    for name, value in headers.items():
        if any(c in f"{name}{value}" for c in "\r\n"):
            raise ValueError(f"header {name!r} contains a line break")
        lines.append(f"{name}: {value}")
    if "accept" not in names:
        lines.append("Accept: */*")
    if "user-agent" not in names:
        lines.append("User-Agent: gpulens-bench")
    if body is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body or b'')}")
    return "\r\n".join(lines).encode() + b"\r\n\r\n" + (body or b"")


class Response:
    """One response, filled by the connection's parser callbacks as bytes arrive."""

    __slots__ = ("status", "reason", "answered", "headers_done", "complete", "keep_alive", "error",
                 "read_until_close", "_chunks", "_waiter")

    def __init__(self) -> None:
        self.status = 0
        self.answered = False  # any byte of the answer arrived
        self.reason = ""
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.error: HttpClientError | None = None
        self.read_until_close = True  # until a Content-Length or chunked encoding says otherwise
        self._chunks: list[bytes] = []
        self._waiter: asyncio.Future[None] | None = None

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _wait(self) -> None:
        if self.error is not None:
            raise self.error
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def _wait_headers(self) -> None:
        while not self.headers_done:
            await self._wait()

    async def read(self, max_bytes: int | None = None) -> bytes:
        """The body (or its first `max_bytes`, without waiting for the rest)."""
        while not self.complete and (max_bytes is None or sum(map(len, self._chunks)) < max_bytes):
            await self._wait()
        data = b"".join(self._chunks)
        self._chunks.clear()
        return data if max_bytes is None else data[:max_bytes]

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (chunked encoding already undone)."""
        while True:
            if self._chunks:
                chunks, self._chunks = self._chunks, []
                for c in chunks:
                    yield c
            elif self.complete:
                return
            else:
                await self._wait()

    async def iter_lines(self) -> AsyncIterator[bytes]:
        """Body lines as they arrive, without their line ends: what server-sent events need."""
        rest = b""
        async for chunk in self.iter_chunks():
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            for line in lines:
                yield line.rstrip(b"\r")
        if rest:
            yield rest


class _Connection(asyncio.Protocol):
    """One keep-alive connection; `response` is the exchange in progress, if any."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.response: Response | None = None

    def send(self, raw: bytes) -> Response:
        self.response = r = Response()
        self.transport.write(raw)  # type: ignore[union-attr]
        return r

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.closed = True

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.response is not None:
            self.response.answered = True
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as e:
            self._fail(f"the server's answer is not valid HTTP/1.1 ({e})")
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        r = self.response
        if r is not None and not r.complete:
            if r.headers_done and r.read_until_close and exc is None:
                r.complete = True  # a body without a length ends when the connection does
                r._wake()
            else:
                why = os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else "closed"
                self._fail(f"the server closed the connection before the answer ended ({why.lower()})")

    def _fail(self, message: str) -> None:
        r = self.response
        if r is not None and not r.complete and r.error is None:
            r.error = HttpClientError(message)
            r._wake()

    # httptools callbacks
    def on_status(self, status: bytes) -> None:
        if self.response is not None:
            self.response.reason += status.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.response is not None and name.lower() in (b"content-length", b"transfer-encoding"):
            self.response.read_until_close = False

    def on_headers_complete(self) -> None:
        r = self.response
        if r is not None:
            r.status = self.parser.get_status_code()
            r.headers_done = True
            r._wake()

    def on_body(self, body: bytes) -> None:
        r = self.response
        if r is not None:
            r._chunks.append(body)
            r._wake()

    def on_message_complete(self) -> None:
        r = self.response
        if r is not None:
            r.complete = True
            r.keep_alive = self.parser.should_keep_alive()
            r._wake()


class ConnectionPool:
    """Keep-alive connections to one origin, at most `max_connections` in use at once."""

    def __init__(self, url: str, *, max_connections: int, connect_timeout_seconds: float, verify_tls: bool = True):
        parts = urlsplit(url)
        self.host = parts.hostname or ""
        self.port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        if self.ssl is not None and not verify_tls:
            self.ssl.check_hostname = False
            self.ssl.verify_mode = ssl.CERT_NONE
        self.connect_timeout = connect_timeout_seconds
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Connection] = []

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _t, conn = await asyncio.wait_for(
                loop.create_connection(_Connection, self.host, self.port, ssl=self.ssl), self.connect_timeout)
        except TimeoutError:
            raise ConnectError(f"cannot connect: no answer within {self.connect_timeout:g} s") from None
        except OSError as e:
            raise ConnectError(f"cannot connect: {e.strerror or e}") from None
        return conn

    @asynccontextmanager
    async def request(self, raw: bytes) -> AsyncIterator[Response]:
        """Send `raw` on a free connection; the response is ready to read once its headers are in."""
        await self._slots.acquire()
        conn: _Connection | None = None
        resp: Response | None = None
        try:
            while self._idle and conn is None:
                c = self._idle.pop()
                conn = None if c.closed else c
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
            resp = conn.send(raw)
            try:
                await resp._wait_headers()
            except HttpClientError:
                # A kept-alive connection the server closed as we sent (after an error answer, or
                # at its idle timeout) has most likely not read the request: send it once more on
                # a new one, as browsers, Go's net/http and urllib3 do. The latency includes it.
                if not reused or resp.answered:
                    raise
                conn.close()
                conn = await self._connect()
                resp = conn.send(raw)
                await resp._wait_headers()
            yield resp
        finally:
            if conn is not None:
                if resp is not None and resp.complete and resp.keep_alive and not conn.closed:
                    conn.response = None
                    self._idle.append(conn)
                else:  # unread, failed or cancelled: the connection's state is unknown
                    conn.close()
            self._slots.release()

    def close(self) -> None:
        for c in self._idle:
            c.close()
        self._idle.clear()
