"""The outbound HTTP seam against real local servers: each bound (time, memory, retries) holds, and
every transport failure is one sentence with exit 3 (a bad URL: exit 2)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from testlib import free_port

from gpulens import http_client
from gpulens.errors import EXIT_BAD_INPUT, EXIT_UNAVAILABLE, BadInputError, UnavailableError


class Server:
    """A local HTTP server whose handler is `behaviour(handler)`; it counts the requests it got."""

    def __init__(self, behaviour):  # noqa: ANN001
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # noqa: ANN002
                pass

            def _any(self) -> None:
                server.requests.append((self.command, self.rfile.read(int(self.headers.get("Content-Length") or 0))))
                try:
                    behaviour(self, len(server.requests))
                except OSError:
                    pass  # the client cut it: what the test is about

            do_GET = do_POST = _any

        self.requests: list[tuple[str, bytes]] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/x"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers: list[Server] = []

    def make(behaviour) -> Server:  # noqa: ANN001
        servers.append(Server(behaviour))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def answer(h: BaseHTTPRequestHandler, status: int = 200, body: bytes = b"ok") -> None:
    h.send_response(status)
    h.send_header("Content-Length", str(len(body)))
    h.send_header("X-Test", "yes")
    h.end_headers()
    h.wfile.write(body)


def test_a_typed_response_of_any_status(serve):
    s = serve(lambda h, n: answer(h, 404, b'{"error": "no"}'))
    r = http_client.get(s.url, timeout_seconds=5, params={"q": "up{a=\"b\"}"})
    assert (r.status, r.ok, r.headers["x-test"], r.json()) == (404, False, "yes", {"error": "no"})
    assert r.elapsed_seconds > 0 and not r.truncated and r.url.endswith("?q=up%7Ba%3D%22b%22%7D")


def test_a_slow_server_is_cut_at_the_timeout(serve):
    s = serve(lambda h, n: (time.sleep(60), answer(h)))  # far past any bound below: a wait, not a cut, fails
    started = time.monotonic()
    with pytest.raises(UnavailableError, match="within 0.3 s") as e:
        http_client.get(s.url, timeout_seconds=0.3)
    assert time.monotonic() - started < 20 and e.value.exit_code == EXIT_UNAVAILABLE and s.url in str(e.value)


def test_a_trickling_body_is_cut_at_the_deadline_not_per_read(serve):
    def trickle(h: BaseHTTPRequestHandler, n: int) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "100")
        h.end_headers()
        for _ in range(600):  # 60 s: the client's cut ends it at its next write
            h.wfile.write(b"x")
            h.wfile.flush()
            time.sleep(0.1)

    s = serve(trickle)
    started = time.monotonic()
    with pytest.raises(UnavailableError, match="no complete answer within 0.5 s"):
        http_client.get(s.url, timeout_seconds=0.5)
    assert time.monotonic() - started < 20  # reading per byte would take the whole 60 s


def test_a_refused_port_is_unavailable_exit_3():
    url = f"http://127.0.0.1:{free_port()}/metrics"
    with pytest.raises(UnavailableError) as e:
        http_client.get(url, timeout_seconds=2)
    assert e.value.exit_code == EXIT_UNAVAILABLE
    assert str(e.value).startswith(f"Cannot reach {url}: the connection was refused") and e.value.hint


def test_a_500_then_200_is_retried_for_get_not_for_a_post(serve):
    statuses = [500, 200, 500, 500, 200]  # the status of each request, in order
    s = serve(lambda h, n: answer(h, statuses[n - 1]))
    r = http_client.get(s.url, timeout_seconds=5, retries=2, backoff_seconds=0.01)
    assert r.status == 200 and len(s.requests) == 2
    r = http_client.post(s.url, timeout_seconds=5, json_body={"a": 1}, retries=2, backoff_seconds=0.01)
    assert r.status == 500 and len(s.requests) == 3  # not idempotent: sent once, the 500 is the answer
    assert s.requests[-1] == ("POST", b'{"a": 1}')
    r = http_client.post(s.url, timeout_seconds=5, body=b"same", idempotent=True, retries=2, backoff_seconds=0.01)
    assert r.status == 200 and len(s.requests) == 5  # the caller said so: retried


def test_retries_stop_at_the_total_deadline(serve):
    s = serve(lambda h, n: answer(h, 503))
    started = time.monotonic()
    r = http_client.get(s.url, timeout_seconds=5, retries=50, backoff_seconds=0.1, deadline_seconds=0.5)
    # without the deadline, 50 retries' doubling backoff would sleep for years; 20 s leaves a loaded machine room
    assert r.status == 503 and time.monotonic() - started < 20 and 2 <= len(s.requests) < 10


def test_an_endless_body_is_refused_or_truncated_never_read_whole(serve):
    def endless(h: BaseHTTPRequestHandler, n: int) -> None:
        h.send_response(200)
        h.send_header("Connection", "close")  # no length: the body ends when the server closes
        h.end_headers()
        chunk = b"x" * 65536
        while True:
            h.wfile.write(chunk)

    s = serve(endless)
    with pytest.raises(UnavailableError, match="larger than 1048576 bytes"):
        http_client.get(s.url, timeout_seconds=5, retries=3, max_bytes=2**20)
    assert len(s.requests) == 1  # another attempt would get the same
    r = http_client.get(s.url, timeout_seconds=5, max_bytes=2**20, over_limit="truncate")
    assert r.status == 200 and r.truncated and len(r.body) == 2**20


def test_a_body_shorter_than_its_length_is_unavailable(serve):
    def short(h: BaseHTTPRequestHandler, n: int) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "100")
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(b"short")
        h.close_connection = True

    s = serve(short)
    with pytest.raises(UnavailableError, match="ended after 5 of its 100 bytes"):
        http_client.get(s.url, timeout_seconds=5)


@pytest.mark.parametrize("url", ["127.0.0.1:9090", "ftp://127.0.0.1/x", "http://127.0.0.1:notaport/x", "http:///x", "http://[::1/x"])
def test_a_bad_url_is_bad_input_exit_2(url):
    with pytest.raises(BadInputError, match="Cannot read the URL") as e:
        http_client.get(url, timeout_seconds=1)
    assert e.value.exit_code == EXIT_BAD_INPUT


def test_cancel_cuts_a_call_under_way_from_another_thread(serve):
    s = serve(lambda h, n: (time.sleep(60), answer(h)))
    cancel = http_client.Cancel()
    threading.Timer(0.2, cancel.set).start()
    started = time.monotonic()
    with pytest.raises(UnavailableError, match="cancelled"):
        http_client.post(s.url, timeout_seconds=30, body=b"{}", cancel=cancel)
    assert time.monotonic() - started < 20  # the call's own timeout (30 s) or the answer (60 s) would be later
    with pytest.raises(UnavailableError, match="cancelled"):  # and later calls fail at once
        http_client.get(s.url, timeout_seconds=5, cancel=cancel)


def test_a_post_does_not_follow_a_redirect_and_max_bytes_zero_reads_only_the_status(serve):
    def redirect(h: BaseHTTPRequestHandler, n: int) -> None:
        h.send_response(302)
        h.send_header("Location", "/elsewhere")
        h.send_header("Content-Length", "0")
        h.end_headers()

    s = serve(redirect)
    assert http_client.post(s.url, timeout_seconds=5, body=b"x").status == 302
    assert http_client.get(s.url, timeout_seconds=5, follow_redirects=False, max_bytes=0).status == 302
    assert len(s.requests) == 2
