"""A tiny ASGI inference server whose latency depends on a batching knob, for `gpulens tune serve`.

Requests queue up; one worker takes up to `--max-batch` of them at a time and "runs the model"
for `base + per_item × batch` milliseconds, as a GPU's batched forward pass does. With a batch of
one the server is slow under load; larger batches raise the rate it sustains. It is measured by
gpulens's InferenceMiddleware (writing to $GPULENS_STORE when set) and answers 503 while it
"loads the model" for `--load-seconds`, like a real server's cold start. With
`--crash-above-batch N` it dies when a batch grows past N, as an engine does of an OOM under load.

    python examples/tune/batching_server.py --port 8000 --max-batch 8
    gpulens bench serve --url http://127.0.0.1:8000/v1/generate --rate 50 --duration 5s
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from gpulens.workload.inference import InferenceMiddleware, InferenceMonitor
from gpulens.workload.inference.middleware import request_handle


def make_app(max_batch: int, base_ms: float, per_item_ms: float, load_seconds: float, crash_above: int | None = None):  # noqa: ANN201
    queue: asyncio.Queue | None = None
    ready_at = time.monotonic() + load_seconds

    async def batcher() -> None:
        while True:
            batch = [await queue.get()]  # type: ignore[union-attr]
            while len(batch) < max_batch and not queue.empty():  # type: ignore[union-attr]
                batch.append(queue.get_nowait())  # type: ignore[union-attr]
            if crash_above is not None and len(batch) > crash_above:
                print(f"CUDA out of memory: a batch of {len(batch)} does not fit (limit {crash_above})", file=sys.stderr, flush=True)
                os._exit(1)  # as an engine dies of an OOM under load
            await asyncio.sleep((base_ms + per_item_ms * len(batch)) / 1000)
            for fut in batch:
                if not fut.done():
                    fut.set_result(len(batch))

    async def app(scope, receive, send) -> None:  # noqa: ANN001
        nonlocal queue
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    queue = asyncio.Queue()
                    asyncio.get_running_loop().create_task(batcher())
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if time.monotonic() < ready_at:
            await _answer(send, 503, {"error": "loading the model"})
            return
        fut = asyncio.get_running_loop().create_future()
        await queue.put(fut)  # type: ignore[union-attr]
        batch = await fut
        h = request_handle(scope)
        if h is not None:
            h.set(batch_size=batch, output_tokens=1)
        await _answer(send, 200, {"text": "ok", "batch_size": batch})

    return app


async def _answer(send, status: int, body: dict) -> None:  # noqa: ANN001
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch", type=int, default=1)
    p.add_argument("--base-ms", type=float, default=20.0, help="time of a forward pass, whatever the batch")
    p.add_argument("--per-item-ms", type=float, default=2.0, help="extra time per request in the batch")
    p.add_argument("--load-seconds", type=float, default=0.5, help="answer 503 this long after start (model loading)")
    p.add_argument("--crash-above-batch", type=int, default=None, help="die (as of an OOM) when a batch grows past this")
    a = p.parse_args()
    import uvicorn

    store = os.environ.get("GPULENS_STORE") or str(Path(tempfile.gettempdir()) / "gpulens-batching-server.db")
    monitor = InferenceMonitor(store, service="batching-example", model=f"max_batch={a.max_batch}")
    app = InferenceMiddleware(make_app(a.max_batch, a.base_ms, a.per_item_ms, a.load_seconds, a.crash_above_batch), monitor=monitor)
    uvicorn.run(app, host="127.0.0.1", port=a.port, log_level="warning", lifespan="on")


if __name__ == "__main__":
    main()
