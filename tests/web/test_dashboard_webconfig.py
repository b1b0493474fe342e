"""The dashboard behind the web-config file and on IPv6 (issue 24, item 6): `gpulens dashboard
--web-config` serves HTTPS with the file's certificate and asks for its basic-auth users; `--listen
'[::1]:PORT'` serves on the IPv6 loopback. Real processes, real clients (urllib, curl)."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

pytest.importorskip("starlette")
from testlib import import_or_skip, wait_until  # noqa: E402
from tlslib import bcrypt_hash, make_certs  # noqa: E402

from gpulens.store import Store  # noqa: E402


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def store_path(tmp_path):
    Store(tmp_path / "s.db").close()
    return tmp_path / "s.db"


def _start(args: list[str]) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "gpulens", "dashboard", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ})
    return proc, proc.stdout.readline()


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=20)


def _status(url: str, context: ssl.SSLContext | None = None, auth: str | None = None) -> int:
    req = urllib.request.Request(url)
    if auth is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _answering(url: str, proc: subprocess.Popen, **kw) -> int:  # noqa: ANN003
    def once() -> int | None:
        assert proc.poll() is None, proc.stderr.read()
        try:
            return _status(url, **kw)
        except (urllib.error.URLError, ConnectionError):
            return None

    return wait_until(once, timeout=30, what=url, interval=0.1)


def test_dashboard_over_tls_with_basic_auth(tmp_path, certs, store_path):
    import_or_skip("bcrypt", "basic auth checks bcrypt hashes (the auth extra)")
    (tmp_path / "web.yml").write_text(f"tls_server_config:\n  cert_file: {certs.server_cert}\n  key_file: {certs.server_key}\n"
                                      f"basic_auth_users:\n  ops: '{bcrypt_hash('dash-pw-1')}'\n")
    proc, line = _start(["--store", str(store_path), "--listen", "127.0.0.1:0", "--web-config", str(tmp_path / "web.yml")])
    try:
        assert line.startswith("gpulens dashboard on https://127.0.0.1:"), line + proc.stderr.read()
        base = line.split()[3]
        ctx = ssl.create_default_context(cafile=str(certs.ca))
        assert _answering(base + "api/health", proc, context=ctx, auth="ops:dash-pw-1") == 200
        assert _status(base + "api/health", context=ctx, auth="ops:wrong") == 401
        assert _status(base + "api/health", context=ctx) == 401
        curl = shutil.which("curl")
        if curl:
            out = subprocess.run([curl, "-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", str(certs.ca),
                                  "-u", "ops:dash-pw-1", base], capture_output=True, text=True, timeout=30).stdout
            assert out == "200"
    finally:
        _stop(proc)


def test_basic_auth_stands_in_for_the_token_beyond_loopback(tmp_path, store_path):
    import_or_skip("bcrypt", "basic auth checks bcrypt hashes (the auth extra)")
    (tmp_path / "web.yml").write_text(f"basic_auth_users:\n  ops: '{bcrypt_hash('dash-pw-2')}'\n")
    proc, line = _start(["--store", str(store_path), "--listen", "0.0.0.0:0", "--web-config", str(tmp_path / "web.yml")])
    try:
        assert "?token=" not in line, line
        port = line.split()[3].rsplit(":", 1)[1].strip("/")
        assert _answering(f"http://127.0.0.1:{port}/api/health", proc, auth="ops:dash-pw-2") == 200
        assert _status(f"http://127.0.0.1:{port}/api/health") == 401
    finally:
        _stop(proc)


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
def test_dashboard_on_the_ipv6_loopback(store_path):
    proc, line = _start(["--store", str(store_path), "--listen", "[::1]:0"])
    try:
        assert line.startswith("gpulens dashboard on http://[::1]:"), line + proc.stderr.read()
        assert _answering(line.split()[3] + "api/health", proc) == 200
    finally:
        _stop(proc)
