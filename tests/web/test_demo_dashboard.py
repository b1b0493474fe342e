"""`gpulens demo`'s dashboard follows the live replay (issue 26: "store mode never refreshes while the
demo replays": it read the imported copy of the session, which never changes, while the replay
wrote to its own store)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from testlib import free_port, wait_http

pytest.importorskip("starlette")
pytestmark = pytest.mark.slow


def test_the_demo_dashboard_shows_the_replay_as_it_plays(tmp_path):
    metrics, web = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulens", "demo", "--store", str(tmp_path / "demo.db"), "--backend", "replay",
         "--listen", f"127.0.0.1:{metrics}", "--dashboard", f"127.0.0.1:{web}", "--speed", "20", "--duration", "60"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        meta = f"http://127.0.0.1:{web}/api/meta"
        first = json.loads(wait_http(meta, proc, 60, until=lambda b: json.loads(b)["data_end"] is not None))["data_end"]
        # a later answer ends later: the page's refresh shows new samples
        later = wait_http(meta, proc, 30, until=lambda b: (json.loads(b)["data_end"] or 0) > first + 2,
                          what="the dashboard's data to grow while the demo replays")
        assert json.loads(later)["data_end"] > first
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
