"""ASGI middleware (FastAPI, Starlette, any ASGI app): one `InferenceMonitor` request per HTTP
request. Pure ASGI, so it needs neither framework installed and sees streamed bodies chunk by chunk.

    app.add_middleware(InferenceMiddleware, monitor=monitor)            # Starlette / FastAPI
    app = InferenceMiddleware(app, monitor=monitor, paths=("/v1/",))    # any ASGI app

Status: 2xx/3xx ok; 429 and 503 rejected (load shedding); 408 and 504 timeout; other 4xx/5xx and
exceptions error; aborted when the client went away before the response was whole (the server saw
`http.disconnect`, or sending to the closed connection failed), whatever the app did after that: a
user who gave up on a slow stream is not a server error, and not an ok either. For a streamed response (a body sent in several chunks) each non-empty chunk
counts as a token unless the handler counts tokens itself through `request_handle(scope)`
(Starlette: `request.state.gpulens`). Chunk times come from the monitor's clock (inject a
`FakeClock` there), so they line up with the request's arrival and end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from gpulens.workload.inference.monitor import InferenceMonitor, RequestHandle

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

STATE_KEY = "gpulens"


def status_of(code: int) -> str:
    if code in (429, 503):
        return "rejected"
    if code in (408, 504):
        return "timeout"
    return "error" if code >= 400 else "ok"


def request_handle(scope: Scope) -> RequestHandle | None:
    """The monitor's handle of the request being served (for token counts, batch size, queue exit)."""
    return scope.get("state", {}).get(STATE_KEY)


class InferenceMiddleware:
    def __init__(self, app: ASGIApp, monitor: InferenceMonitor, paths: tuple[str, ...] | None = None):
        self.app = app
        self.monitor = monitor
        self.paths = paths  # path prefixes to measure; None measures every HTTP request

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] != "http" or (self.paths and not str(scope.get("path", "")).startswith(self.paths)):
            await self.app(scope, receive, send)
            return
        h = self.monitor.start_request()
        scope.setdefault("state", {})[STATE_KEY] = h
        code = 500
        clock = self.monitor.clock.time
        chunks = 0
        first_chunk = last_chunk = None
        gaps = 0.0
        complete = disconnected = False  # the response's last body was sent; the client went away first

        async def receive_wrapper() -> Message:
            nonlocal disconnected
            message = await receive()
            if message["type"] == "http.disconnect" and not complete:
                disconnected = True
            return message

        async def send_wrapper(message: Message) -> None:
            nonlocal code, chunks, first_chunk, last_chunk, gaps, complete, disconnected
            kind = message["type"]
            if kind == "http.response.start":
                code = int(message["status"])  # not a queue exit: a buffered answer starts when it is done
            elif (kind == "http.response.body" and message.get("body") and (message.get("more_body") or chunks)
                  and message["body"].strip() != b"data: [DONE]"):  # OpenAI's end-of-stream marker is no token
                now = clock()  # a chunk of a streamed body: a token (or a few) reached the client
                if first_chunk is None:
                    first_chunk = now
                else:
                    gaps += now - last_chunk
                last_chunk = now
                chunks += 1
            try:
                await send(message)
            except OSError:  # the connection is gone (uvicorn's ClientDisconnected is an OSError)
                disconnected = True
                raise
            if kind == "http.response.body" and not message.get("more_body"):
                complete = True

        try:
            await self.app(scope, receive_wrapper, send_wrapper)
        except BaseException as e:
            if not h.finished:
                h.finish(_failed_status(e, disconnected and not complete))
            raise
        if chunks > 1 and h.first_token is None:  # the app did not count tokens itself
            h.first_token, h.last_token, h.tokens, h.itl_sum = first_chunk, last_chunk, chunks, gaps
        if not h.finished:
            h.finish("aborted" if disconnected and not complete else status_of(code))


def _failed_status(e: BaseException, client_gone: bool) -> str:
    """How a request the app raised out of ended: aborted when the client had gone (Starlette turns a
    failed send into ClientDisconnect; a server cancels the handler), else timeout or error."""
    if client_gone or isinstance(e, asyncio.CancelledError) or type(e).__name__ == "ClientDisconnect":
        return "aborted"
    return "timeout" if isinstance(e, TimeoutError) else "error"
