"""InferenceMonitor (exact values with an injected clock) and the ASGI middleware in a real
Starlette app served by uvicorn on loopback, driven by gpulens's own load tester."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from gpulens.bench.serve import LoadSpec, Target, run_load
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


def _starlette_app(monitor: InferenceMonitor):
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    async def generate(request):
        await asyncio.sleep(0.02)
        request.state.gpulens.set(batch_size=4, output_tokens=7)
        return JSONResponse({"text": "done"})

    async def stream(request):
        async def tokens():
            await asyncio.sleep(0.03)
            for i in range(5):
                if i:
                    await asyncio.sleep(0.01)
                yield f"data: {json.dumps({'choices': [{'text': f't{i}'}]})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(tokens(), media_type="text/event-stream")

    async def fail(request):
        raise RuntimeError("model crashed")

    async def busy(request):
        return PlainTextResponse("busy", status_code=503)

    async def health(request):
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/v1/generate", generate), Route("/v1/completions", stream, methods=["POST"]),
                            Route("/v1/fail", fail), Route("/v1/busy", busy), Route("/health", health)])
    app.add_middleware(InferenceMiddleware, monitor=monitor, paths=("/v1/",))
    return app


@pytest.fixture
def served_app(store, port):
    import uvicorn

    monitor = InferenceMonitor(store, service="api", model="tiny", host="h", flush_interval_seconds=0.2)
    server = uvicorn.Server(uvicorn.Config(_starlette_app(monitor), host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
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
    assert ok.requests["ok"] == 20 and streamed.requests["ok"] == 5
    assert failed.requests["error"] == 3 and busy.requests["rejected"] == 2
    monitor.flush()

    totals = {s.key.labels["status"]: s.value[-1] for s in store.query(N.INFER_REQUESTS_TOTAL, {"service": "api"})}
    assert totals == {"ok": 25, "error": 3, "rejected": 2}  # /health is outside the measured paths
    assert len(store.events(N.EV_REQUEST, labels={"service": "api"})) == 30
    lat = sorted(_vals(store, N.INFER_LATENCY_SECONDS))
    assert len(lat) == 25
    assert 0.019 < lat[len(lat) // 3] < 0.05  # the 20 ms handler, measured inside the server
    assert _vals(store, N.INFER_BATCH_SIZE).count(4) == 20
    # streamed: first chunk after 30 ms, then 4 gaps of 10 ms (client and server agree)
    ttft = _vals(store, N.INFER_TTFT_SECONDS)
    assert len(ttft) == 5 and all(0.028 < v < 0.06 for v in ttft)
    assert all(0.009 < v < 0.02 for v in _vals(store, N.INFER_ITL_SECONDS))
    assert _vals(store, N.INFER_OUTPUT_TOKENS)[-5:] == [5] * 5
    assert streamed.ttft.p50 == pytest.approx(sorted(ttft)[2], abs=0.01)
    assert _vals(store, N.INFER_IN_FLIGHT)[-1] == 0
