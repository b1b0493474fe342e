"""The transport to a Prometheus server's HTTP API (or Thanos, Mimir, VictoriaMetrics behind the same
API), shared by the dashboard's panel reader (gpulens.views.prometheus) and the analysis reader
(gpulens.reader.prometheus): one place that turns a refused connection, a refused query or a broken
answer into one sentence (PrometheusUnavailableError, exit 3).

Requests go out through gpulens.http_client; the query text comes from gpulens.promql.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any

from gpulens import http_client
from gpulens.errors import BadInputError, UnavailableError

TIMEOUT_SECONDS = 10.0
# A query's answer at most (a wide range over many series): beyond it the query is refused, not read.
MAX_ANSWER_BYTES = 256 * 2**20
# query_range answers at most this many points per series (Prometheus refuses more).
MAX_RANGE_POINTS = 11_000


class PrometheusUnavailableError(UnavailableError):
    """The Prometheus server cannot be reached or refused a query."""


class PrometheusApi:
    """GETs against one Prometheus server; every answer is the `data` of a `success` body."""

    def __init__(self, url: str, *, timeout_seconds: float = TIMEOUT_SECONDS):
        try:
            parsed = urllib.parse.urlparse(url)
            parsed.port  # noqa: B018 - raises on a port that is not a number or out of range
        except ValueError:  # an unclosed or non-IP [bracket]: nothing of it is a server to read
            parsed = None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise BadInputError(f"Cannot read the Prometheus URL {http_client.redact_url(url)!r}.", hint="Write it as http://HOST:9090.")
        # A query string on the base (a proxy's ?token=...) goes with every request; the path goes before it.
        self._base = urllib.parse.urlunparse(parsed._replace(query="", fragment="")).rstrip("/")
        self._base_params = dict(urllib.parse.parse_qsl(parsed.query, keep_blank_values=True))
        self.url = http_client.redact_url(url.rstrip("/"))  # as shown: in errors, hints and descriptions
        self.timeout_seconds = timeout_seconds

    def get(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        try:
            r = http_client.get(f"{self._base}{path}", params={**self._base_params, **(params or {})},
                                timeout_seconds=self.timeout_seconds, max_bytes=MAX_ANSWER_BYTES)
        except http_client.HttpUnavailableError as e:
            raise PrometheusUnavailableError(
                f"Cannot reach Prometheus at {self.url}: {e.reason}.", hint="Check the --prometheus URL and that the server is up.",
            ) from None
        if not r.ok:
            try:
                msg = str(r.json().get("error", ""))
            except (ValueError, AttributeError):
                msg = ""
            raise PrometheusUnavailableError(
                f"Prometheus at {self.url} refused a query ({r.status}{': ' + msg if msg else ''}).",
                hint="Check the server's version (2.x or newer) and its logs.",
            )
        try:
            body = r.json()
        except ValueError as e:
            raise PrometheusUnavailableError(
                f"Cannot reach Prometheus at {self.url}: its answer is not JSON ({e}).", hint="Check the --prometheus URL and that the server is up.",
            ) from None
        if not isinstance(body, dict) or body.get("status") != "success":
            raise PrometheusUnavailableError(f"Prometheus at {self.url} answered an error: {body.get('error') if isinstance(body, dict) else body}.", hint="Check its logs.")
        return body["data"]

    def check(self) -> None:
        """Fail early, with one sentence, when the server is not there."""
        self.get("/api/v1/status/buildinfo")

    def range(self, expr: str, start: float, end: float, step_seconds: float) -> list[dict[str, Any]]:
        """query_range: `expr` evaluated at start, start + step, ... up to end."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{max(step_seconds, 0.001):.3f}"}
        return self.get("/api/v1/query_range", params).get("result", [])

    def instant(self, expr: str, t: float) -> list[dict[str, Any]]:
        """An instant query at `t` (a range selector in `expr` answers the raw samples it holds)."""
        return self.get("/api/v1/query", {"query": expr, "time": f"{t:.3f}"}).get("result", [])

    def label_values(self, label: str) -> list[str]:
        return list(self.get(f"/api/v1/label/{label}/values") or [])
