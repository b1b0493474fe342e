"""The agent's listen address as an operator meets it (issue 24, item 6): /health and /ready beside
/metrics, TLS and basic auth from the exporter-toolkit web-config file, and IPv6. Real clients
(urllib and curl over TLS with certificates generated here), a real store made unwritable, and a
backend that really hangs."""

from __future__ import annotations

import base64
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest
from testlib import free_port, import_or_skip, wait_until
from tlslib import bcrypt_hash, make_certs

from gpulens.errors import BadInputError, PortInUseError
from gpulens.gpu import FakeBackend
from gpulens.pipeline import NodeConfig, build_node
from gpulens.store import Store
from gpulens.webconfig import load_web_config


def _get(url: str, *, context: ssl.SSLContext | None = None, auth: tuple[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url)
    if auth is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _node(tmp_path, **kw):  # noqa: ANN001, ANN003, ANN202
    kw.setdefault("listen", ("127.0.0.1", free_port()))
    kw.setdefault("store_path", None)
    return build_node(NodeConfig(backend=kw.pop("backend", None) or FakeBackend(gpus=1), alerts=None, colocation=False, **kw))


def _base(node) -> str:  # noqa: ANN001
    return node.metrics_url.removesuffix("/metrics")


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def _free_port_v6() -> int:
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))
        return s.getsockname()[1]


needs_ipv6 = pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")


# --- /health and /ready -------------------------------------------------------------------------


def test_health_answers_and_ready_waits_for_the_first_frame(tmp_path):
    node = _node(tmp_path)
    try:
        assert _get(_base(node) + "/health") == (200, "ok\n")
        status, text = _get(_base(node) + "/ready")
        assert status == 503 and text.strip() == "The sampling loop has not produced a frame yet."
        node.loop.tick()
        assert _get(_base(node) + "/ready") == (200, "ready\n")
        assert _get(_base(node) + "/metrics")[0] == 200
    finally:
        node.close()


def test_other_methods_and_paths_are_refused_in_one_line_of_text(tmp_path):
    """A POST is a method the agent knows and refuses (405 with Allow), not one it has never heard
    of (http.server's 501); errors are one line of text like the answers, not an HTML page."""
    node = _node(tmp_path)
    try:
        for method in ("POST", "PUT", "DELETE"):
            req = urllib.request.Request(node.metrics_url, data=b"x" if method != "DELETE" else None, method=method)
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=10)
            assert e.value.code == 405, method
            assert e.value.headers["Allow"] == "GET, HEAD"
            assert e.value.headers["Content-Type"].startswith("text/plain")
            assert e.value.read().decode() == "405 Method Not Allowed: this address answers GET, HEAD.\n"
        status, text = _get(_base(node) + "/nowhere")
        assert (status, text) == (404, "404 Not Found: gpulens serves /metrics, /health and /ready.\n")
        assert len(text.strip().splitlines()) == 1
    finally:
        node.close()


class HangingBackend(FakeBackend):
    """A fake GPU whose sampling call hangs while `hang` is set, as a stuck NVML call does."""

    def __init__(self) -> None:
        super().__init__(gpus=1)
        self.hang = threading.Event()
        self.release = threading.Event()

    def sample(self):  # noqa: ANN201
        if self.hang.is_set():
            self.release.wait()
        return super().sample()


def _run_in_thread(node) -> threading.Thread:  # noqa: ANN001
    t = threading.Thread(target=node.run, daemon=True)
    t.start()
    return t


def test_ready_turns_503_while_the_loop_stalls_and_back_when_it_samples_again(tmp_path):
    be = HangingBackend()
    node = _node(tmp_path, backend=be, interval_seconds=0.02, ready_stale_seconds=0.3)
    thread = _run_in_thread(node)
    ready = _base(node) + "/ready"
    try:
        wait_until(lambda: _get(ready)[0] == 200, what="/ready after the first frames")
        be.hang.set()
        status, text = wait_until(lambda: (r := _get(ready))[0] == 503 and r, what="/ready to notice the stall")
        assert "has produced no frame for" in text and "the GPU backend may be hung" in text
        assert _get(_base(node) + "/health")[0] == 200  # alive: a restart would not cure a hung driver
        be.hang.clear()
        be.release.set()
        wait_until(lambda: _get(ready)[0] == 200, what="/ready once the loop samples again")
    finally:
        be.hang.clear()
        be.release.set()
        node.stop()
        thread.join(10)
        node.close()


def _limit_pages(store: Store, full: bool) -> None:
    """Make the store's file unable to grow (SQLite's page limit), as tests/reliability/test_disk_full.py does."""
    with store._guard("limit") as conn:
        if full:
            conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0]}")
        else:
            conn.execute("PRAGMA max_page_count = 1073741823")


def test_ready_turns_503_while_the_store_cannot_be_written(tmp_path):
    node = _node(tmp_path, backend=FakeBackend(gpus=2), store_path=tmp_path / "g.db", interval_seconds=0.02,
                 flush_seconds=0.02, evaluate_seconds=0.02)
    thread = _run_in_thread(node)
    ready = _base(node) + "/ready"
    try:
        wait_until(lambda: _get(ready)[0] == 200, what="/ready")
        _limit_pages(node.store, True)
        status, text = wait_until(lambda: (r := _get(ready))[0] == 503 and r, what="/ready to see the full store")
        assert text.startswith("The store cannot be written:") and text.count("\n") == 1
        assert _get(_base(node) + "/metrics")[0] == 200  # /metrics goes on serving
        _limit_pages(node.store, False)
        wait_until(lambda: _get(ready)[0] == 200, timeout=30, what="/ready once the store takes writes again")
    finally:
        node.stop()
        thread.join(10)
        node.close()


# --- TLS and basic auth from the web-config file ---------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def _client_ctx(certs, with_client_cert: bool = False) -> ssl.SSLContext:  # noqa: ANN001
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    if with_client_cert:
        ctx.load_cert_chain(certs.client_cert, certs.client_key)
    return ctx


def _web_config(tmp_path, text: str):  # noqa: ANN001, ANN202
    path = tmp_path / "web.yml"
    path.write_text(text)
    return load_web_config(path)


def test_metrics_over_tls_with_a_generated_certificate(tmp_path, certs):
    wc = _web_config(tmp_path, f"tls_server_config:\n  cert_file: {certs.server_cert}\n  key_file: {certs.server_key}\n")
    node = _node(tmp_path, web_config=wc)
    try:
        node.loop.tick()
        url = node.metrics_url
        assert url.startswith("https://127.0.0.1:")
        status, body = _get(url, context=_client_ctx(certs))
        assert status == 200 and "gpu_up" in body
        assert _get(_base(node) + "/ready", context=_client_ctx(certs)) == (200, "ready\n")
        with pytest.raises(urllib.error.URLError):  # a client that does not trust the CA is refused
            _get(url, context=ssl.create_default_context())
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP gets no answer
            _get(url.replace("https://", "http://"))
        curl = shutil.which("curl")
        if curl:  # a second real client: curl's TLS stack, verifying the certificate too
            done = subprocess.run([curl, "-sS", "--cacert", str(certs.ca), url], capture_output=True, text=True, timeout=30)
            assert done.returncode == 0 and "gpu_up" in done.stdout
    finally:
        node.close()


def test_mutual_tls_requires_a_client_certificate_signed_by_the_client_ca(tmp_path, certs):
    wc = _web_config(tmp_path, (
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"  # relative to the file, as in the toolkit
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"))
    for p in (certs.server_cert, certs.server_key, certs.ca):
        shutil.copy(p, tmp_path / p.name)
    node = _node(tmp_path, web_config=wc)
    try:
        assert _get(node.metrics_url, context=_client_ctx(certs, with_client_cert=True))[0] == 200
        with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)):
            _get(node.metrics_url, context=_client_ctx(certs))
    finally:
        node.close()


def test_basic_auth_right_wrong_and_missing(tmp_path):
    import_or_skip("bcrypt", "basic auth checks bcrypt hashes (the auth extra)")
    wc = _web_config(tmp_path, f"basic_auth_users:\n  prometheus: '{bcrypt_hash('s3cret-scrape')}'\n")
    node = _node(tmp_path, web_config=wc)
    try:
        node.loop.tick()
        assert _get(node.metrics_url, auth=("prometheus", "s3cret-scrape"))[0] == 200
        assert _get(node.metrics_url, auth=("prometheus", "s3cret-scrape"))[0] == 200  # the remembered check
        assert _get(node.metrics_url, auth=("prometheus", "wrong"))[0] == 401
        assert _get(node.metrics_url, auth=("nobody", "s3cret-scrape"))[0] == 401
        assert _get(node.metrics_url)[0] == 401
        assert _get(_base(node) + "/health")[0] == 200  # probes carry no credentials
        assert _get(_base(node) + "/ready")[0] == 200
    finally:
        node.close()


def test_tls_and_basic_auth_together_with_curl(tmp_path, certs):
    import_or_skip("bcrypt", "basic auth checks bcrypt hashes (the auth extra)")
    curl = shutil.which("curl") or pytest.skip("curl is not installed")
    wc = _web_config(tmp_path, f"tls_server_config:\n  cert_file: {certs.server_cert}\n  key_file: {certs.server_key}\n"
                               f"basic_auth_users:\n  scraper: '{bcrypt_hash('pw-1234')}'\n")
    node = _node(tmp_path, web_config=wc)
    try:
        node.loop.tick()

        def curl_code(*extra: str) -> str:
            return subprocess.run([curl, "-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", str(certs.ca), *extra,
                                   node.metrics_url], capture_output=True, text=True, timeout=30).stdout

        assert curl_code("-u", "scraper:pw-1234") == "200"
        assert curl_code("-u", "scraper:nope") == "401"
        assert curl_code() == "401"
    finally:
        node.close()


# --- IPv6 and listen errors ------------------------------------------------------------------------


@needs_ipv6
def test_metrics_on_the_ipv6_loopback(tmp_path):
    node = _node(tmp_path, listen=("::1", _free_port_v6()))
    try:
        node.loop.tick()
        assert node.metrics_url.startswith("http://[::1]:")
        status, body = _get(node.metrics_url)
        assert status == 200 and "gpu_up" in body
    finally:
        node.close()


@needs_ipv6
def test_the_agent_command_listens_on_ipv6_with_tls(tmp_path, certs):
    port = _free_port_v6()
    (tmp_path / "web.yml").write_text(f"tls_server_config:\n  cert_file: {certs.server_cert}\n  key_file: {certs.server_key}\n")
    proc = subprocess.Popen([sys.executable, "-m", "gpulens", "agent", "--backend", "fake", "--store", str(tmp_path / "s.db"),
                             "--listen", f"[::1]:{port}", "--web-config", str(tmp_path / "web.yml"), "--interval", "100ms"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def up():  # noqa: ANN202
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                return _get(f"https://[::1]:{port}/ready", context=_client_ctx(certs))[0] == 200
            except (urllib.error.URLError, ConnectionError):
                return False

        wait_until(up, timeout=60, what="the agent's /ready on [::1] over TLS", interval=0.2)
        assert "gpu_up" in _get(f"https://[::1]:{port}/metrics", context=_client_ctx(certs))[1]
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_a_taken_port_and_a_foreign_address_are_different_sentences(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        with pytest.raises(PortInUseError, match="already in use"):
            _node(tmp_path, listen=("127.0.0.1", holder.getsockname()[1]))
    with pytest.raises(BadInputError, match="Cannot listen on 192.0.2.1:") as e:  # TEST-NET-1: not this machine's
        _node(tmp_path, listen=("192.0.2.1", free_port()))
    assert not isinstance(e.value, PortInUseError) and "already in use" not in str(e.value)
