"""Running the dashboard: choose the listen address safely, bind, print the address, serve."""

from __future__ import annotations

import errno
import ipaddress
import secrets
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from gpulens.errors import BadInputError, PortInUseError
from gpulens.http_client import redact_url
from gpulens.webconfig import WebConfig

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ListenPlan:
    host: str
    port: int
    token: str | None
    token_generated: bool
    allowed_hosts: list[str] | None  # Host header values accepted; None = any (a token or basic auth guards it)
    scheme: str = "http"

    def url(self, port: int | None = None) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.host in ("0.0.0.0", "::"):
            host = socket.gethostname()
        base = f"{self.scheme}://{host}:{port if port is not None else self.port}/"
        return base + (f"?token={self.token}" if self.token else "")


def plan_listen(host: str, port: int, token: str | None = None, web_config: WebConfig | None = None) -> ListenPlan:
    """Loopback needs nothing; any other address needs a token, generated here when none is given,
    unless the web-config file's basic auth already guards it."""
    if token is not None and len(token) < 8:
        raise BadInputError("The token is too short to protect anything.", hint="Use at least 8 characters, or leave --token out to get a random one.")
    scheme = web_config.scheme if web_config is not None else "http"
    if is_loopback(host):
        return ListenPlan(host, port, token, False, sorted({*LOOPBACK_NAMES, host.lower()}), scheme)
    if token or (web_config is not None and web_config.basic_auth is not None):
        return ListenPlan(host, port, token, False, None, scheme)
    return ListenPlan(host, port, secrets.token_urlsafe(24), True, None, scheme)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so a taken port is one clear sentence, not a traceback."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise PortInUseError(
                f"Port {port} on {host} is already in use.", hint="Pick another with --listen 127.0.0.1:PORT, or stop what holds it."
            ) from None
        raise BadInputError(f"Cannot listen on {host}:{port}: {e.strerror}.", hint="Use an address of this machine, e.g. 127.0.0.1:8642.") from None
    from gpulens.web.guard import LISTEN_BACKLOG

    sock.listen(LISTEN_BACKLOG)
    sock.setblocking(False)
    return sock


def serve(
    store_path: str | Path | None,
    host: str = "127.0.0.1",
    port: int = 8642,
    token: str | None = None,
    open_browser: bool = False,
    *,
    prometheus_url: str | None = None,
    out: TextIO | None = None,
    web_config: WebConfig | None = None,
) -> None:
    """Serve the dashboard until interrupted (blocking). Prints the address to open."""
    from gpulens.web.app import create_app

    out = out or sys.stdout
    plan = plan_listen(host, port, token, web_config)
    tls = web_config.ssl_context() if web_config is not None else None  # a wrong certificate: one sentence, before binding
    app = create_app(store_path=store_path, prometheus_url=prometheus_url, token=plan.token, allowed_hosts=plan.allowed_hosts,
                     basic_auth=web_config.basic_auth if web_config is not None else None)
    check = getattr(app.state.reader, "check", None)
    if check is not None:
        check()  # an unreachable Prometheus is one sentence now, not an error on every panel later
    sock = bind(plan.host, plan.port)
    actual_port = sock.getsockname()[1]
    url = plan.url(actual_port)
    source = f"Prometheus at {redact_url(prometheus_url)}" if prometheus_url else f"the store {store_path}"

    def announce() -> None:
        print(f"gpulens dashboard on {url} reading {source} (Ctrl+C to stop)", file=out, flush=True)
        if plan.token_generated:
            print(f"It listens beyond this machine, so it needs this token (generated now): {plan.token}", file=out, flush=True)
        if open_browser:
            import webbrowser

            threading.Timer(1.0, webbrowser.open, args=(url,)).start()

    from gpulens.web.guard import uvicorn_config

    server = _announcing_server(_with_tls(uvicorn_config(app), tls), announce)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()


def _announcing_server(config: Any, announce: Any) -> Any:
    """A uvicorn server that prints its address once it serves: by then its own Ctrl-C handling is
    in place, so an interrupt right after the address is shown ends it cleanly (one sent between the
    print and the event loop's start left a half-built loop's traceback)."""
    import uvicorn

    class AnnouncingServer(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started and not self.should_exit:
                announce()

    return AnnouncingServer(config)


def _with_tls(config: Any, tls: Any) -> Any:
    """uvicorn's config serving `tls` (an ssl.SSLContext built from the web-config file) on the
    sockets bound here: loaded now, its context replaced, since uvicorn builds its own only from files."""
    if tls is not None:
        config.load()
        config.ssl = tls
    return config
