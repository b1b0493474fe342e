"""A serving app in its own process: Starlette behind the real InferenceMiddleware, answering after a
seeded latency (mostly fast, a slow tail) so percentiles have something to say."""

import asyncio
import random
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from gpulens import InferenceMiddleware, InferenceMonitor

store, port = sys.argv[1], int(sys.argv[2])
rng = random.Random(11)


async def infer(request):
    await asyncio.sleep(rng.choice((0.004, 0.008, 0.015, 0.03)) if rng.random() > 0.05 else 0.2)
    return JSONResponse({"ok": True})


monitor = InferenceMonitor(store, service="chat", model="tiny-llm")
app = InferenceMiddleware(Starlette(routes=[Route("/v1/infer", infer, methods=["GET", "POST"])]), monitor=monitor)
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
