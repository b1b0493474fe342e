"""Local test servers with known behaviour, run in their own process (so the load tester's event
loop and the server's do not share a CPU thread). State that must be fresh per test (a stall's
start, a queue) is keyed by a path segment.

    python inference_test_servers.py PORT aiohttp    streaming completions, errors, rejections, a hanging route
    python inference_test_servers.py PORT threaded   /fixed and /capacity timed with time.sleep in a thread per
                                      connection: one wake-up per request, so "10 ms" is 10.2 ms,
                                      where an asyncio sleep adds up to a millisecond
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from aiohttp import web

from gpulens.bench.serve.timer import PreciseTimer

_stall_origin: dict[str, float] = {}
_next_free: dict[str, float] = {}
_timer: list[PreciseTimer] = []


async def _sleep_until(t: float) -> None:
    """Precise to ~0.1 ms (asyncio.sleep alone rounds up to whole milliseconds), so "10 ms per
    request" means 10 ms."""
    if t - time.perf_counter() > 0:
        await _timer[0].sleep_until(t)


async def completions(request: web.Request) -> web.StreamResponse:
    """OpenAI-compatible streaming: the first token after `ttft_ms`, then one every `itl_ms`."""
    body = await request.json()
    chat = request.path.endswith("/chat/completions")
    n = int(body.get("max_tokens", 16))
    ttft = float(request.query.get("ttft_ms", "50")) / 1000
    itl = float(request.query.get("itl_ms", "20")) / 1000
    t0 = time.perf_counter()
    if not body.get("stream"):
        await _sleep_until(t0 + ttft + itl * (n - 1))
        return web.json_response({"choices": [{"text": "x" * n}], "usage": {"completion_tokens": n}})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if chat:  # the first chat chunk carries only the role, as OpenAI's and vLLM's do
        await resp.write(b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n')
    for i in range(n):
        await _sleep_until(t0 + ttft + itl * i)  # absolute times: no drift from sleep jitter
        chunk = {"choices": [{"delta": {"content": f"t{i} "}}]} if chat else {"choices": [{"text": f"t{i} "}]}
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    await resp.write(b'data: {"choices":[],"usage":{"completion_tokens":%d}}\n\n' % n)
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def error(request: web.Request) -> web.Response:
    return web.Response(status=500, text="model crashed")


async def reject(request: web.Request) -> web.Response:
    return web.Response(status=429, text="too many requests")


async def hang(request: web.Request) -> web.Response:
    await asyncio.sleep(3600)
    return web.Response(text="late")


async def trivial(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _start_timer(app: web.Application) -> None:
    _timer.append(PreciseTimer(asyncio.get_running_loop()).__enter__())


def make_app() -> web.Application:
    app = web.Application()
    app.on_startup.append(_start_timer)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_get("/error", error)
    app.router.add_post("/error", error)
    app.router.add_get("/reject", reject)
    app.router.add_get("/hang", hang)
    app.router.add_get("/", trivial)
    return app


class _Timed(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else Nagle + delayed ACK add 40 ms to every answer
    lock = threading.Lock()

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        now = time.perf_counter()
        url = urlsplit(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        parts = url.path.strip("/").split("/")
        ms = float(q.get("ms", "10")) / 1000
        with self.lock:
            if parts[0] == "capacity":  # one at a time on a virtual clock: capacity is exactly 1/ms
                done = max(now, _next_free.get(url.path, 0.0)) + ms
                _next_free[url.path] = done
            else:
                done = now + ms if parts[0] == "fixed" else now
                if "dur" in q:
                    s0 = _stall_origin.setdefault(url.path, now) + float(q.get("at", "1"))
                    s1 = s0 + float(q["dur"])
                    if s0 <= done < s1 or s0 <= now < s1:
                        done = max(done, s1)
        delay = done - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


class _TimedServer(ThreadingHTTPServer):
    request_queue_size = 1024
    daemon_threads = True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(script: Path, *args: str, timeout: float = 15.0) -> tuple[subprocess.Popen, int]:
    """Start `script PORT *args` and wait until the port answers. Used by the tests and benchmarks."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(script), str(port), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"test server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("test server did not start")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


if __name__ == "__main__":
    port = int(sys.argv[1])
    if len(sys.argv) > 2 and sys.argv[2] == "threaded":
        _TimedServer(("127.0.0.1", port), _Timed).serve_forever()
    else:
        web.run_app(make_app(), host="127.0.0.1", port=port, access_log=None, print=None, shutdown_timeout=0.5)
