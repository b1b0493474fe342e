"""Local test servers with known behaviour, run in their own process (so the load tester's event
loop and the server's do not share a CPU thread). State that must be fresh per test (a stall's
start, a queue) is keyed by a path segment.

    python inference_test_servers.py PORT aiohttp   streaming completions, errors, rejections, a hanging route
    python inference_test_servers.py PORT timed     /fixed and /capacity: a bare HTTP/1.1 protocol whose
                                     answers leave at a computed moment ("10 ms" counts from the
                                     request's arrival), timed by the load tester's precise loop

Both run on `precise_loop`, whose timers fire within tens of microseconds: on a stock asyncio loop
"10 ms" would be 10–11 ms.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from aiohttp import web

from gpulens.bench.serve import precise_loop

_stall_origin: dict[str, float] = {}
_next_free: dict[str, float] = {}


async def _sleep_until(t: float) -> None:
    delay = t - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)  # precise on precise_loop


_tokenizers: dict[str, object] = {}
_prefix_blocks: dict[str, set] = {}
_logs: dict[str, list] = {}
CACHE_BLOCK_TOKENS = 16


def _prompt_tokens(body: dict, tok_path: str | None) -> list:
    """The prompt's tokens: its messages' contents (chat) or its prompt, by the tokenizer at
    `tok_path` (the test's own tokenizer.json) or, without one, by whitespace."""
    texts = [m.get("content", "") for m in body["messages"]] if "messages" in body else [body.get("prompt", "")]
    if tok_path:
        if tok_path not in _tokenizers:
            from tokenizers import Tokenizer

            _tokenizers[tok_path] = Tokenizer.from_file(tok_path)
        tok = _tokenizers[tok_path]
        return [i for t in texts for i in tok.encode(t, add_special_tokens=False).ids]
    return [w for t in texts for w in t.split()]


def _uncached(key: str, tokens: list) -> int:
    """Prefix caching by blocks of CACHE_BLOCK_TOKENS, as vLLM's: the leading whole blocks seen
    before (same tokens from the start) cost nothing to prefill."""
    seen = _prefix_blocks.setdefault(key, set())
    cached = 0
    hit = True
    for end in range(CACHE_BLOCK_TOKENS, len(tokens) + 1, CACHE_BLOCK_TOKENS):
        block = tuple(tokens[:end])
        if hit and block in seen:
            cached = end
        else:
            hit = False
            seen.add(block)
    return len(tokens) - cached


async def completions(request: web.Request) -> web.StreamResponse:
    """OpenAI-compatible streaming: the first token after `ttft_ms` (plus `prefill_us` per prompt
    token not in the prefix cache, with `cache=KEY`), then one every `itl_ms`. Without
    `ignore_eos` the "model" ends at `eos_at` tokens when that is given (and min_tokens allows).
    `log=KEY` keeps each request's prompt tokens (and, streamed, when its first and last tokens
    were really sent), read back at GET /log/KEY."""
    body = await request.json()
    chat = request.path.endswith("/chat/completions")
    q = request.query
    n = int(body.get("max_tokens", 16))
    if "eos_at" in q and not body.get("ignore_eos"):
        n = min(n, max(int(q["eos_at"]), int(body.get("min_tokens") or 0)))
    tokens = _prompt_tokens(body, q.get("tok"))
    t0 = time.perf_counter()  # the cost model counts from here: after the server has tokenized
    prefill = len(tokens) if "cache" not in q else _uncached(q["cache"], tokens)
    entry: dict = {}
    if "log" in q:
        entry = {"tokens": [str(t) for t in tokens], "prefilled": prefill, "max_tokens": body.get("max_tokens"),
                 "ignore_eos": body.get("ignore_eos"), "messages": len(body.get("messages") or [])}
        _logs.setdefault(q["log"], []).append(entry)
    ttft = float(q.get("ttft_ms", "50")) / 1000 + float(q.get("prefill_us", "0")) * 1e-6 * prefill
    itl = float(q.get("itl_ms", "20")) / 1000
    usage = {"completion_tokens": n, "prompt_tokens": len(tokens)}
    if not body.get("stream"):
        await _sleep_until(t0 + ttft + itl * (n - 1))
        return web.json_response({"choices": [{"text": "x" * n}], "usage": usage})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if chat:  # the first chat chunk carries only the role, as OpenAI's and vLLM's do
        await resp.write(b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n')
    for i in range(n):
        await _sleep_until(t0 + ttft + itl * i)  # absolute times: no drift from sleep jitter
        chunk = {"choices": [{"delta": {"content": f"t{i} "}}]} if chat else {"choices": [{"text": f"t{i} "}]}
        # when this server really sent its first and last token, from t0 (a loaded machine sends late):
        # read before the write, as the client may read the token before this process runs again
        entry["first_token_s" if i == 0 else "last_token_s"] = time.perf_counter() - t0
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def prompt_log(request: web.Request) -> web.Response:
    return web.json_response(_logs.get(request.match_info["key"], []))


async def tokenize(request: web.Request) -> web.Response:
    """vLLM's POST /tokenize, counting as completions do (`?tok=` is not available here: whitespace)."""
    body = await request.json()
    toks = _prompt_tokens({"prompt": body.get("prompt", "")}, None)
    return web.json_response({"count": len(toks), "tokens": list(range(len(toks))), "max_model_len": 4096})


async def error(request: web.Request) -> web.Response:
    return web.Response(status=500, text="model crashed")


async def reject(request: web.Request) -> web.Response:
    return web.Response(status=429, text="too many requests")


async def hang(request: web.Request) -> web.Response:
    await asyncio.sleep(3600)
    return web.Response(text="late")


async def trivial(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_app() -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_get("/log/{key}", prompt_log)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_get("/error", error)
    app.router.add_post("/error", error)
    app.router.add_get("/reject", reject)
    app.router.add_get("/hang", hang)
    app.router.add_get("/", trivial)
    return app


def answer_time(target: str, arrived: float) -> float:
    """When the answer to `GET target` that arrived at `arrived` (perf_counter) is due.

    /fixed/KEY?ms=M[&at=A&dur=D]  M ms after arrival; with a stall, answers due in [A, A+D) s after
                                  KEY's first request (and requests arriving then) wait until its end
    /capacity/KEY?ms=M            one at a time on a virtual clock: capacity is exactly 1000/M req/s
    anything else                 at once
    """
    url = urlsplit(target)
    q = {k: v[0] for k, v in parse_qs(url.query).items()}
    kind = url.path.strip("/").split("/")[0]
    ms = float(q.get("ms", "10")) / 1000
    if kind == "capacity":
        done = max(arrived, _next_free.get(url.path, 0.0)) + ms
        _next_free[url.path] = done
        return done
    done = arrived + ms if kind == "fixed" else arrived
    if "dur" in q:
        s0 = _stall_origin.setdefault(url.path, arrived) + float(q.get("at", "1"))
        s1 = s0 + float(q["dur"])
        if s0 <= done < s1 or s0 <= arrived < s1:
            done = max(done, s1)
    return done


_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"
_hits: dict[str, int] = {}  # requests seen per path, answered at GET /hits/PATH (a test waits on it, not on time)


def _text(body: str) -> bytes:
    data = body.encode()
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nContent-Type: text/plain\r\n\r\n%s" % (len(data), data)


class TimedProtocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive with bodiless requests (GET): just enough parsing to find each request's
    target, so the server's own time is microseconds and its answers leave when `answer_time` says.
    Answers on one connection keep their order, as HTTP/1.1 requires."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.buf = b""
        self.last_due = 0.0

    def data_received(self, data: bytes) -> None:
        arrived = time.perf_counter()
        self.buf += data
        loop = asyncio.get_running_loop()
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head, self.buf = self.buf[:end], self.buf[end + 4:]
            target = head.split(b" ", 2)[1].decode("latin-1")
            path = urlsplit(target).path
            if path.startswith("/hits/"):
                body = _text(str(_hits.get(path[len("/hits"):], 0)))
                self.last_due = due = max(arrived, self.last_due)
            else:
                _hits[path] = _hits.get(path, 0) + 1
                body = _OK
                self.last_due = due = max(answer_time(target, arrived), self.last_due)
            loop.call_at(loop.time() + (due - time.perf_counter()), self._answer, body)

    def _answer(self, body: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(body)


async def _serve_timed(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(TimedProtocol, "127.0.0.1", port, backlog=1024)
    await server.serve_forever()


def free_port() -> int:
    """testlib's free port, never handed out twice in one run (a repeat would find the last
    server still answering); imported here so the server processes do not load pytest."""
    tests = str(Path(__file__).resolve().parents[1])
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from testlib import free_port as once

    return once()


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
    if len(sys.argv) > 2 and sys.argv[2] == "timed":
        precise_loop.run(_serve_timed(port))
    else:
        web.run_app(make_app(), host="127.0.0.1", port=port, access_log=None, print=None, shutdown_timeout=0.5,
                    loop=precise_loop.new_event_loop())
