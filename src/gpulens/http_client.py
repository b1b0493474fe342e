"""One seam for the HTTP requests gpulens sends out: Prometheus queries, engine /metrics scrapes,
alert webhooks and tune's health checks (the load tester keeps its own fast client).

Why one: every caller needs the same four guarantees, and each used to get some of them wrong.
- A bound on time: `timeout_seconds` limits each attempt as a whole (connect, send and read the
  whole answer); a watchdog shuts the socket at that deadline, so a server that trickles a byte a
  second is cut off too, not only one that is silent. `deadline_seconds` bounds all attempts.
- A bound on memory: the body is read up to `max_bytes`; beyond it the call refuses the answer or
  keeps the first `max_bytes`, as the caller chooses. An endless body never fills memory.
- Retries only where safe: a GET, or a POST the caller calls idempotent, after a transport failure
  or a 429/5xx, a bounded number of times with exponential backoff.
- One mapping of failures: every transport error (refused, reset, timeout, TLS, a broken answer)
  is an `HttpUnavailableError` (exit 3) naming the URL; a URL that cannot be read is bad input (exit 2).
- Secrets stay secret: credentials in a URL (`http://user:pw@host/`) are sent as an
  `Authorization: Basic` header, not dropped; every URL this module names in an error is
  `redact_url`'s (userinfo and secret-looking query values as `***`).
Any HTTP status is an answer, returned as a `Response`: what a 404 or a 500 means is the caller's call.

Standard library only (urllib, so redirects and the *_proxy variables work as with `urlopen`).
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gpulens.errors import BadInputError, UnavailableError
from gpulens.safe_parse import json_value

DEFAULT_MAX_BYTES = 16 * 2**20
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
_CHUNK_BYTES = 64 * 1024
OverLimit = Literal["refuse", "truncate"]


class HttpUnavailableError(UnavailableError):
    """A server did not answer usably (refused, reset, timed out, TLS failed, broken or oversized answer).
    `reason` is the part after the URL, for callers that say it in their own sentence."""

    def __init__(self, url: str, reason: str, *, hint: str | None = "Check the URL and that the server is up.",
                 retryable: bool = True):
        url = redact_url(url)
        super().__init__(f"Cannot reach {url}: {reason}.", hint=hint)
        self.url = url
        self.reason = reason
        self.retryable = retryable  # False where another attempt would get the same (an oversized answer)


@dataclass(frozen=True)
class Response:
    """An HTTP answer of any status. Header names are lower case."""

    url: str
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes
    elapsed_seconds: float
    truncated: bool = False  # the body was cut at max_bytes (over_limit="truncate")

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body as JSON (ValueError when it is not, or holds NaN, a nesting or a number past the limits)."""
        return json_value(self.body)


class Cancel:
    """Cuts, from another thread, the calls under way that were given it (a notifier's close):
    their sockets are shut and they raise HttpUnavailableError; later calls fail at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._guards: set[_Guard] = set()

    def set(self) -> None:
        with self._lock:
            self._event.set()
            guards = list(self._guards)
        for g in guards:
            g.cut("cancelled")

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep `seconds` unless cancelled first (True then)."""
        return self._event.wait(seconds)

    def _add(self, guard: _Guard) -> None:
        with self._lock:
            self._guards.add(guard)
            cancelled = self._event.is_set()
        if cancelled:
            guard.cut("cancelled")

    def _remove(self, guard: _Guard) -> None:
        with self._lock:
            self._guards.discard(guard)


class _Guard:
    """The connections of one attempt, and why they were cut (the deadline, or a Cancel)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conns: list[http.client.HTTPConnection] = []
        self._socks: list[socket.socket] = []  # kept: urllib drops conn.sock once the headers are read
        self.why: str | None = None

    def track(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._conns.append(conn)

    def connected(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if conn.sock is not None:
                self._socks.append(conn.sock)
            late = self.why is not None
        if late:  # cut while it was connecting: shut it now
            _shut(conn.sock)

    def cut(self, why: str) -> None:
        with self._lock:
            if self.why is None:
                self.why = why
            socks = [c.sock for c in self._conns] + self._socks
        for s in socks:
            _shut(s)


def _shut(sock: socket.socket | None) -> None:
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked recv/send in the calling thread
        except OSError:
            pass


def _guarded(http_class: Callable[..., http.client.HTTPConnection], guard: _Guard) -> Callable[..., http.client.HTTPConnection]:
    def make(*args: Any, **kwargs: Any) -> http.client.HTTPConnection:
        conn = http_class(*args, **kwargs)
        connect = conn.connect

        def connect_then_check() -> None:
            connect()
            guard.connected(conn)

        conn.connect = connect_then_check  # type: ignore[method-assign]
        guard.track(conn)
        return conn

    return make


class _HttpHandler(urllib.request.HTTPHandler):
    def __init__(self, guard: _Guard):
        super().__init__()
        self._guard = guard

    def do_open(self, http_class, req, **kw):  # noqa: ANN001, ANN201 - urllib's own signature
        return super().do_open(_guarded(http_class, self._guard), req, **kw)


class _HttpsHandler(urllib.request.HTTPSHandler):
    def __init__(self, guard: _Guard):
        super().__init__()
        self._guard = guard

    def do_open(self, http_class, req, **kw):  # noqa: ANN001, ANN201
        return super().do_open(_guarded(http_class, self._guard), req, **kw)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the 3xx comes back as the answer


def get(url: str, *, timeout_seconds: float, params: Mapping[str, Any] | None = None, **options: Any) -> Response:
    """GET `url` (with `params` as its query string); retried up to `retries` times. Options as `request`."""
    if params:
        url += ("&" if urllib.parse.urlsplit(url).query else "?") + urllib.parse.urlencode(params, doseq=True)
    return request("GET", url, timeout_seconds=timeout_seconds, **options)


def post(url: str, *, timeout_seconds: float, body: bytes = b"", json_body: Any = None, idempotent: bool = False,
         **options: Any) -> Response:
    """POST bytes, or `json_body` as JSON; retried only when the caller says it is `idempotent`."""
    headers = dict(options.pop("headers", None) or {})
    if json_body is not None:
        body = json.dumps(json_body).encode()
        headers.setdefault("Content-Type", "application/json")
    return request("POST", url, timeout_seconds=timeout_seconds, body=body, headers=headers, idempotent=idempotent, **options)


def request(
    method: str,
    url: str,
    *,
    timeout_seconds: float,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    retries: int = 0,
    backoff_seconds: float = 0.2,
    deadline_seconds: float | None = None,
    idempotent: bool = False,
    max_bytes: int = DEFAULT_MAX_BYTES,
    over_limit: OverLimit = "refuse",
    follow_redirects: bool = True,
    env_proxy: bool = True,
    cancel: Cancel | None = None,
) -> Response:
    """One call, in up to `retries + 1` attempts of at most `timeout_seconds` each, all within
    `deadline_seconds`. `max_bytes=0` reads only the status and headers. Redirects are followed
    for GET only (urllib would turn a redirected POST into a GET without its body)."""
    _check_url(url)
    if not timeout_seconds > 0:
        raise ValueError("timeout_seconds must be above zero")
    url, authorization = split_credentials(url)
    if authorization is not None and not any(k.lower() == "authorization" for k in (headers or {})):
        headers = {**(headers or {}), "Authorization": authorization}
    safe = idempotent or method in ("GET", "HEAD")  # a retried POST may act twice: only when the caller says it may
    attempts = 1 + (max(0, retries) if safe else 0)
    start = time.monotonic()
    end = start + deadline_seconds if deadline_seconds is not None else None
    for attempt in range(attempts):
        limit = timeout_seconds if end is None else max(0.001, min(timeout_seconds, end - time.monotonic()))
        pause = backoff_seconds * 2**attempt
        try:
            resp = _attempt(method, url, body, dict(headers or {}), limit, max_bytes, over_limit,
                            follow_redirects and method in ("GET", "HEAD"), env_proxy, cancel)
        except HttpUnavailableError as e:
            if _last(attempt, attempts, pause, end) or (cancel is not None and cancel.is_set()) or not e.retryable:
                raise
        else:
            if _last(attempt, attempts, pause, end) or resp.status not in RETRY_STATUSES:
                return resp
        if cancel is None:
            time.sleep(pause)
        elif cancel.wait(pause):
            raise HttpUnavailableError(url, "cancelled")
    raise AssertionError("unreachable")  # the loop returns or raises on its last attempt


def _last(attempt: int, attempts: int, pause: float, end: float | None) -> bool:
    """No attempt left, or the deadline leaves no time for the pause and another one."""
    return attempt + 1 == attempts or (end is not None and time.monotonic() + pause >= end)


def check_http_url(url: str, option: str | None = None, example: str = "http://HOST:PORT/PATH") -> str:
    """`url` if it is http(s)://HOST[:PORT]/...; else one sentence naming the option it came from
    (shown redacted) and an example of what to write. Every URL-taking option checks through here."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number or out of range
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        what = f"{option} {redact_url(url)!r} is not an http(s) URL." if option else f"Cannot read the URL {redact_url(url)!r}."
        raise BadInputError(what, hint=f"Write it as {example}.")
    return url


def _check_url(url: str) -> None:
    check_http_url(url)


def _attempt(method: str, url: str, body: bytes | None, headers: dict[str, str], limit: float, max_bytes: int,
             over_limit: OverLimit, follow_redirects: bool, env_proxy: bool, cancel: Cancel | None) -> Response:
    guard = _Guard()
    handlers: list[urllib.request.BaseHandler] = [_HttpHandler(guard), _HttpsHandler(guard)]
    if not env_proxy:
        handlers.append(urllib.request.ProxyHandler({}))
    if not follow_redirects:
        handlers.append(_NoRedirect())
    opener = urllib.request.build_opener(*handlers)
    req = urllib.request.Request(url, data=body if method != "GET" else None, headers=headers, method=method)
    timer = threading.Timer(limit, guard.cut, args=(f"no complete answer within {limit:g} s",))
    timer.daemon = True
    if cancel is not None:
        cancel._add(guard)
    t0 = time.monotonic()
    timer.start()
    resp: Any = None
    try:
        try:
            resp = opener.open(req, timeout=limit)
            status = resp.status
        except urllib.error.HTTPError as e:  # a non-2xx answer is still an answer
            resp, status = e, e.code
        data, truncated = _read(resp, url, max_bytes, over_limit)
        got = Response(url, status, str(getattr(resp, "reason", "") or ""), {k.lower(): v for k, v in resp.headers.items()},
                       data, time.monotonic() - t0, truncated)
    except (HttpUnavailableError, OSError, http.client.HTTPException, ValueError) as e:  # every way a transport fails
        if guard.why is not None:  # cut: whatever broke, the deadline or a Cancel is why
            raise HttpUnavailableError(url, guard.why) from None
        if isinstance(e, HttpUnavailableError):
            raise
        raise _mapped(url, e, limit) from None
    finally:
        timer.cancel()
        if cancel is not None:
            cancel._remove(guard)
        if resp is not None:
            resp.close()
    if guard.why is not None:  # a cut socket reads as a clean end of the body
        raise HttpUnavailableError(url, guard.why)
    return got


def _read(resp: Any, url: str, max_bytes: int, over_limit: OverLimit) -> tuple[bytes, bool]:
    if max_bytes <= 0:
        return b"", False
    chunks: list[bytes] = []
    n = 0
    while True:
        chunk = resp.read(min(_CHUNK_BYTES, max_bytes + 1 - n))
        if not chunk:
            break
        chunks.append(chunk)
        n += len(chunk)
        if n > max_bytes:
            if over_limit == "truncate":
                return b"".join(chunks)[:max_bytes], True
            raise HttpUnavailableError(url, f"the answer is larger than {max_bytes} bytes",
                                       hint="Point at an endpoint with a smaller answer, or narrow the request.", retryable=False)
    declared = resp.headers.get("Content-Length")
    if declared is not None and declared.strip().isdigit() and n < int(declared):
        raise HttpUnavailableError(url, f"the answer ended after {n} of its {int(declared)} bytes")
    return b"".join(chunks), False


def _mapped(url: str, e: BaseException, limit: float) -> BadInputError | HttpUnavailableError:
    """The one sentence for a transport failure (or bad input, for a URL urllib cannot use)."""
    cause = e.reason if isinstance(e, urllib.error.URLError) else e
    if isinstance(cause, ValueError) and not isinstance(cause, UnicodeError):  # InvalidURL, an unknown scheme
        return BadInputError(f"Cannot read the URL {redact_url(url)!r}: {cause}.", hint="Write it as http://HOST:PORT/PATH.")
    return HttpUnavailableError(url, _reason(cause, limit))


def _reason(e: object, limit: float) -> str:
    if isinstance(e, str):
        return e
    if isinstance(e, TimeoutError | socket.timeout):
        return f"no answer within {limit:g} s"
    if isinstance(e, socket.gaierror):
        return "the host name does not resolve"
    if isinstance(e, ConnectionRefusedError):
        return "the connection was refused (nothing listens there)"
    if isinstance(e, ssl.SSLCertVerificationError):
        return f"its TLS certificate is not trusted here ({e.verify_message})"
    if isinstance(e, ssl.SSLError):
        return f"TLS failed ({e.reason or e})"
    if isinstance(e, http.client.RemoteDisconnected):
        return "the server closed the connection without an answer"
    if isinstance(e, ConnectionError):
        return f"the connection broke ({e.strerror or type(e).__name__})"
    if isinstance(e, http.client.IncompleteRead):
        return "the answer ended early"
    if isinstance(e, http.client.BadStatusLine | http.client.LineTooLong):
        return "the answer is not HTTP"
    if isinstance(e, http.client.HTTPException):
        return f"a broken answer ({type(e).__name__})"
    if isinstance(e, OSError):
        return e.strerror or str(e) or type(e).__name__
    return str(e) or type(e).__name__


# ---------------------------------------------------------------- secrets in URLs
# A query parameter whose name contains one of these holds a secret: its value is shown as ***.
_SECRET_PARAM = re.compile(r"token|key|secret|pass|pwd|sig|auth|credential|session|jwt|bearer|cookie", re.IGNORECASE)
REDACTED = "***"


def split_credentials(url: str) -> tuple[str, str | None]:
    """(the URL without its userinfo, the `Authorization: Basic` value it stood for, or None)."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}".encode()).decode()
    return urllib.parse.urlunsplit(parts._replace(netloc=hostport)), f"Basic {token}"


def redact_url(url: str) -> str:
    """The URL as it may be shown (logs, errors, the store, any output): userinfo as `***@` and the
    values of secret-looking query parameters (token, key, secret, password, sig, auth...) as `***`.
    `http://alice:pw@host/hook?token=T&x=1` -> `http://***@host/hook?token=***&x=1`."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return REDACTED  # not readable as a URL: nothing of it can be shown safely
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    query = "&".join(_redact_param(p) for p in parts.query.split("&")) if parts.query else parts.query
    fragment = REDACTED if parts.fragment and _SECRET_PARAM.search(parts.fragment) else parts.fragment
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query, fragment=fragment))


def _redact_param(pair: str) -> str:
    name, eq, _ = pair.partition("=")
    return f"{name}={REDACTED}" if eq and _SECRET_PARAM.search(urllib.parse.unquote_plus(name)) else pair
