"""The dashboard's Starlette app: the page, its static assets, the JSON API, and the guards.

Guards: GET/HEAD only (the dashboard never changes anything); a token when one is set (bearer
header, or `?token=` once, which becomes an HttpOnly cookie); a Host allow-list against DNS
rebinding; a strict Content-Security-Policy (no inline script, nothing from other origins).
"""

from __future__ import annotations

import contextlib
import hmac
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from gpulens.errors import EXIT_UNAVAILABLE, BadInputError, GpulensError

STATIC_DIR = Path(__file__).resolve().parent / "static"
COOKIE = "gpulens_token"
SAFE_METHODS = {"GET", "HEAD"}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def _require_web() -> None:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise BadInputError(
            "The dashboard needs starlette and uvicorn, which are not installed.",
            hint="Install the web extra: pip install 'gpulens[web]'.",
        ) from None


def make_reader(store_path: str | Path | None = None, prometheus_url: str | None = None) -> Any:
    """A reader for exactly one source: a local store or a Prometheus server."""
    if (store_path is None) == (prometheus_url is None):
        raise BadInputError("Give the dashboard either a store or a Prometheus URL, not both or neither.",
                            hint="Use --store PATH for one node or --prometheus URL for a fleet.")
    if prometheus_url is not None:
        from gpulens.views.prometheus import PrometheusReader

        return PrometheusReader(prometheus_url)
    from gpulens.views.readers import store_reader

    return store_reader(store_path)  # type: ignore[arg-type]


def create_app(
    store_path: str | Path | None = None,
    prometheus_url: str | None = None,
    token: str | None = None,
    allowed_hosts: list[str] | None = None,
    reader: Any = None,
    basic_auth: Any = None,
) -> Any:
    """The dashboard as an ASGI app over a store file or a Prometheus server.

    `token`: when set, every request must carry it. `basic_auth` (webconfig.BasicAuth): when set,
    every request must carry a user and password of the web-config file. `allowed_hosts`: Host header values accepted
    (None accepts any; `serve` passes the listen address and, on loopback, localhost's names)."""
    _require_web()
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import FileResponse, PlainTextResponse, RedirectResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    from gpulens.web import api

    reader = reader or make_reader(store_path, prometheus_url)

    async def index(request: Request) -> Response:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-store"})

    async def handle_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GpulensError)
        # An outside system being down (Prometheus) is not the caller's fault: 503, not 400.
        return api.error_response(exc, 503 if exc.exit_code == EXIT_UNAVAILABLE else 400)

    class Guard:
        """Pure ASGI middleware: method, host, token; then security headers on every answer."""

        def __init__(self, app: Any):
            self.app = app

        async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await self.app(scope, receive, send)
                return
            request = Request(scope)
            denied = self._check(request)
            if denied is None and basic_auth is not None:
                import anyio.to_thread

                # bcrypt is slow on purpose (~0.2 s for a password not seen before): off the event loop
                if not await anyio.to_thread.run_sync(basic_auth.check, request.headers.get("authorization")):
                    denied = PlainTextResponse("This dashboard needs a user and password (basic auth).", 401,
                                               headers={"WWW-Authenticate": 'Basic realm="gpulens"'})
            if denied is not None:
                await self._with_headers(denied)(scope, receive, send)
                return
            if token and request.query_params.get("token") and request.url.path == "/":
                # Trade the token in the address for a cookie, and drop it from the address bar.
                resp = RedirectResponse("/", status_code=303)
                resp.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
                await self._with_headers(resp)(scope, receive, send)
                return

            async def send_with_headers(message: dict) -> None:
                if message["type"] == "http.response.start":
                    headers = list(message.get("headers", []))
                    headers += [(k.encode(), v.encode()) for k, v in _security_headers().items()]
                    message = {**message, "headers": headers}
                await send(message)

            await self.app(scope, receive, send_with_headers)

        def _check(self, request: Request) -> Response | None:
            if request.method not in SAFE_METHODS:
                return PlainTextResponse("The dashboard is read-only: only GET is allowed.", 405, headers={"Allow": "GET, HEAD"})
            if allowed_hosts is not None:
                host = (request.headers.get("host") or "").rsplit(":", 1)[0].strip("[]").lower()
                if host not in allowed_hosts:
                    return PlainTextResponse("Unknown Host header: open the dashboard at the address it printed.", 400)
            if token:
                given = (
                    _bearer(request.headers.get("authorization"))
                    or request.cookies.get(COOKIE)
                    or request.query_params.get("token")
                    or ""
                )
                if not hmac.compare_digest(given.encode(), token.encode()):
                    msg = "This dashboard needs its token: open the address with ?token=… that `gpulens dashboard` printed."
                    if request.url.path.startswith("/api/"):
                        return api.json_response({"error": msg, "hint": "Send Authorization: Bearer <token>."}, 401)
                    return PlainTextResponse(msg, 401)
            return None

        @staticmethod
        def _with_headers(resp: Response) -> Response:
            resp.headers.update(_security_headers())
            return resp

    routes = [
        Route("/", index),
        Route("/api/health", api.health),
        Route("/api/meta", api.meta),
        Route("/api/panel/{panel}", api.panel),
        Route("/api/series", api.series),
        Route("/api/findings", api.findings),
        Route("/api/alerts", api.alerts),
        Route("/api/events", api.events),
        Route("/api/openapi.json", api.openapi),
        # StaticFiles resolves every path inside STATIC_DIR and answers 404 for anything outside it.
        Mount("/static", app=StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        reader.close()

    from collections import Counter

    from gpulens.web.guard import ConcurrencyLimit

    shed: Counter[str] = Counter()
    app = Starlette(
        routes=routes,
        middleware=[Middleware(ConcurrencyLimit, stats=shed), Middleware(Guard)],  # shed before any work
        exception_handlers={GpulensError: handle_error},
        lifespan=lifespan,
    )
    app.state.reader = reader
    app.state.shed = shed  # requests answered 503 by ConcurrencyLimit, by cause
    return app


def _bearer(header: str | None) -> str | None:
    if header and header.lower().startswith("bearer "):
        return header[7:].strip()
    return None


def _security_headers() -> dict[str, str]:
    return {
        "Content-Security-Policy": CSP,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "X-Frame-Options": "DENY",
    }
