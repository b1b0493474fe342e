"""The HTTP(S) listener behind /metrics, /health and /ready: one that slow or numerous clients cannot
exhaust (issue 27).

http.server's ThreadingHTTPServer gave every connection a thread and waited for ever for its request
head, with a listen backlog of 5: 300 slowloris connections (a head trickled a byte at a time) held
300 threads, and at 200 requests/s the answers queued for 15 s. Here:
- one selector thread accepts connections and reads each request head (and a body, if any) without
  blocking, so a client that trickles bytes, or never finishes its TLS handshake, holds a socket and
  no thread; a head not complete `header_timeout_seconds` after the connection opened (or after its
  last answer) is closed, as is a body not complete `body_timeout_seconds` after its head;
- a complete request goes to a fixed pool of `workers` threads through a queue of `max_queued`; when
  the queue is full, or a request waited in it longer than `queue_wait_seconds`, it is answered 503
  with Retry-After at once: excess load is shed, never queued without bound, so the server answers
  normally within seconds of a burst ending;
- a head over `max_head_bytes` is answered 431, a body over `max_body_bytes` 413; past
  `max_connections` the oldest connection that is still waiting for its head is closed.
The thread count is therefore 1 + `workers`, whatever the clients do.
"""

from __future__ import annotations

import io
import logging
import queue
import re
import selectors
import socket
import ssl
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

log = logging.getLogger(__name__)

_HEAD_END = re.compile(rb"\r?\n\r?\n")
_CONTENT_LENGTH = re.compile(rb"(?im)^content-length[ \t]*:[ \t]*([^\r\n]*?)[ \t]*\r?$")
_TRANSFER_ENCODING = re.compile(rb"(?im)^transfer-encoding[ \t]*:")
_SWEEP_SLACK_SECONDS = 0.01  # past a deadline before its sweep (a select may wake a hair early)
_READ_BYTES = 64 * 1024


@dataclass(frozen=True)
class ConnectionLimits:
    """The listener's bounds (docs/metrics.md, "Connection limits")."""

    backlog: int = 1024  # pending connections the kernel keeps (capped by net.core.somaxconn)
    header_timeout_seconds: float = 10.0  # connect or last answer -> complete head (TLS handshake included)
    body_timeout_seconds: float = 10.0  # complete head -> complete body
    write_timeout_seconds: float = 10.0  # a blocked send of an answer
    max_head_bytes: int = 16 * 1024
    max_body_bytes: int = 64 * 1024
    max_connections: int = 1024  # open connections waiting for a request; beyond, the oldest is closed
    workers: int = 4  # threads that answer requests
    max_queued: int = 64  # complete requests waiting for a worker; beyond, 503
    queue_wait_seconds: float = 2.0  # a request that waited longer for a worker is answered 503
    retry_after_seconds: int = 1


class BufferedRequestHandler(BaseHTTPRequestHandler):
    """A BaseHTTPRequestHandler for one request already read whole by the listener: `request` is
    (socket, the request's bytes). Keep-alive is HTTP/1.1's: the listener takes the socket back."""

    protocol_version = "HTTP/1.1"
    # errors in one line of plain text, as the answers are, not http.server's HTML page
    error_message_format = "%(code)d %(message)s: %(explain)s\n"
    error_content_type = "text/plain; charset=utf-8"

    def _method_not_allowed(self) -> None:
        """405 with the methods this handler serves (http.server says 501, "not implemented", for
        any method without a do_ method, though these are methods it knows and refuses here)."""
        allowed = sorted(m.removeprefix("do_") for m in dir(self)
                         if m.startswith("do_") and getattr(type(self), m) is not getattr(BufferedRequestHandler, m, None))
        body = f"405 Method Not Allowed: this address answers {', '.join(allowed)}.\n".encode()
        self.send_response(405)
        self.send_header("Allow", ", ".join(allowed))
        self.send_header("Content-Type", self.error_content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _method_not_allowed  # noqa: N815 (http.server's names)

    def setup(self) -> None:
        self.connection, data = self.request
        self.rfile = io.BytesIO(data)
        self.wfile = self.connection.makefile("wb")

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()

    def finish(self) -> None:
        try:
            self.wfile.flush()
        except OSError:
            self.close_connection = True
        for f in (self.wfile, self.rfile):
            try:
                f.close()
            except OSError:
                self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
        pass  # a scrape every few seconds is not news


class _Conn:
    __slots__ = ("sock", "addr", "buf", "phase", "need", "deadline", "events")

    def __init__(self, sock: socket.socket, addr: object, phase: str, deadline: float):
        self.sock, self.addr, self.phase, self.deadline = sock, addr, phase, deadline
        self.buf = bytearray()
        self.need = 0
        self.events = selectors.EVENT_READ


class BoundedHttpServer:
    """Serves `handler` (a BufferedRequestHandler) on host:port within `limits`; IPv4 or IPv6 by
    the host's spelling ('::' takes IPv4 too); TLS when `tls` is given. `serve_forever()` runs the
    selector loop (and starts the workers); `shutdown()` stops both; `server_close()` closes sockets.
    `refused` counts connections closed or answered early, by cause."""

    def __init__(self, host: str, port: int, handler: type[BufferedRequestHandler], tls: ssl.SSLContext | None = None,
                 limits: ConnectionLimits | None = None):
        self.handler = handler
        self.tls = tls
        self.limits = limits or ConnectionLimits()
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(self.address_family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.address_family == socket.AF_INET6 and host == "::":
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            self.socket.bind((host, port))
            self.socket.listen(self.limits.backlog)
        except OSError:
            self.socket.close()
            raise
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()
        self.refused: Counter[str] = Counter()
        self._conns: dict[socket.socket, _Conn] = {}  # waiting for a request, oldest first
        self._queue: queue.Queue[tuple[_Conn, bytes, float] | None] = queue.Queue(self.limits.max_queued)
        self._returned: list[_Conn] = []  # keep-alive connections handed back by the workers
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._workers: list[threading.Thread] = []

    # ------------------------------------------------------------------ the selector loop
    def serve_forever(self) -> None:
        self._workers = [threading.Thread(target=self._work, name=f"gpulens-metrics-worker-{i}", daemon=True)
                         for i in range(self.limits.workers)]
        for t in self._workers:
            t.start()
        sel = self._sel = selectors.DefaultSelector()
        sel.register(self.socket, selectors.EVENT_READ, "listen")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self._stop.is_set():
                # Sleep until the earliest deadline of an open connection, and without a timeout when
                # none is open: an unscraped agent's listener does not wake at all.
                first = min((c.deadline for c in self._conns.values()), default=None)
                timeout = None if first is None else max(first - time.monotonic(), 0.0) + _SWEEP_SLACK_SECONDS
                for key, _mask in sel.select(timeout):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        self._adopt_returned()
                    else:
                        self._on_ready(key.data)
                if first is not None:
                    now = time.monotonic()
                    if now >= first:
                        self._sweep(now)
        finally:
            for c in list(self._conns.values()):
                self._close(c)
            sel.close()
            for _ in self._workers:
                self._queue.put(None)
            self._stopped.set()

    def _accept(self) -> None:
        for _ in range(64):  # a burst at a time, so the other sockets get their turn
            try:
                sock, addr = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of file descriptors: the oldest waiting connection makes room
                self._count("accept failed", f"accepting a connection failed ({e.strerror or e})")
                self._close_oldest()
                return
            sock.setblocking(False)
            phase = "head"
            if self.tls is not None:
                try:
                    sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except (OSError, ssl.SSLError):
                    sock.close()
                    continue
                phase = "handshake"
            c = _Conn(sock, addr, phase, time.monotonic() + self.limits.header_timeout_seconds)
            self._conns[sock] = c
            self._sel.register(sock, selectors.EVENT_READ, c)
            if len(self._conns) > self.limits.max_connections:
                self._count("too many connections", f"more than {self.limits.max_connections} connections are open: "
                            "the oldest one waiting for its request is closed")
                self._close_oldest()
            if phase == "head" or self._handshake(c):
                self._read(c)

    def _adopt_returned(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        with self._lock:
            back, self._returned = self._returned, []
        for c in back:
            self._conns[c.sock] = c
            c.events = selectors.EVENT_READ
            try:
                self._sel.register(c.sock, c.events, c)
            except (ValueError, OSError):
                self._close(c)
                continue
            if c.buf:  # a pipelined request arrived with the last one
                self._process(c)

    def _on_ready(self, c: _Conn) -> None:
        if c.phase == "handshake" and not self._handshake(c):
            return
        self._read(c)

    def _handshake(self, c: _Conn) -> bool:
        try:
            c.sock.do_handshake()  # type: ignore[attr-defined]
        except ssl.SSLWantReadError:
            self._want(c, selectors.EVENT_READ)
            return False
        except ssl.SSLWantWriteError:
            self._want(c, selectors.EVENT_WRITE)
            return False
        except (OSError, ssl.SSLError, ValueError):  # a plain-HTTP client, a bad client certificate
            self._close(c)
            return False
        c.phase = "head"
        self._want(c, selectors.EVENT_READ)
        return True

    def _want(self, c: _Conn, events: int) -> None:
        if c.events != events and c.sock in self._conns:
            c.events = events
            self._sel.modify(c.sock, events, c)

    def _read(self, c: _Conn) -> None:
        while True:
            try:
                data = c.sock.recv(_READ_BYTES)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except (OSError, ssl.SSLError):
                self._close(c)
                return
            if not data:
                self._close(c)
                return
            c.buf += data
            if len(c.buf) > self.limits.max_head_bytes + self.limits.max_body_bytes:
                break  # enough to decide; _process refuses what is too large
            if not (isinstance(c.sock, ssl.SSLSocket) and c.sock.pending()):
                break  # a plain socket: the selector says when there is more
        self._process(c)

    def _process(self, c: _Conn) -> None:
        lim = self.limits
        if c.phase == "head":
            m = _HEAD_END.search(c.buf, 0, lim.max_head_bytes + 4)
            if m is None:
                if len(c.buf) > lim.max_head_bytes:
                    self._refuse(c, 431, "Request Header Fields Too Large", "head too large",
                                 f"the request head is larger than {lim.max_head_bytes} bytes")
                return
            head = bytes(c.buf[: m.end()])
            if _TRANSFER_ENCODING.search(head):
                self._refuse(c, 411, "Length Required", "chunked body", "send a request body with Content-Length")
                return
            lengths = _CONTENT_LENGTH.findall(head)
            if len(set(lengths)) > 1 or (lengths and not lengths[0].isdigit()):
                self._refuse(c, 400, "Bad Request", "bad content-length", "the Content-Length header cannot be read")
                return
            body = int(lengths[0]) if lengths else 0
            if body > lim.max_body_bytes:
                self._refuse(c, 413, "Content Too Large", "body too large",
                             f"the request body is larger than {lim.max_body_bytes} bytes")
                return
            c.phase, c.need = "body", m.end() + body
            c.deadline = time.monotonic() + lim.body_timeout_seconds
        if c.phase == "body" and len(c.buf) >= c.need:
            self._dispatch(c)

    def _dispatch(self, c: _Conn) -> None:
        self._detach(c)
        request = bytes(c.buf[: c.need])
        del c.buf[: c.need]
        try:
            self._queue.put_nowait((c, request, time.monotonic()))
        except queue.Full:
            self._shed(c, "busy", f"{self.limits.max_queued} requests are already waiting")

    def _sweep(self, now: float) -> None:
        expired = [c for c in self._conns.values() if c.deadline <= now]
        for c in expired:
            cause = "body timeout" if c.phase == "body" else "header timeout"
            self._count(cause, f"a connection sent no complete request {cause.split()[0]} in time: closed")
            self._close(c)

    def _close_oldest(self) -> None:
        if self._conns:
            self._close(next(iter(self._conns.values())))

    # ------------------------------------------------------------------ answers outside the workers
    def _refuse(self, c: _Conn, status: int, reason: str, cause: str, why: str) -> None:
        self._count(cause, f"a request was refused with {status}: {why}")
        self._detach(c)
        self._raw_answer(c, status, reason, f"{why}.\n")

    def _shed(self, c: _Conn, cause: str, why: str) -> None:
        self._count(cause, f"the server is busy ({why}): answering 503 with Retry-After")
        self._raw_answer(c, 503, "Service Unavailable", "gpulens is busy: retry in a moment.\n",
                         {"Retry-After": str(self.limits.retry_after_seconds)})

    def _raw_answer(self, c: _Conn, status: int, reason: str, text: str, headers: dict[str, str] | None = None) -> None:
        """A short answer sent without blocking (best effort: a client that does not read loses it), then close."""
        body = text.encode()
        lines = [f"HTTP/1.1 {status} {reason}", "Content-Type: text/plain; charset=utf-8", f"Content-Length: {len(body)}",
                 "Connection: close", *(f"{k}: {v}" for k, v in (headers or {}).items())]
        try:
            c.sock.setblocking(False)
            c.sock.send(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        except (OSError, ssl.SSLError, ValueError):
            pass
        self._close(c)

    def _count(self, cause: str, message: str) -> None:
        with self._lock:
            self.refused[cause] += 1
            first = self.refused[cause] == 1
        if first:  # one line per cause; the counts are in `refused`
            log.warning("%s (logged once; counted after)", message)

    # ------------------------------------------------------------------ connections
    def _detach(self, c: _Conn) -> None:
        if self._conns.pop(c.sock, None) is not None:
            try:
                self._sel.unregister(c.sock)
            except (KeyError, ValueError, OSError):
                pass

    def _close(self, c: _Conn) -> None:
        self._detach(c)
        try:
            c.sock.close()
        except OSError:
            pass

    # ------------------------------------------------------------------ workers
    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            c, request, queued_at = item
            if time.monotonic() - queued_at > self.limits.queue_wait_seconds:
                self._shed(c, "waited too long", f"a request waited more than {self.limits.queue_wait_seconds:g} s")
                continue
            keep = False
            try:
                c.sock.settimeout(self.limits.write_timeout_seconds)
                h = self.handler((c.sock, request), c.addr, self)  # type: ignore[arg-type]
                keep = not h.close_connection
            except (OSError, ssl.SSLError, ValueError):
                pass
            except Exception:  # a handler bug must not take a worker away
                log.exception("answering a request failed")
            if keep and not self._stop.is_set():
                self._hand_back(c)
            else:
                self._close(c)

    def _hand_back(self, c: _Conn) -> None:
        try:
            c.sock.setblocking(False)
        except OSError:
            self._close(c)
            return
        c.phase, c.need = "head", 0
        c.deadline = time.monotonic() + self.limits.header_timeout_seconds
        with self._lock:
            self._returned.append(c)
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):
            pass  # a wake-up is already pending

    # ------------------------------------------------------------------ socketserver's names
    def shutdown(self) -> None:
        """Stop the loop and the workers (blocks until the loop has ended, when it runs)."""
        self._stop.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._workers:
            self._stopped.wait(10)
            for t in self._workers:
                t.join(self.limits.write_timeout_seconds + 1)

    def server_close(self) -> None:
        for s in (self.socket, self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass
        with self._lock:
            back, self._returned = self._returned, []
        for c in back:
            self._close(c)
