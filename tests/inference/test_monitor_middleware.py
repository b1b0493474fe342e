"""InferenceMonitor and the ASGI middleware in a real Starlette app: exact values on a FakeClock that
the handlers advance (the app called over ASGI in-process), and the same app served by uvicorn on
loopback, driven by gpulens's own load tester on the real clock."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from testlib import wait_until

from gpulens.bench.serve import LoadSpec, Target, run_load
from gpulens.clock import FakeClock
from gpulens.errors import MonitorUsageError
from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.workload.inference import InferenceMiddleware, InferenceMonitor


def _vals(store: Store, name: str, **labels) -> list[float]:
    return [v for s in store.query(name, labels or None) for v in s.value]


def test_monitor_records_each_request_exactly(store):
    t = [100.0]
    mon = InferenceMonitor(store, service="chat", model="m", host="h", clock=lambda: t[0], flush_interval_seconds=None)
    with mon.model_load(params=7):
        t[0] = 112.5
    h = mon.start_request()
    assert mon.in_flight == 1
    t[0] = 100.5 + 12.5
    h.started()
    for step in (1.0, 1.1, 1.2, 1.3):
        t[0] = 112.5 + step
        h.token()
    h.finish("ok", prompt_tokens=20, batch_size=3)
    with pytest.raises(MonitorUsageError):
        h.finish("ok")
    mon.flush()
    assert _vals(store, N.INFER_COLD_START_SECONDS) == [12.5]
    assert _vals(store, N.INFER_LATENCY_SECONDS) == pytest.approx([1.3])
    assert _vals(store, N.INFER_QUEUE_WAIT_SECONDS) == pytest.approx([0.5])
    assert _vals(store, N.INFER_TTFT_SECONDS) == pytest.approx([1.0])
    assert _vals(store, N.INFER_TPOT_SECONDS) == pytest.approx([0.1])
    assert _vals(store, N.INFER_ITL_SECONDS) == pytest.approx([0.1])
    assert _vals(store, N.INFER_OUTPUT_TOKENS) == [4] and _vals(store, N.INFER_BATCH_SIZE) == [3]
    assert _vals(store, N.INFER_IN_FLIGHT) == [1, 0]
    assert store.series(N.INFER_LATENCY_SECONDS)[0].labels == {"service": "chat", "model": "m", "host": "h"}
    ev = store.events(N.EV_REQUEST)[0]
    assert ev.data["first_token"] == pytest.approx(113.5) and ev.data["status"] == "ok"
    assert store.events(N.EV_COLD_START)[0].data == {"seconds": 12.5, "params": 7}
    # a failing block is an error, a timeout a timeout
    for exc, status in ((ValueError, "error"), (TimeoutError, "timeout")):
        with pytest.raises(exc), mon.request():
            raise exc()
        mon.flush()
        assert _vals(store, N.INFER_REQUESTS_TOTAL, status=status) == [1]
    mon.close()


GENERATE_S, FIRST_TOKEN_S, TOKEN_GAP_S = 0.02, 0.03, 0.01  # the handlers' work, on the real server


def _starlette_app(monitor: InferenceMonitor, pause=asyncio.sleep, scale: float = 1.0):
    """The test app; `pause(seconds)` is the handlers' work (a real sleep, or a FakeClock's advance),
    each of its durations × `scale`."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    async def generate(request):
        await pause(GENERATE_S * scale)
        request.state.gpulens.set(batch_size=4, output_tokens=7)
        return JSONResponse({"text": "done"})

    async def stream(request):
        async def tokens():
            await pause(FIRST_TOKEN_S * scale)
            for i in range(5):
                if i:
                    await pause(TOKEN_GAP_S * scale)
                yield f"data: {json.dumps({'choices': [{'text': f't{i}'}]})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(tokens(), media_type="text/event-stream")

    async def long_stream(request):  # a generation the client gives up on (a token every 20 ms for 20 s)
        async def tokens():
            for i in range(1000):
                yield f"data: {json.dumps({'choices': [{'text': f't{i}'}]})}\n\n"
                await asyncio.sleep(0.02)

        return StreamingResponse(tokens(), media_type="text/event-stream")

    async def fail(request):
        raise RuntimeError("model crashed")

    async def busy(request):
        return PlainTextResponse("busy", status_code=503)

    async def health(request):
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/v1/generate", generate), Route("/v1/completions", stream, methods=["POST"]),
                            Route("/v1/fail", fail), Route("/v1/long", long_stream), Route("/v1/busy", busy), Route("/health", health)])
    app.add_middleware(InferenceMiddleware, monitor=monitor, paths=("/v1/",))
    return app


async def _asgi_call(app, method: str, path: str) -> list[dict]:
    """One request straight into the ASGI app (no socket): the messages it sent back."""
    sent: list[dict] = []
    done = asyncio.Event()
    received = False

    async def receive():
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await done.wait()  # a streaming response listens for the client going away
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": [(b"host", b"test")],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80)}
    try:
        await app(scope, receive, send)
    finally:
        done.set()
    return sent


def test_middleware_times_each_request_exactly_on_the_monitors_clock(store):
    """The handlers' work advances a FakeClock (binary fractions, so every sum is exact)."""
    clock = FakeClock()
    monitor = InferenceMonitor(store, service="api", model="tiny", host="h", clock=clock, flush_interval_seconds=None)

    async def advance(seconds: float) -> None:
        clock.advance(seconds)

    scale = 12.5  # 20, 30, 10 ms -> 0.25, 0.375, 0.125 s
    app = _starlette_app(monitor, pause=advance, scale=scale)

    async def drive() -> None:
        for _ in range(3):
            assert (await _asgi_call(app, "GET", "/v1/generate"))[0]["status"] == 200
        for _ in range(2):
            await _asgi_call(app, "POST", "/v1/completions")
        with pytest.raises(RuntimeError, match="model crashed"):
            await _asgi_call(app, "GET", "/v1/fail")
        assert (await _asgi_call(app, "GET", "/v1/busy"))[0]["status"] == 503
        await _asgi_call(app, "GET", "/health")

    asyncio.run(drive())
    monitor.flush()
    first, gap = FIRST_TOKEN_S * scale, TOKEN_GAP_S * scale
    assert _vals(store, N.INFER_LATENCY_SECONDS) == [GENERATE_S * scale] * 3 + [first + 4 * gap] * 2
    assert _vals(store, N.INFER_TTFT_SECONDS) == [first] * 2  # streamed: each chunk is a token
    assert _vals(store, N.INFER_ITL_SECONDS) == [gap] * 2
    assert _vals(store, N.INFER_OUTPUT_TOKENS) == [7] * 3 + [5] * 2
    assert _vals(store, N.INFER_BATCH_SIZE) == [4] * 3
    totals = {s.key.labels["status"]: s.value[-1] for s in store.query(N.INFER_REQUESTS_TOTAL, {"service": "api"})}
    assert totals == {"ok": 5, "error": 1, "rejected": 1}  # /health is outside the measured paths
    ends = [e.data["end"] for e in store.events(N.EV_REQUEST, labels={"service": "api"})]
    assert ends[-1] == clock.time() and len(ends) == 7
    monitor.close()


@pytest.fixture
def served_app(store, port):
    import uvicorn

    monitor = InferenceMonitor(store, service="api", model="tiny", host="h", flush_interval_seconds=0.2)
    server = uvicorn.Server(uvicorn.Config(_starlette_app(monitor), host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), 60, "uvicorn to start")
    assert server.started, "uvicorn stopped before it started"
    yield f"http://127.0.0.1:{port}", monitor
    server.should_exit = True
    thread.join(timeout=5)
    monitor.close()


def test_middleware_in_a_real_starlette_app(served_app, store):
    base, monitor = served_app
    ok = run_load(LoadSpec(Target(f"{base}/v1/generate"), concurrency=2, duration_seconds=None, max_requests=20)).summary
    body = json.dumps({"prompt": "x", "stream": True}).encode()
    streamed = run_load(LoadSpec(Target(f"{base}/v1/completions", method="POST", body=body, kind="completions"),
                                 concurrency=1, duration_seconds=None, max_requests=5)).summary
    failed = run_load(LoadSpec(Target(f"{base}/v1/fail"), concurrency=1, duration_seconds=None, max_requests=3)).summary
    busy = run_load(LoadSpec(Target(f"{base}/v1/busy"), concurrency=1, duration_seconds=None, max_requests=2)).summary
    run_load(LoadSpec(Target(f"{base}/health"), concurrency=1, duration_seconds=None, max_requests=4))
    assert ok.requests.ok == 20 and streamed.requests.ok == 5
    assert failed.requests.error == 3 and busy.requests.rejected == 2
    monitor.flush()

    totals = {s.key.labels["status"]: s.value[-1] for s in store.query(N.INFER_REQUESTS_TOTAL, {"service": "api"})}
    assert totals == {"ok": 25, "error": 3, "rejected": 2}  # /health is outside the measured paths
    assert len(store.events(N.EV_REQUEST, labels={"service": "api"})) == 30
    # The exact values are the FakeClock test's; on the real clock a handler's work is a lower bound
    # (a loaded machine only adds time), and the client's TTFT agrees with the server's.
    lat = sorted(_vals(store, N.INFER_LATENCY_SECONDS))
    assert len(lat) == 25
    assert lat[len(lat) // 3] > GENERATE_S - 0.001  # the 20 ms handler, measured inside the server
    assert _vals(store, N.INFER_BATCH_SIZE).count(4) == 20
    ttft = _vals(store, N.INFER_TTFT_SECONDS)
    assert len(ttft) == 5 and all(v > FIRST_TOKEN_S - 0.002 for v in ttft)
    assert all(v > TOKEN_GAP_S - 0.001 for v in _vals(store, N.INFER_ITL_SECONDS))
    assert _vals(store, N.INFER_OUTPUT_TOKENS)[-5:] == [5] * 5
    # The client's clock starts before the server sees the request and stops after the token left it,
    # so its TTFT is never less (1 ms for the histogram's rounding); a loaded machine only adds to it,
    # hence the wider margin above.
    assert sorted(ttft)[2] - 0.001 <= streamed.ttft.p50 <= sorted(ttft)[2] + 0.1, (streamed.ttft.p50, sorted(ttft))
    assert _vals(store, N.INFER_IN_FLIGHT)[-1] == 0


def test_a_client_that_disconnects_mid_stream_is_aborted(served_app, store):
    """A client closes its connection after the first tokens of a long stream: the request ends
    aborted (not ok, not a server error), and the next request is unaffected."""
    import socket
    import urllib.request

    base, monitor = served_app
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET /v1/long HTTP/1.1\r\nHost: test\r\n\r\n")
        got = b""
        while b"data:" not in got:  # the headers and the first token reached the client
            got += sock.recv(4096)
    # the connection is closed: the server finds out at its next send (or its next receive)

    def totals() -> dict[str, float]:
        monitor.flush()
        # a series can be known before its first sample is committed (the monitor's writer is mid-flush)
        return {s.key.labels["status"]: s.value[-1] for s in store.query(N.INFER_REQUESTS_TOTAL, {"service": "api"}) if s.value}

    wait_until(lambda: totals().get("aborted") == 1, 60, "the abandoned stream to be recorded as aborted")
    with urllib.request.urlopen(f"{base}/v1/generate", timeout=10) as r:
        assert r.status == 200
    wait_until(lambda: totals() == {"aborted": 1, "ok": 1}, 60, "the next request to be recorded ok")
    assert _vals(store, N.INFER_IN_FLIGHT)[-1] == 0
    assert not _vals(store, N.INFER_LATENCY_SECONDS)[:-1]  # an aborted request is no latency sample
