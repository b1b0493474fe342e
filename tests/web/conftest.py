"""Fixtures of the dashboard tests: a real uvicorn server on a free loopback port, and Debian's
chromium driven by Playwright (never a browser that Playwright downloads)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from testlib import wait_until, which_or_skip

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class RunningDashboard:
    base: str  # http://127.0.0.1:PORT
    port: int


@contextmanager
def run_dashboard(app) -> Iterator[RunningDashboard]:
    """Serve an ASGI app with uvicorn in a thread, on a socket bound here (no port race)."""
    import uvicorn

    from gpulens.web.guard import uvicorn_config
    from gpulens.web.server import bind

    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(app))  # the limits `gpulens dashboard` runs with
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), 60, "the dashboard server to start")
    if not server.started:
        raise RuntimeError("the dashboard server stopped before it started")
    try:
        yield RunningDashboard(f"http://127.0.0.1:{port}", port)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture(scope="session")
def dashboard_server() -> Callable:
    return run_dashboard


@pytest.fixture(scope="session")
def replayed_dashboard(replayed_store: Path) -> Iterator[RunningDashboard]:
    from gpulens.web import create_app

    with run_dashboard(create_app(store_path=replayed_store, allowed_hosts=["127.0.0.1"])) as d:
        yield d


@pytest.fixture(scope="module")
def browser():
    """One Chromium per module, not per session: Playwright's sync API keeps an asyncio loop marked
    running in this thread while it is open, and a later module's `asyncio.run()` (the load tester,
    run in-process) would then refuse to start in the same pytest-xdist worker."""
    chromium = which_or_skip("chromium")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    yield pg
    context.close()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


