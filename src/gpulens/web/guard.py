"""The dashboard's connection limits: what keeps idle or slow clients from exhausting it.

uvicorn holds a new connection that never sends a request for ever, and times out idle ones only
after a first answer: ~1,000 half-open connections used to exhaust the file descriptors, before
any token was checked. `GuardedH11Protocol` closes a connection whose request headers are not
complete `HEADER_TIMEOUT_SECONDS` after it opened (or after its last answer), and past
`MAX_CONNECTIONS` closes the oldest idle connection to make room, so a real client always gets in.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_SECONDS = 10.0  # from connect (or the last answer) to a complete request head
KEEP_ALIVE_SECONDS = 5.0  # idle keep-alive after an answer (uvicorn's timeout_keep_alive)
MAX_CONNECTIONS = 512  # open connections; beyond, the oldest idle one is closed
MAX_HEADER_BYTES = 16 * 1024  # a request head larger than this is refused (h11_max_incomplete_event_size)


class GuardedH11Protocol(H11Protocol):
    header_timeout_seconds = HEADER_TIMEOUT_SECONDS
    max_connections = MAX_CONNECTIONS

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._opened_at = self.loop.time()
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm_header_timer()
        if len(self.connections) > self.max_connections:
            self._close_oldest_idle()

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


def uvicorn_config(app: Any, **kw: Any) -> Any:
    """The dashboard's uvicorn configuration: the guarded protocol and its limits."""
    import uvicorn

    return uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="on", http=GuardedH11Protocol,
        timeout_keep_alive=int(KEEP_ALIVE_SECONDS), h11_max_incomplete_event_size=MAX_HEADER_BYTES, **kw,
    )
