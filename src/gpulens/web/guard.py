"""The dashboard's connection limits: what keeps idle or slow clients from exhausting it.

uvicorn holds a new connection that never sends a request for ever, and times out idle ones only
after a first answer: ~1,000 half-open connections used to exhaust the file descriptors, before
any token was checked. `GuardedH11Protocol` closes a connection whose request headers are not
complete `HEADER_TIMEOUT_SECONDS` after it opened (or after its last answer), and past
`MAX_CONNECTIONS` closes the oldest idle connection to make room, so a real client always gets in.
A request head larger than `MAX_HEADER_BYTES` is answered 431, also when it arrives in one packet
(h11's own limit only applies to a head still incomplete).

Overload (issue 27): `/api/series` at 200 requests/s used to queue every request for the thread pool
without bound, answering 0 of 6,000 and still timing out 20 s after the load stopped.
`ConcurrencyLimit` lets `MAX_ACTIVE_REQUESTS` run at once and `MAX_WAITING_REQUESTS` wait, each at
most `QUEUE_WAIT_SECONDS`; the rest is answered 503 with Retry-After at once, so the queue, the
latency of what is served and the time to recover after a burst all stay bounded.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

HEADER_TIMEOUT_SECONDS = 10.0  # from connect (or the last answer) to a complete request head
KEEP_ALIVE_SECONDS = 5.0  # idle keep-alive after an answer (uvicorn's timeout_keep_alive)
MAX_CONNECTIONS = 512  # open connections; beyond, the oldest idle one is closed
MAX_HEADER_BYTES = 16 * 1024  # a request head larger than this is refused with 431
LISTEN_BACKLOG = 1024  # pending connections the kernel keeps (capped by net.core.somaxconn)
MAX_ACTIVE_REQUESTS = 8  # requests answered at once (the rest wait; each holds a thread-pool thread)
MAX_WAITING_REQUESTS = 64  # requests waiting for one of those; beyond, 503
QUEUE_WAIT_SECONDS = 1.0  # a request that waited longer is answered 503 (bounds the latency under overload)
RETRY_AFTER_SECONDS = 1


class GuardedH11Protocol(H11Protocol):
    header_timeout_seconds = HEADER_TIMEOUT_SECONDS
    max_connections = MAX_CONNECTIONS
    max_header_bytes = MAX_HEADER_BYTES

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._opened_at = self.loop.time()
        self._head_bytes = 0  # of the request head being received
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm_header_timer()
        if len(self.connections) > self.max_connections:
            self._close_oldest_idle()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:  # between requests: these bytes are (part of) a head
            end = data.find(b"\r\n\r\n")
            self._head_bytes += end if end >= 0 else len(data)
            if self._head_bytes > self.max_header_bytes:
                self._refuse_head()
                return
            if end >= 0:
                self._head_bytes = 0
        super().data_received(data)

    def _refuse_head(self) -> None:
        body = f"The request head is larger than {self.max_header_bytes} bytes.\n".encode()
        self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\n"
                             b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        self.transport.close()

    def _idle(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = self.loop.call_later(self.header_timeout_seconds, self._header_expired, self.cycle)

    def _header_expired(self, cycle_then: Any) -> None:
        # No new request began since the timer was armed (the same cycle, finished or none): close.
        if self.cycle is cycle_then and self._idle() and not self.transport.is_closing():
            self.transport.close()

    def _close_oldest_idle(self) -> None:
        idle = [c for c in self.connections if c is not self and isinstance(c, GuardedH11Protocol) and c._idle()
                and not c.transport.is_closing()]
        for c in sorted(idle, key=lambda c: c._opened_at)[: len(self.connections) - self.max_connections]:
            c.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if getattr(self, "_header_timer", None) is not None:
            self._header_timer.cancel()  # type: ignore[union-attr]
        super().connection_lost(exc)


class ConcurrencyLimit:
    """Pure ASGI middleware: at most `max_active` requests at once; up to `max_waiting` more wait, each
    at most `queue_wait_seconds`; any other is answered 503 with Retry-After at once. `stats` counts
    the requests shed, by cause (one log line per cause)."""

    max_active = MAX_ACTIVE_REQUESTS
    max_waiting = MAX_WAITING_REQUESTS
    queue_wait_seconds = QUEUE_WAIT_SECONDS

    def __init__(self, app: Any, stats: Counter[str] | None = None):
        self.app = app
        self.stats: Counter[str] = stats if stats is not None else Counter()
        self._slots: asyncio.Semaphore | None = None  # made in the server's event loop, on first use
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        slots = self._slots_of_this_loop()
        cause = await self._acquire(slots)
        if cause is not None:
            await self._shed(cause, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            slots.release()

    def _slots_of_this_loop(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._loop is not loop:  # an app served again in another loop (test clients)
            self._slots, self._loop = asyncio.Semaphore(self.max_active), loop
        return self._slots

    async def _acquire(self, slots: asyncio.Semaphore) -> str | None:
        """None once a slot is held; otherwise why the request is shed."""
        if not slots.locked():
            await slots.acquire()
            return None
        if self._waiting >= self.max_waiting:
            return "busy"
        self._waiting += 1
        try:
            await asyncio.wait_for(slots.acquire(), self.queue_wait_seconds)
            return None
        except TimeoutError:
            return "waited too long"
        finally:
            self._waiting -= 1

    async def _shed(self, cause: str, send: Any) -> None:
        self.stats[cause] += 1
        if self.stats[cause] == 1:
            log.warning("the dashboard is busy (%s): answering 503 with Retry-After (logged once; counted after)",
                        "more requests are waiting than it queues" if cause == "busy"
                        else f"a request waited more than {self.queue_wait_seconds:g} s")
        body = b'{"error":"The dashboard is busy.","hint":"Retry in a moment."}'
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(RETRY_AFTER_SECONDS).encode()), (b"cache-control", b"no-store"),
            (b"x-content-type-options", b"nosniff")]})
        await send({"type": "http.response.body", "body": body})


def uvicorn_config(app: Any, **kw: Any) -> Any:
    """The dashboard's uvicorn configuration: the guarded protocol and its limits."""
    import uvicorn

    return uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="on", http=GuardedH11Protocol,
        timeout_keep_alive=int(KEEP_ALIVE_SECONDS), h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        backlog=LISTEN_BACKLOG, **kw,
    )
