"""Safety: read-only, token, Host allow-list, static files confined to their folder, loopback default."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402
from testlib import wait_http  # noqa: E402

from gpulens.errors import PortInUseError  # noqa: E402
from gpulens.web import create_app  # noqa: E402
from gpulens.web.server import bind, plan_listen  # noqa: E402

TOKEN = "s3cret-token-for-tests"


@pytest.fixture(scope="module")
def open_client(replayed_store: Path):
    with TestClient(create_app(store_path=replayed_store)) as c:
        yield c


@pytest.fixture(scope="module")
def locked_client(replayed_store: Path):
    with TestClient(create_app(store_path=replayed_store, token=TOKEN)) as c:
        yield c


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_read_only(open_client, method):
    r = open_client.request(method, "/api/meta")
    assert r.status_code == 405 and "read-only" in r.text


def test_the_store_is_not_modified(replayed_store, open_client):
    before = replayed_store.stat().st_mtime_ns, replayed_store.stat().st_size
    for path in ("/api/meta", "/api/panel/gpu", "/api/findings", "/api/events", "/api/alerts"):
        assert open_client.get(path).status_code == 200
    assert (replayed_store.stat().st_mtime_ns, replayed_store.stat().st_size) == before


@pytest.mark.parametrize(
    "path",
    [
        "/static/../app.py",
        "/static/%2e%2e/app.py",
        "/static/..%2fapp.py",
        "/static/%2e%2e%2f%2e%2e%2fstore%2fstore.py",
        "/static//etc/passwd",
        "/static/vendor/../../server.py",
    ],
)
def test_static_files_stay_in_their_folder(open_client, path):
    r = open_client.get(path)
    assert r.status_code == 404
    assert "def " not in r.text and "root:" not in r.text


def test_static_assets_are_served(open_client):
    assert open_client.get("/static/vendor/uplot/uPlot.iife.min.js").status_code == 200
    page = open_client.get("/")
    assert page.status_code == 200 and "uPlot.iife.min.js" in page.text
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp
    assert page.headers["x-content-type-options"] == "nosniff"


def test_token_is_required_when_set(locked_client):
    r = locked_client.get("/api/meta")
    assert r.status_code == 401 and "token" in r.json()["error"]
    assert locked_client.get("/").status_code == 401
    assert locked_client.get("/api/meta", headers={"Authorization": "Bearer wrong-token"}).status_code == 401
    assert locked_client.get("/api/meta", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_token_in_the_address_becomes_a_cookie(replayed_store):
    with TestClient(create_app(store_path=replayed_store, token=TOKEN)) as c:
        r = c.get(f"/?token={TOKEN}", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/"
        assert "httponly" in r.headers["set-cookie"].lower()
        assert c.get("/api/meta").status_code == 200  # the cookie now carries it


def test_unknown_host_header_is_refused(replayed_store):
    app = create_app(store_path=replayed_store, allowed_hosts=["127.0.0.1", "localhost"])
    with TestClient(app, base_url="http://127.0.0.1:8642") as c:
        assert c.get("/api/health").status_code == 200
        assert c.get("/api/health", headers={"Host": "evil.example:8642"}).status_code == 400


def test_loopback_needs_no_token_and_other_addresses_get_one():
    assert plan_listen("127.0.0.1", 8642).token is None
    assert plan_listen("::1", 8642).token is None
    plan = plan_listen("0.0.0.0", 8642)
    assert plan.token_generated and len(plan.token) >= 24
    assert plan_listen("0.0.0.0", 8642, token="given-token").token == "given-token"
    assert plan_listen("0.0.0.0", 8642).token != plan.token  # random each time


def test_port_in_use_is_one_sentence():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(PortInUseError, match="already in use"):
            bind("127.0.0.1", port)


def _start(args: list[str], env: dict | None = None) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulens.cli.main", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    line = proc.stdout.readline()
    return proc, line


def test_cli_serves_on_loopback_and_prints_the_address(replayed_store):
    proc, line = _start(["dashboard", "--store", str(replayed_store), "--listen", "127.0.0.1:0"])
    try:
        assert line.startswith("gpulens dashboard on http://127.0.0.1:"), line + proc.stderr.read()
        url = line.split()[3]
        wait_http(url + "api/health", proc, 60, interval=0.1)  # answers 2xx: urlopen raises on an error status
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def test_cli_on_all_interfaces_prints_a_generated_token(replayed_store):
    proc, line = _start(["dashboard", "--store", str(replayed_store), "--listen", "0.0.0.0:0"])
    try:
        assert "?token=" in line
        token_line = proc.stdout.readline()
        token = token_line.rsplit(" ", 1)[1].strip()
        url = line.split()[3]
        assert "needs this token" in token_line and url.endswith(f"?token={token}")
        port = url.split(":")[2].split("/")[0]
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=5)
        assert e.value.code == 401
        req = urllib.request.Request(f"http://127.0.0.1:{port}/api/health", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 200
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def test_cli_bad_input_exits_2(tmp_path):
    from gpulens.cli.main import main

    assert main(["dashboard", "--store", str(tmp_path / "missing.db")]) == 2
    assert main(["dashboard", "--store", "x.db", "--prometheus", "http://127.0.0.1:1"]) == 2
    assert main(["dashboard", "--store", str(tmp_path), "--listen", "nowhere:port"]) == 2
