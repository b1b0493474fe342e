"""The Prometheus text format (0.0.4) of a registry, and the small HTTP server that serves it.

prometheus_client writes every counter's TYPE line as `<name>_total`, the OpenMetrics spelling. That
is right for gpulens's names (they end in `_total`) and wrong for dcgm-exporter's, whose counters keep
names such as `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`: Prometheus would then see untyped samples. So
the TYPE line here names the family as its samples are named; escaping and number formatting are
prometheus_client's own.
"""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.utils import floatToGoString

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


def start_metrics_server(registry: CollectorRegistry, host: str, port: int) -> ThreadingHTTPServer:
    """Serve `render_text(registry)` on http://host:port/metrics in a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                self.send_error(404, "gpulens serves /metrics")
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
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
            pass  # a scrape every few seconds is not news

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="gpulens-metrics", daemon=True).start()
    return server
