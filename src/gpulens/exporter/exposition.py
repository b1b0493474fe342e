"""The Prometheus text format (0.0.4) of a registry, and the small HTTP(S) server that serves it
beside /health and /ready (IPv4 or IPv6; TLS and basic auth from an exporter-toolkit web-config file;
the connection limits of `listener.BoundedHttpServer`).

prometheus_client writes every counter's TYPE line as `<name>_total`, the OpenMetrics spelling. That
is right for gpulens's names (they end in `_total`) and wrong for dcgm-exporter's, whose counters keep
names such as `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`: Prometheus would then see untyped samples. So
the TYPE line here names the family as its samples are named; escaping and number formatting are
prometheus_client's own.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry
from prometheus_client.utils import floatToGoString

from gpulens.exporter.health import Readiness
from gpulens.exporter.listener import BoundedHttpServer, BufferedRequestHandler, ConnectionLimits
from gpulens.webconfig import WebConfig

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def render_text(registry: CollectorRegistry) -> bytes:
    out: list[str] = []
    for fam in registry.collect():
        name, mtype = fam.name, fam.type
        if mtype == "counter" and fam.samples and all(s.name == name + "_total" for s in fam.samples):
            name += "_total"  # a gpulens counter (prometheus_client strips the suffix from the family)
        elif mtype == "unknown":
            mtype = "untyped"
        out.append(f"# HELP {name} {_escape_help(fam.documentation)}\n# TYPE {name} {mtype}\n")
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue  # OpenMetrics only
            labels = ",".join(f'{k}="{_escape_value(str(v))}"' for k, v in sorted(s.labels.items()))
            out.append(f"{s.name}{{{labels}}} {floatToGoString(s.value)}\n" if labels else f"{s.name} {floatToGoString(s.value)}\n")
    return "".join(out).encode("utf-8")


HTTP_REFUSED = "gpulens_http_refused"  # exposed as ..._total (a counter)
HTTP_REFUSED_CAUSES = ("busy", "waited too long", "header timeout", "body timeout", "head too large", "body too large",
                       "too many connections")


class _RefusedCollector:
    """The listener's refusals (listener.BoundedHttpServer.refused) as a counter, every cause from 0."""

    def __init__(self, server: BoundedHttpServer):
        self.server = server

    def collect(self):  # noqa: ANN201 - prometheus_client's collector protocol
        from prometheus_client.core import CounterMetricFamily

        fam = CounterMetricFamily(HTTP_REFUSED, "Connections to this listener closed or answered early (503, 4xx), by cause.",
                                  labels=["cause"])
        refused = dict(self.server.refused)
        for cause in sorted({*HTTP_REFUSED_CAUSES, *refused}):
            fam.add_metric([cause], float(refused.get(cause, 0)))
        yield fam


UNPROTECTED_PATHS = ("/health", "/ready")  # probes: the kubelet sends no credentials; they reveal one sentence


def start_metrics_server(registry: CollectorRegistry, host: str, port: int, *, web_config: WebConfig | None = None,
                         readiness: Callable[[], Readiness] | None = None,
                         limits: ConnectionLimits | None = None) -> BoundedHttpServer:
    """Serve `render_text(registry)` on /metrics, liveness on /health and `readiness` on /ready, in a
    daemon thread, within `limits` (listener.ConnectionLimits); TLS and basic auth from the
    web-config file when given. GET and HEAD."""
    auth = web_config.basic_auth if web_config is not None else None

    class Handler(BufferedRequestHandler):
        def do_HEAD(self) -> None:  # noqa: N802 (http.server's name)
            self.do_GET()  # the same status and headers; _write leaves the body out

        def _write(self, body: bytes) -> None:
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = self.path.split("?", 1)[0]
            if path == "/health":
                self._text(200, "ok")
                return
            if path == "/ready":
                r = readiness() if readiness is not None else Readiness(True, "ready")
                self._text(200 if r.ready else 503, r.reason)
                return
            if auth is not None and not auth.check(self.headers.get("Authorization")):
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="gpulens"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if path not in ("/metrics", "/"):
                self.send_error(404, "Not Found", "gpulens serves /metrics, /health and /ready.")
                return
            body = render_text(registry)
            gz = "gzip" in self.headers.get("Accept-Encoding", "")
            if gz:
                body = gzip.compress(body, compresslevel=1)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            if gz:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self._write(body)

        def _text(self, status: int, text: str) -> None:
            body = (text + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self._write(body)

    server = BoundedHttpServer(host, port, Handler, web_config.ssl_context() if web_config is not None else None, limits)
    registry.register(_RefusedCollector(server))  # type: ignore[arg-type]
    threading.Thread(target=server.serve_forever, name="gpulens-metrics", daemon=True).start()
    return server
