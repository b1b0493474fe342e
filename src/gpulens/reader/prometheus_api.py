"""The transport to a Prometheus server's HTTP API (or Thanos, Mimir, VictoriaMetrics behind the same
API), shared by the dashboard's panel reader (gpulens.views.prometheus) and the analysis reader
(gpulens.reader.prometheus): one place that turns a refused connection, a refused query or a broken
answer into one sentence (PrometheusUnavailableError, exit 3). An answer is checked for the shape
its API path promises (a query's `data.result` a list of series, each with its labels and
[time, value] samples; a label's values a list of strings...) before any caller reads it, so a
server that answers JSON of another shape (a proxy, another service on the port) is that sentence
too, never an AttributeError deep in a reader.

Requests go out through gpulens.http_client; the query text comes from gpulens.promql.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from gpulens import http_client
from gpulens.errors import BadInputError, UnavailableError, shown

TIMEOUT_SECONDS = 10.0
# A query's answer at most (a wide range over many series): beyond it the query is refused, not read.
MAX_ANSWER_BYTES = 256 * 2**20
# query_range answers at most this many points per series (Prometheus refuses more).
MAX_RANGE_POINTS = 11_000


NOT_PROMETHEUS_HINT = ("Check that --prometheus points at Prometheus itself "
                       "(or at Thanos, Mimir or VictoriaMetrics, which answer the same API).")
# The API paths whose `data` is a list of strings (null read as none).
_LABEL_VALUES = re.compile(r"/api/v1/label/[^/]+/values")


class PrometheusUnavailableError(UnavailableError):
    """The Prometheus server cannot be reached, refused a query, or answered something other than its API."""


def _kind(value: object) -> str:
    """What a JSON value is, for a sentence: "a list", "the number 3", "the string 'nope'"."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"the number {shown(value, quote=False)}"
    return f"the string {shown(value)}"


def _first_bytes(body: bytes) -> str:
    return shown(body[:200].decode("utf-8", errors="replace"), 60) if body else "none, the answer is empty"


def _is_number(x: object) -> bool:
    """A sample's time or value as Prometheus writes it: a number, or a string float() reads ("1.5", "NaN", "+Inf")."""
    if isinstance(x, bool):
        return False
    if isinstance(x, int | float):
        return True
    if isinstance(x, str):
        try:
            float(x)
        except ValueError:
            return False
        return True
    return False


def _sample_problem(pair: object, where: str) -> str | None:
    if not (isinstance(pair, list) and len(pair) == 2 and _is_number(pair[0]) and _is_number(pair[1])):
        said = shown(pair, quote=False) if isinstance(pair, list) else _kind(pair)
        return f"{where} is {said}, not a [time, value] pair of numbers"
    return None


def _labels_problem(labels: object, where: str) -> str | None:
    if not isinstance(labels, dict):
        return f"{where} is {_kind(labels)}, not an object of labels"
    for k, v in labels.items():
        if not isinstance(v, str):
            return f"{where}.{shown(k, quote=False)} is {_kind(v)}, not a string"
    return None


def _result_problem(data: object) -> str | None:
    """Why a query's `data` is not a vector or matrix result (None when it is)."""
    if not isinstance(data, dict):
        return f"data is {_kind(data)}, not an object with resultType and result"
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        return _sample_problem(result, "data.result")
    if kind not in ("vector", "matrix"):
        return f"data.resultType is {shown(kind) if isinstance(kind, str) else _kind(kind)}, not vector, matrix or scalar"
    if not isinstance(result, list):
        return f"data.result is {_kind(result)}, not a list" if "result" in data else "data has no result"
    for i, item in enumerate(result):
        where = f"data.result[{i}]"
        if not isinstance(item, dict):
            return f"{where} is {_kind(item)}, not an object"
        if "metric" in item and (why := _labels_problem(item["metric"], f"{where}.metric")):
            return why
        if kind == "vector":
            if "value" not in item:
                return f"{where} has no value"
            if why := _sample_problem(item["value"], f"{where}.value"):
                return why
            continue
        values = item.get("values")
        if not isinstance(values, list):
            return f"{where}.values is {_kind(values)}, not a list" if "values" in item else f"{where} has no values"
        j = _first_bad_pair(values)
        if j is not None:
            return _sample_problem(values[j], f"{where}.values[{j}]")
    return None


_NUMBER_TYPES = (int, float)


def _first_bad_pair(values: list) -> int | None:
    """The index of the first sample of a range result that is not a [time, value] pair of numbers
    (as _sample_problem judges), else None. One tight pass: a fleet's range answers hold hundreds of
    thousands of samples, and a location string built per sample cost more than reading the JSON."""
    j = 0
    try:
        for j, pair in enumerate(values):  # noqa: B007 - j is the answer when a check fails
            if type(pair) is not list or len(pair) != 2:
                return j
            t, v = pair
            for x in (t, v):
                kind = type(x)
                if kind is str:
                    float(x)
                elif kind not in _NUMBER_TYPES:  # bool, None, lists: no number (bool is not int here)
                    return j
    except ValueError:
        return j
    return None


def _alerts_problem(data: object) -> str | None:
    if not isinstance(data, dict):
        return f"data is {_kind(data)}, not an object with alerts"
    alerts = data.get("alerts", [])
    if not isinstance(alerts, list):
        return f"data.alerts is {_kind(alerts)}, not a list"
    for i, a in enumerate(alerts):
        where = f"data.alerts[{i}]"
        if not isinstance(a, dict):
            return f"{where} is {_kind(a)}, not an object"
        for part in ("labels", "annotations"):
            if part in a and (why := _labels_problem(a[part], f"{where}.{part}")):
                return why
        for field in ("activeAt", "state"):
            if field in a and not isinstance(a[field], str):
                return f"{where}.{field} is {_kind(a[field])}, not a string"
    return None


def checked_data(path: str, data: Any) -> tuple[Any, str | None]:
    """The `data` of a success answer to `path`, as its readers take it, and why it is not the
    shape that path promises (None when it is). A scalar result is read as one sample without
    labels; a null list of series or label values as none. Paths no reader looks into pass as they are."""
    if path in ("/api/v1/query", "/api/v1/query_range"):
        why = _result_problem(data)
        if why is None and data["resultType"] == "scalar":
            data = {"resultType": "vector", "result": [{"metric": {}, "value": data["result"]}]}
        return data, why
    if path == "/api/v1/series":
        if data is None:
            return [], None
        if not isinstance(data, list):
            return data, f"data is {_kind(data)}, not a list of label sets"
        return data, next((w for i, m in enumerate(data) if (w := _labels_problem(m, f"data[{i}]"))), None)
    if _LABEL_VALUES.fullmatch(path):
        if data is None:
            return [], None
        if not isinstance(data, list):
            return data, f"data is {_kind(data)}, not a list of label values"
        bad = next((i for i, v in enumerate(data) if not isinstance(v, str)), None)
        return data, None if bad is None else f"data[{bad}] is {_kind(data[bad])}, not a string"
    if path == "/api/v1/alerts":
        return data, _alerts_problem(data)
    return data, None


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
        except ValueError as e:  # it reached the server: what came back is not an API answer
            said = str(e)
            what = (f"something that is not JSON ({said.removeprefix('it is not JSON (').removesuffix(')')}"
                    if said.startswith("it is not JSON (") else f"JSON it cannot read ({said}")
            raise PrometheusUnavailableError(
                f"Prometheus at {self.url} answered {path} with {what}; first bytes: {_first_bytes(r.body)}).",
                hint=NOT_PROMETHEUS_HINT,
            ) from None
        if not isinstance(body, dict):
            raise self._not_api(path, f"the answer is {_kind(body)}, not an object with status and data")
        if body.get("status") == "error":
            raise PrometheusUnavailableError(
                f"Prometheus at {self.url} answered an error: {shown(body.get('error'), 200, quote=False)}.", hint="Check its logs.")
        if body.get("status") != "success":
            raise self._not_api(path, f"its status is {shown(body.get('status'))}, not 'success' or 'error'")
        if "data" not in body:
            raise self._not_api(path, "it has no data")
        data, why = checked_data(path, body["data"])
        if why is not None:
            raise self._not_api(path, why)
        return data

    def _not_api(self, path: str, why: str) -> PrometheusUnavailableError:
        return PrometheusUnavailableError(
            f"Prometheus at {self.url} answered {path} with JSON that is not a Prometheus API response ({why}).",
            hint=NOT_PROMETHEUS_HINT,
        )

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
