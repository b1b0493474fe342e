"""Fixtures of the inference tests: local server processes with known behaviour."""

from __future__ import annotations

from pathlib import Path

import pytest
from inference_test_servers import start_server, stop_server

SERVERS = Path(__file__).resolve().parent / "inference_test_servers.py"


@pytest.fixture(scope="session")
def test_server() -> str:
    """Base URL of the asyncio behaviour server: streaming completions, errors, rejections, hangs."""
    proc, port = start_server(SERVERS, "aiohttp")
    yield f"http://127.0.0.1:{port}"
    stop_server(proc)


@pytest.fixture(scope="session")
def timed_server() -> str:
    """Base URL of the timed server: /fixed/KEY?ms=&at=&dur= and /capacity/KEY?ms=."""
    proc, port = start_server(SERVERS, "timed")
    yield f"http://127.0.0.1:{port}"
    stop_server(proc)
