"""A server at --prometheus that answers, but not as Prometheus does (JSON of another shape, or not
JSON at all): one sentence naming the server, the API path and what is wrong, exit 3, never a
traceback from deep inside a reader. Real local HTTP servers, no mocks."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpulens.errors import EXIT_UNAVAILABLE
from gpulens.reader.prometheus import PrometheusAnalysisReader
from gpulens.reader.prometheus_api import PrometheusApi, PrometheusUnavailableError
from gpulens.views.prometheus import PrometheusReader

BUILDINFO = {"status": "success", "data": {"version": "2.53.0"}}
SERIES = {"status": "success", "data": [{"__name__": "gpu_up", "gpu": "0", "host": "n1", "service": "chat"}]}
LABEL_VALUES = {"status": "success", "data": ["0"]}


def ok(data: object) -> bytes:
    return json.dumps({"status": "success", "data": data}).encode()


class Prometheus:
    """A local HTTP server answering each API path with the bytes `answers` gives for it (a path it
    does not name: the answer `other`, else what a real Prometheus answers there)."""

    def __init__(self, answers: dict[str, bytes], other: bytes | None = None):
        def answer_for(path: str) -> bytes:
            if path in answers:
                return answers[path]
            if other is not None:
                return other
            if path.startswith("/api/v1/label/"):
                return json.dumps(LABEL_VALUES).encode()
            return json.dumps({"/api/v1/status/buildinfo": BUILDINFO, "/api/v1/series": SERIES}.get(
                path, {"status": "success", "data": {"resultType": "vector", "result": []}})).encode()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # noqa: ANN002
                pass

            def do_GET(self) -> None:  # noqa: N802
                body = answer_for(urllib.parse.urlsplit(self.path).path)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def prometheus():
    servers: list[Prometheus] = []

    def make(answers: dict[str, bytes], other: bytes | None = None) -> Prometheus:
        servers.append(Prometheus(answers, other))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


NOT_API = "with JSON that is not a Prometheus API response"
QUERY_SHAPES = [
    (ok([1, 2, 3]), "(data is a list, not an object with resultType and result)"),
    (ok({"resultType": "vector", "result": "nope"}), "(data.result is the string 'nope', not a list)"),
    (ok({"resultType": "vector", "result": [1, 2]}), "(data.result[0] is the number 1, not an object)"),
    (ok({"resultType": "vector", "result": [{"metric": {}, "value": "x"}]}),
     "(data.result[0].value is the string 'x', not a [time, value] pair of numbers)"),
    (ok({"resultType": "vector", "result": [{"metric": {}, "value": [1.5, "x"]}]}),
     "(data.result[0].value is [1.5, 'x'], not a [time, value] pair of numbers)"),
    (ok({"resultType": "vector", "result": [{"metric": {}}]}), "(data.result[0] has no value)"),
    (ok({"resultType": "vector", "result": [{"metric": 7, "value": [1, "1"]}]}),
     "(data.result[0].metric is the number 7, not an object of labels)"),
    (ok({"resultType": "vector", "result": [{"metric": {"gpu": 0}, "value": [1, "1"]}]}),
     "(data.result[0].metric.gpu is the number 0, not a string)"),
    (ok({"resultType": "matrix", "result": [{"metric": {}, "values": [[1, "2"], [2, None]]}]}),
     "(data.result[0].values[1] is [2, None], not a [time, value] pair of numbers)"),
    (ok({"resultType": "matrix", "result": [{"metric": {}, "values": {}}]}),
     "(data.result[0].values is an object, not a list)"),
    (ok({"resultType": "streams", "result": []}), "(data.resultType is 'streams', not vector, matrix or scalar)"),
    (ok({"result": []}), "(data.resultType is null, not vector, matrix or scalar)"),
    (b'{"status": "success"}', "(it has no data)"),
    (b'{"status": "maybe", "data": {}}', "(its status is 'maybe', not 'success' or 'error')"),
    (b"[1, 2]", "(the answer is a list, not an object with status and data)"),
]


@pytest.mark.parametrize(("body", "why"), QUERY_SHAPES, ids=[w for _, w in QUERY_SHAPES])
def test_a_query_answer_of_another_shape_is_one_sentence(prometheus, body, why):
    server = prometheus({"/api/v1/query": body})
    with pytest.raises(PrometheusUnavailableError) as e:
        PrometheusApi(server.url).instant("gpu_up", 1000.0)
    assert e.value.exit_code == EXIT_UNAVAILABLE
    assert str(e.value).startswith(f"Prometheus at {server.url} answered /api/v1/query with JSON that is not a "
                                   f"Prometheus API response {why}. Check that --prometheus points at Prometheus itself"), str(e.value)


OTHER_PATHS = [
    ("/api/v1/series", ok({"a": 1}), "(data is an object, not a list of label sets)"),
    ("/api/v1/series", ok([{"gpu": "0"}, "gpu_up"]), "(data[1] is the string 'gpu_up', not an object of labels)"),
    ("/api/v1/label/gpu/values", ok("0,1"), "(data is the string '0,1', not a list of label values)"),
    ("/api/v1/label/gpu/values", ok(["0", 1]), "(data[1] is the number 1, not a string)"),
    ("/api/v1/alerts", ok([]), "(data is a list, not an object with alerts)"),
    ("/api/v1/alerts", ok({"alerts": [{"labels": {}, "activeAt": 5}]}), "(data.alerts[0].activeAt is the number 5, not a string)"),
]


@pytest.mark.parametrize(("path", "body", "why"), OTHER_PATHS, ids=[f"{p} {w}" for p, _, w in OTHER_PATHS])
def test_series_label_values_and_alerts_of_another_shape(prometheus, path, body, why):
    server = prometheus({path: body})
    reader = PrometheusReader(server.url)
    read = {"/api/v1/series": lambda: PrometheusAnalysisReader(server.url, start=0, end=10).series_labels("gpu_up"),
            "/api/v1/label/gpu/values": reader.label_values,
            "/api/v1/alerts": lambda: reader.alerts(0, 10)}[path]
    with pytest.raises(PrometheusUnavailableError, match=r"^Prometheus at .* answered " + path + " with JSON that is not a "
                       r"Prometheus API response " + why.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        read()


def test_what_prometheus_may_answer_is_still_read(prometheus):
    """The check refuses only what no caller can read: a scalar is one sample without labels, a null
    list no series, NaN and +Inf values numbers, and a path no reader looks into passes as it is."""
    server = prometheus({
        "/api/v1/query": ok({"resultType": "scalar", "result": [1000, "NaN"]}),
        "/api/v1/query_range": ok({"resultType": "matrix", "result": [{"metric": {"gpu": "0"}, "values": [[1, "+Inf"], [2, "3"]]}]}),
        "/api/v1/series": ok(None),
        "/api/v1/label/gpu/values": ok(None),
        "/api/v1/status/buildinfo": ok([1, 2, 3]),
    })
    api = PrometheusApi(server.url)
    assert api.instant("scalar(gpu_up)", 1000.0) == [{"metric": {}, "value": [1000, "NaN"]}]
    assert api.range("gpu_up", 1, 2, 1) == [{"metric": {"gpu": "0"}, "values": [[1, "+Inf"], [2, "3"]]}]
    assert PrometheusAnalysisReader(server.url, start=0, end=10).series_labels("gpu_up") == []
    assert api.label_values("gpu") == []
    api.check()


@pytest.mark.parametrize(("body", "said"), [
    (b"<html><body>Grafana login</body></html>",
     "with something that is not JSON (Expecting value at line 1, column 1; first bytes: '<html><body>Grafana login</body></html>')."),
    (b"", "with something that is not JSON (Expecting value at line 1, column 1; first bytes: none, the answer is empty)."),
    (b'{"status": "success", "data": NaN}', "with JSON it cannot read (it holds NaN at line 1, column 31"),
])
def test_an_answer_that_is_not_json_says_it_was_reached(prometheus, body, said):
    server = prometheus({}, other=body)
    with pytest.raises(PrometheusUnavailableError) as e:
        PrometheusApi(server.url).check()
    assert str(e.value).startswith(f"Prometheus at {server.url} answered /api/v1/status/buildinfo {said}"), str(e.value)
    assert "Cannot reach" not in str(e.value)


def gpulens(*args: str, cwd) -> subprocess.CompletedProcess:  # noqa: ANN001
    return subprocess.run([sys.executable, "-m", "gpulens", *args], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize("command", [["diagnose"], ["energy"], ["scale"], ["report", "-o", "r.html"]], ids=lambda c: c[0])
def test_every_prometheus_command_refuses_with_exit_3(prometheus, tmp_path, command):
    bad = ok({"resultType": "vector", "result": "nope"})
    server = prometheus({"/api/v1/query": bad, "/api/v1/query_range": bad})
    p = gpulens(*command, "--prometheus", server.url, cwd=tmp_path)
    assert p.returncode == EXIT_UNAVAILABLE, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and p.stderr.startswith("error: "), p.stderr
    assert f"Prometheus at {server.url} answered /api/v1/query" in p.stderr and "data.result is the string 'nope'" in p.stderr, p.stderr
    assert not (tmp_path / "r.html").exists()


def test_every_path_answering_a_list_is_refused_at_the_first_read(prometheus, tmp_path):
    """The case as reported: a server answering {"status":"success","data":[1,2,3]} everywhere."""
    server = prometheus({}, other=ok([1, 2, 3]))
    p = gpulens("diagnose", "--prometheus", server.url, cwd=tmp_path)
    assert p.returncode == EXIT_UNAVAILABLE and "Traceback" not in p.stderr, (p.returncode, p.stderr)
    assert NOT_API in p.stderr and "Cannot reach" not in p.stderr, p.stderr
