"""A tiny aiohttp server on its own thread and event loop: GET /slow?s=SECONDS answers "ok" after that long."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web


async def _slow(request: web.Request) -> web.Response:
    await asyncio.sleep(float(request.query.get("s", "0")))
    return web.Response(text="ok")


@contextmanager
def slow_server() -> Iterator[str]:
    """Yields the server's base URL (http://127.0.0.1:PORT); stops it on exit."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    state: dict[str, object] = {}

    async def start() -> None:
        app = web.Application()
        app.router.add_get("/slow", _slow)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        state["runner"] = runner
        state["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if not ready.wait(60):  # at once, normally; a loaded machine may take seconds to run the thread
        raise RuntimeError("the test server did not start")
    try:
        yield f"http://127.0.0.1:{state['port']}"
    finally:
        asyncio.run_coroutine_threadsafe(state["runner"].cleanup(), loop).result(30)  # type: ignore[union-attr]
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
