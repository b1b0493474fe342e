"""Shared fixtures. Tests use real parts: an SQLite file in a temp folder, local servers on loopback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from testlib import free_port, which_or_skip  # noqa: F401  (re-exported for older tests)

from gpulens.data import bundled_colocation_trace, bundled_trace
from gpulens.store import Store

# pytest-xdist's workers are started with COLUMNS=80 and LINES=24 (execnet); a person's shell or CI's
# runner sets neither, and rich reads them once, when gpulens.cli's consoles are made: drop them so a
# worker renders as the serial run does (the tests that want a width set COLUMNS themselves).
for _name in ("COLUMNS", "LINES"):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.pop(_name, None)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def _nvidia_driver_present() -> bool:
    try:
        from gpulens.gpu import nvidia_driver_present

        return nvidia_driver_present()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if any("gpu" in item.keywords for item in items) and not _nvidia_driver_present():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU with a driver")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    _start_scrape_rig(config, items)


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "gpulens.db"


@pytest.fixture
def store(store_path: Path):
    s = Store(store_path)
    yield s
    s.close()


@pytest.fixture(scope="session")
def h200_trace() -> Path:
    return bundled_trace()


@pytest.fixture(scope="session")
def colocation_trace() -> Path:
    return bundled_colocation_trace()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data, laid beside the clone as in CI."""
    p = SHARED / "data"
    if not p.is_dir():
        pytest.skip("../shared/data is not beside this checkout")
    return p


@pytest.fixture(scope="session")
def replayed_store(tmp_path_factory) -> Path:
    """A store holding the bundled H200 session, imported once per test session. Read-only use."""
    from gpulens.pipeline.ingest import import_trace

    path = tmp_path_factory.mktemp("replayed") / "h200.db"
    with Store(path) as s:
        import_trace(bundled_trace(), s)
    return path


@pytest.fixture
def port() -> int:
    return free_port()



def _start_scrape_rig(config, items) -> None:
    """The scrape-contract tests need a rig that takes ~70 s of mostly waiting (scrape_rig.py): start it
    now and run those tests last, so the wait overlaps the rest of the suite. Under pytest-xdist every
    worker collects every test, so none starts it here: the worker that gets the module (`--dist
    loadfile`) starts it in the module's fixture, and the other workers go on meanwhile."""
    contract = [i for i in items if "test_scrape_contract" in i.nodeid]
    if not contract or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    items[:] = [i for i in items if i not in contract] + contract
    import shutil
    import tempfile

    if shutil.which("prometheus") is None:
        return  # the tests skip (or fail under CI) on their own
    from scrape_rig import ScrapeRig

    work = Path(tempfile.mkdtemp(prefix="gpulens-scrape-rig-"))
    config._gpulens_scrape_rig = ScrapeRig(work).start()
    config.add_cleanup(config._gpulens_scrape_rig.stop)


@pytest.fixture(scope="module", autouse=True)
def _no_event_loop_left_running():
    """A module that leaves an asyncio loop marked running in the main thread (a session-wide
    Playwright, say) breaks every later `asyncio.run()` in the same pytest-xdist worker."""
    import asyncio

    yield
    assert asyncio._get_running_loop() is None, "this module left an asyncio event loop running in the main thread"
