"""Credentials in a URL stay secret everywhere (issue 27): a password in the userinfo and a token in
the query, given to each URL-taking option, appear in no output, log line, stored row or written
file, in plain text or base64; and where gpulens sends the request, the userinfo arrives as
`Authorization: Basic`."""

from __future__ import annotations

import base64
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from testlib import free_port, wait_until

PASSWORD, TOKEN = "S3CRETpw", "T0KENsecret"
SECRETS = [PASSWORD, TOKEN, base64.b64encode(f"alice:{PASSWORD}".encode()).decode(),
           base64.b64encode(PASSWORD.encode()).decode().rstrip("=")]
EXPECTED_AUTH = "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()

_VECTOR = {"status": "success", "data": {"resultType": "vector", "result": []}}
_MATRIX = {"status": "success", "data": {"resultType": "matrix", "result": []}}
_COMPLETION = {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": "hi", "finish_reason": "length"}],
               "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
_METRICS = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 1\n"


class _Peer(BaseHTTPRequestHandler):
    """Answers like a serving engine, a Prometheus server and a webhook receiver at once."""

    seen: list[tuple[str, str | None]]

    def _answer(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        n = int(self.headers.get("Content-Length") or 0)
        sent = self.rfile.read(n) if n else b""
        path = self.path.split("?")[0]
        if path.startswith("/flaky") and sum(p.startswith("/flaky") for p, _ in self.seen) > 1:
            path = "/fail"  # answers its first request (the agent's check at start), then fails
        if path.startswith("/fail"):
            body, kind = b"no", "text/plain"
        elif path.endswith("/metrics"):
            body, kind = _METRICS, "text/plain; version=0.0.4"
        elif path == "/tokenize":  # vLLM's: a word a token
            body, kind = json.dumps({"count": len(json.loads(sent)["prompt"].split())}).encode(), "application/json"
        elif path.endswith("/query_range"):
            body, kind = json.dumps(_MATRIX).encode(), "application/json"
        elif "/api/v1/" in path:
            body, kind = json.dumps(_VECTOR if path.endswith("/query") else {"status": "success", "data": []}).encode(), "application/json"
        else:
            body, kind = json.dumps(_COMPLETION).encode(), "application/json"
        self.send_response(500 if path.startswith("/fail") else 200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:  # quiet
        pass


@pytest.fixture
def peer():
    seen: list[tuple[str, str | None]] = []
    handler = type("Peer", (_Peer,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://alice:{PASSWORD}@127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpulens.cli.main", "-v", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"}


def _get(url: str, headers: dict[str, str], timeout: float) -> tuple[int, str]:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as r:
        return r.status, r.read().decode("utf-8", "replace")


def _serve_and_read(argv: list[str], cwd: Path, port: int, paths: list[str], headers: dict[str, str] | None = None,
                    ready=lambda: True) -> str:  # noqa: ANN001
    """Start a serving command, read `paths` from it once it answers, stop it; its output and the pages."""
    proc = subprocess.Popen(argv, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pages = []
    try:
        def answers() -> bool:
            try:
                return _get(f"http://127.0.0.1:{port}{paths[0]}", headers or {}, 2)[0] == 200
            except OSError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                return False
        wait_until(lambda: answers() and ready(), timeout=30, what=f"{argv[3]} to answer")
        for p in paths:
            try:
                pages.append(_get(f"http://127.0.0.1:{port}{p}", headers or {}, 10)[1])
            except OSError as e:
                pages.append(str(e))
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    return out + "\n".join(pages)


def _store_text(db: Path) -> str:
    """Every text and blob value of every table of the store."""
    if not db.exists():
        return ""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        parts = []
        for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                parts += [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in row if isinstance(v, str | bytes)]
        return "\n".join(parts)
    finally:
        conn.close()


def _files_text(folder: Path) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in sorted(folder.rglob("*")) if p.is_file() and p.suffix != ".db")


def _assert_no_secret(text: str, what: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} appears in {what}:\n" + "\n".join(
            ln for ln in text.splitlines() if secret in ln)[:2000]


def _case_agent(base: str, tmp: Path, seen: list) -> str:
    port = free_port()

    def scraped_both() -> bool:  # a good scrape and a failed one (its error is logged with the URL)
        paths = [p for p, _ in seen]
        return any(p.startswith("/metrics") for p in paths) and sum(p.startswith("/flaky") for p in paths) > 1
    out = _serve_and_read(_cli("agent", "--backend", "fake", "--interval", "200ms", "--duration", "60s",
                                "--listen", f"127.0.0.1:{port}", "--store", str(tmp / "s.db"),
                                "--scrape", f"{base}/metrics?token={TOKEN}", "--scrape", f"{base}/flaky/metrics?token={TOKEN}",
                                "--notify", f"webhook:{base}/hook?token={TOKEN}"),
                           tmp, port, ["/metrics", "/health", "/ready"], ready=scraped_both)
    assert "scrape of http://***@127.0.0.1" in out, out  # the failure is logged, with the URL redacted
    return out


def _case_agent_otlp(base: str, tmp: Path, seen: list) -> str:
    """OTLP/HTTP push: the SDK's requests session turns the userinfo into Basic auth; the start
    line and every log show the endpoint redacted."""
    port = free_port()
    out = _serve_and_read(_cli("agent", "--backend", "fake", "--interval", "200ms", "--duration", "60s",
                                "--listen", f"127.0.0.1:{port}", "--store", str(tmp / "s.db"),
                                "--otlp", f"{base}/v1/metrics?token={TOKEN}", "--otlp-interval", "1s"),
                           tmp, port, ["/health"], ready=lambda: any(p.startswith("/v1/metrics") for p, _ in seen))
    assert "OTLP to http://***@127.0.0.1" in out, out  # the start line names the endpoint, redacted
    return out


def _case_replay(base: str, tmp: Path, seen: list) -> str:
    trace = Path(__file__).parents[2] / "src" / "gpulens" / "data" / "h200-trace"
    rules = tmp / "rules.yml"  # an alert that fires at once, so the webhook is called
    rules.write_text("rules:\n  - name: Warm\n    expr: gpu_temperature_celsius > 0\n    for: 0s\n    severity: info\n")
    r = subprocess.run(_cli("replay", str(trace), "--store", str(tmp / "s.db"), "--rules", str(rules),
                            "--notify", f"webhook:{base}/hook?token={TOKEN}"),
                       cwd=tmp, env=_env(), capture_output=True, text=True, timeout=120)
    return r.stdout + r.stderr


def _case_diagnose(base: str, tmp: Path, seen: list) -> str:
    r = subprocess.run(_cli("diagnose", "--prometheus", f"{base}/?token={TOKEN}", "--window", "10m"),
                       cwd=tmp, env=_env(), capture_output=True, text=True, timeout=120)
    assert "holds no GPU series" in r.stderr, r.stderr  # its queries were answered: credentials and ?token= went along
    return r.stdout + r.stderr


def _case_dashboard(base: str, tmp: Path, seen: list) -> str:
    port = free_port()
    return _serve_and_read(_cli("dashboard", "--prometheus", f"{base}/?token={TOKEN}", "--listen", f"127.0.0.1:{port}",
                                "--token", "dashtoken1"),
                           tmp, port, ["/api/health", "/", "/api/meta", "/api/panel/inference", "/api/findings"],
                           {"Authorization": "Bearer dashtoken1"})


def _case_bench_serve(base: str, tmp: Path, seen: list) -> str:
    r = subprocess.run(_cli("bench", "serve", "--url", f"{base}/v1/completions?token={TOKEN}", "--model", "m",
                            "--requests", "4", "--concurrency", "1", "--no-stream", "--store", str(tmp / "s.db"),
                            "--csv", str(tmp / "out.csv"), "--report", str(tmp / "out.html")),
                       cwd=tmp, env=_env(), capture_output=True, text=True, timeout=120)
    return r.stdout + r.stderr


def _case_bench_serve_tokenizer(base: str, tmp: Path, seen: list) -> str:
    r = subprocess.run(_cli("bench", "serve", "--url", f"{base}/v1/completions?token={TOKEN}", "--model", "m",
                            "--tokenizer", "server", "--input-tokens", "12", "--requests", "2", "--concurrency", "1",
                            "--no-stream", "--store", str(tmp / "s.db"), "--format", "json"),
                       cwd=tmp, env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout + r.stderr


def _case_tune_serve(base: str, tmp: Path, seen: list) -> str:
    r = subprocess.run(_cli("tune", "serve", "--url", f"{base}/generate?token={TOKEN}", "--slo", "p99_latency<=1s",
                            "--knob", "max_connections=1,2", "--rate", "20", "--duration", "0.3s", "--max-probes", "2",
                            "--yes", "--store", str(tmp / "s.db"), "--format", "json", "--html", str(tmp / "tune.html")),
                       cwd=tmp, env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout + r.stderr


def _case_bench_serve_failing(base: str, tmp: Path, seen: list) -> str:
    r = subprocess.run(_cli("bench", "serve", "--url", f"{base}/fail/v1/completions?token={TOKEN}", "--model", "m",
                            "--requests", "2", "--concurrency", "1", "--no-stream", "--store", str(tmp / "s.db"),
                            "--csv", str(tmp / "out.csv"), "--report", str(tmp / "out.html")),
                       cwd=tmp, env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "127.0.0.1" in r.stderr, r.stderr  # the failure names the endpoint, redacted
    return r.stdout + r.stderr


def _case_diagnose_unreachable(base: str, tmp: Path, seen: list) -> str:
    r = subprocess.run(_cli("diagnose", "--prometheus", f"{base}/fail?token={TOKEN}", "--window", "10m"),
                       cwd=tmp, env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 3 and "127.0.0.1" in r.stderr, r.stderr
    return r.stdout + r.stderr


CASES = {"agent --scrape --notify": _case_agent, "agent --otlp": _case_agent_otlp, "replay --notify": _case_replay, "diagnose --prometheus": _case_diagnose,
         "dashboard --prometheus": _case_dashboard, "bench serve --url": _case_bench_serve,
         "bench serve --tokenizer server": _case_bench_serve_tokenizer, "tune serve --url": _case_tune_serve, "bench serve --url (failing)": _case_bench_serve_failing, "diagnose --prometheus (failing)": _case_diagnose_unreachable}
SENDS_CREDENTIALS = {"replay --notify": "/hook", "agent --otlp": "/v1/metrics", "tune serve --url": "/generate", "bench serve --tokenizer server": "/tokenize", "agent --scrape --notify": "/metrics", "bench serve --url (failing)": "/fail/v1/completions", "diagnose --prometheus": "/api/v1/",
                     "dashboard --prometheus": "/api/v1/", "bench serve --url": "/v1/completions"}


@pytest.mark.parametrize("case", list(CASES))
def test_a_secret_in_a_url_is_never_shown_stored_or_written(tmp_path, peer, case):
    base, seen = peer
    out = CASES[case](base, tmp_path, seen)
    _assert_no_secret(out, f"the output of {case}")
    _assert_no_secret(_store_text(tmp_path / "s.db"), f"the store after {case}")
    _assert_no_secret(_files_text(tmp_path), f"the files {case} wrote")
    if case in SENDS_CREDENTIALS:
        sent = [(path, auth) for path, auth in seen if SENDS_CREDENTIALS[case] in path.partition("?")[0]]
        assert sent, f"{case} sent nothing to {SENDS_CREDENTIALS[case]}:\n{out[-3000:]}"
        assert all(a == EXPECTED_AUTH for _, a in sent), f"{case} sent Authorization {set(a for _, a in sent)}"
        assert all(f"token={TOKEN}" in p.partition("?")[2].split("&") for p, _ in sent), f"{case} dropped the ?token=: {sent[:3]}"
