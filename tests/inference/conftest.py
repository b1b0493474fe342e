"""Fixtures of the inference tests: a local server process with known behaviour."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(script: Path, *args: str, timeout: float = 15.0) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(script), str(port), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"test server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("test server did not start")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


@pytest.fixture(scope="session")
def test_server() -> str:
    """Base URL of the asyncio behaviour server in servers.py: streaming, errors, hangs."""
    proc, port = start_server(HERE / "servers.py", "aiohttp")
    yield f"http://127.0.0.1:{port}"
    _stop(proc)


@pytest.fixture(scope="session")
def timed_server() -> str:
    """Base URL of the threaded server in servers.py: /fixed/KEY?ms=&at=&dur= and /capacity/KEY?ms=."""
    proc, port = start_server(HERE / "servers.py", "threaded")
    yield f"http://127.0.0.1:{port}"
    _stop(proc)
