"""A real HTTP receiver for the notifier tests (importable by name, as alerts_rig is)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpulens.alerts.engine import AlertState


def alert(i: int, value: float = 79.0) -> AlertState:
    return AlertState(rule="GpuXid", severity="critical", labels={"gpu": "0", "n": str(i)}, state="firing",
                      active_since=1_800_000_000.0 + i, value=value, summary=f"alert {i}", advice="", fingerprint=f"f{i}")


class HttpReceiver:
    """Answers every POST with `status` after `delay_seconds` (a Location header with `location`),
    and records each request's path, headers and alerts."""

    def __init__(self, status: int = 200, delay_seconds: float = 0.0, location: str | None = None):
        self.status, self.delay_seconds, self.location = status, delay_seconds, location
        self.requests: list[tuple[str, dict[str, str], list[str]]] = []
        rx = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                rx.requests.append((self.path, dict(self.headers), [a["labels"].get("n", a["labels"].get("alertname", "")) for a in json.loads(body)["alerts"]]))
                time.sleep(rx.delay_seconds)  # the receiver is slow, not the test: it waits on delivery
                self.send_response(rx.status)
                if rx.location:
                    self.send_header("Location", rx.location)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def alerts(self) -> list[str]:
        return sorted(n for _, _, ns in self.requests for n in ns)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
