"""One request against the target: plain HTTP, or an OpenAI-compatible completion streamed as
server-sent events, over the lean client in `http1`. Every time is measured on one monotonic
clock (`time.perf_counter`)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from gpulens.bench.serve.http1 import ConnectionPool, HttpClientError, Response, build_request
from gpulens.errors import BadInputError, shown
from gpulens.http_client import redact_url

TargetKind = Literal["http", "completions", "chat"]
Status = Literal["ok", "error", "timeout", "rejected"]
REJECT_CODES = frozenset({429, 503})  # the server said "not now": load shedding, not a failure
# The error of a request still in flight when the user stopped the run: not the server's failure.
CANCELLED_ERROR = "cancelled: the run was stopped while this request was in flight"


@dataclass(frozen=True)
class Target:
    """What each request sends. `kind` chooses how the response is read."""

    url: str
    method: str = "GET"
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    kind: TargetKind = "http"
    stream: bool = True

    def request_bytes(self, body: bytes | None = None) -> bytes:
        """The request on the wire (with `body` in place of the target's own, where given);
        raises ValueError for a header that would break it."""
        return build_request(self.method, self.url, self.headers, self.body if body is None else body)


def check_target_url(url: str) -> None:
    """One sentence for a URL no request can be sent to: not http(s), no host, a port that is not a
    number from 0 to 65535, or an unclosed or non-IP [bracket] (urlsplit raises for those two)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number or out of range
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadInputError(f"Cannot use the URL {shown(redact_url(url))}.", hint="Give a full URL such as http://127.0.0.1:8000/v1/completions.")


def target_kind_for(url: str) -> TargetKind:
    """OpenAI-compatible endpoints are recognised by their path (a URL that is none: BadInputError)."""
    check_target_url(url)
    path = urlsplit(url).path.rstrip("/")
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/completions"):
        return "completions"
    return "http"


def openai_body(kind: TargetKind, *, model: str, prompt: str, max_tokens: int, stream: bool) -> bytes:
    body: dict[str, object] = {"model": model, "max_tokens": max_tokens, "stream": stream, "temperature": 0}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream:
        body["stream_options"] = {"include_usage": True}  # the last chunk then carries the token count
    return json.dumps(body).encode()


@dataclass(slots=True)
class RequestRecord:
    """One request. Times are seconds on the run's clock (0 = the run's start)."""

    index: int
    worker: int
    intended: float
    sent: float | None = None
    first_token: float | None = None
    end: float | None = None
    status: Status = "error"
    http_status: int | None = None
    output_tokens: int | None = None
    itl_mean: float | None = None
    error: str | None = None
    input_tokens: int | None = None  # the server's usage.prompt_tokens, else the workload's count
    planned_output_tokens: int | None = None  # max_tokens asked for (shaped traffic)
    itls: list[float] | None = None  # every inter-token gap, seconds (streamed completions)

    @property
    def latency(self) -> float | None:
        return None if self.end is None else self.end - self.intended

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.intended

    @property
    def tpot(self) -> float | None:
        """vLLM's definition: (latency − TTFT) / (output tokens − 1)."""
        if self.end is None or self.first_token is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.end - self.first_token) / (self.output_tokens - 1)


def _chunk_text(obj: dict, kind: TargetKind) -> str:
    choices = obj.get("choices") or []
    if not choices:
        return ""
    c = choices[0]
    if kind == "chat":
        return (c.get("delta") or {}).get("content") or ""
    return c.get("text") or ""


async def _read_stream(resp: Response, kind: TargetKind, rec: RequestRecord, t0: float, itl: list[float]) -> None:
    last = None
    chunks = 0
    usage_tokens = None
    async for raw in resp.iter_lines():
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            break
        now = time.perf_counter() - t0
        try:
            obj = json.loads(payload)
        except ValueError:
            continue
        usage = obj.get("usage") or {}
        if usage and isinstance(usage, dict):
            if usage.get("completion_tokens"):
                usage_tokens = int(usage["completion_tokens"])
            if usage.get("prompt_tokens"):
                rec.input_tokens = int(usage["prompt_tokens"])
        if not _chunk_text(obj, kind):
            continue  # role-only or usage-only chunks carry no token
        chunks += 1
        if last is None:
            rec.first_token = now
        else:
            itl.append(now - last)
        last = now
    rec.output_tokens = usage_tokens if usage_tokens is not None else chunks
    if itl:
        rec.itl_mean = sum(itl) / len(itl)


async def send_one(
    pool: ConnectionPool, target: Target, raw: bytes, rec: RequestRecord, t0: float, timeout: float, itl: list[float]
) -> RequestRecord:
    """Send `raw` (`target.request_bytes()`) and fill `rec`. Never raises for the server's
    behaviour: a refused connection, an error status or a timeout become the record's status."""
    rec.sent = time.perf_counter() - t0
    try:
        async with asyncio.timeout(timeout):
            async with pool.request(raw) as resp:
                rec.http_status = resp.status
                if resp.status >= 400:
                    body = await resp.read(200)
                    rec.status = "rejected" if resp.status in REJECT_CODES else "error"
                    rec.error = f"HTTP {resp.status} {resp.reason or ''}".strip() + (
                        f": {body.decode(errors='replace').strip()}" if body.strip() else ""
                    )
                elif target.kind != "http" and target.stream:
                    await _read_stream(resp, target.kind, rec, t0, itl)
                    rec.status = "ok"
                else:
                    data = await resp.read()
                    if target.kind != "http":
                        try:
                            usage = json.loads(data).get("usage") or {}
                            rec.output_tokens = usage.get("completion_tokens")
                            rec.input_tokens = usage.get("prompt_tokens") or rec.input_tokens
                        except (ValueError, AttributeError):
                            pass
                    rec.status = "ok"
        rec.end = time.perf_counter() - t0
    except TimeoutError:
        rec.end = time.perf_counter() - t0
        rec.status = "timeout"
        rec.error = f"no complete response within {timeout:g} s"
    except (HttpClientError, OSError) as e:
        rec.status = "error"
        rec.error = str(e) if isinstance(e, HttpClientError) else f"{type(e).__name__}: {e}"
    return rec
