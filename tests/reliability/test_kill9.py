"""kill -9 at random moments: the store stays intact, an agent loses at most its flush interval and
never stores a sample twice, and an interrupted replay rerun stores each sample exactly once (issue
18, point 2). `make reliability` kills many more times (GPULENS_KILLS)."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from testlib import wait_until

from gpulens.pipeline.node import NodeConfig

KILLS = int(os.environ.get("GPULENS_KILLS", "1"))
FULL = os.environ.get("GPULENS_RELIABILITY_FULL") == "1"  # `make reliability`: every signal
CLI = [sys.executable, "-m", "gpulens.cli.main"]
ENV = {**os.environ, "NO_COLOR": "1"}


def _check_store(db) -> sqlite3.Connection:
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    dup = conn.execute("SELECT count(*) FROM (SELECT series_id, t FROM samples GROUP BY 1, 2 HAVING count(*) > 1)").fetchone()[0]
    assert dup == 0, f"{dup} samples stored twice"
    return conn


def _gpu_up_rows(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT count(*) FROM samples JOIN series ON series.id = samples.series_id WHERE series.name = 'gpu_up'").fetchone()[0]


def _wait_rows(db, at_least: int, timeout: float = 60.0) -> None:
    def written() -> bool:
        try:
            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
            n = _gpu_up_rows(conn)
            conn.close()
            return n >= at_least
        except sqlite3.Error:
            return False

    wait_until(written, timeout, f"the agent to write {at_least} gpu_up rows", interval=0.1)


def test_kill9_agent_loses_at_most_its_flush_interval(tmp_path):
    db = tmp_path / "s.db"
    rng = random.Random(18)
    for _ in range(KILLS):
        p = subprocess.Popen([*CLI, "agent", "--backend", "fake:8", "--interval", "100ms", "--store", str(db), "--listen", "off"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
        before = 0
        if db.exists():
            conn = _check_store(db)
            before = _gpu_up_rows(conn)
            conn.close()
        _wait_rows(db, before + 8)
        time.sleep(rng.uniform(0.2, 3.0))
        killed_at = time.time()
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        conn = _check_store(db)
        last = conn.execute("SELECT max(t) FROM samples").fetchone()[0]
        conn.close()
        assert killed_at - last < NodeConfig.flush_seconds + 2.0  # the agent commits every flush interval


def _recording(path, frames: int, gpus: int = 8) -> tuple[int, int]:
    head = {"format": "gpulens-recording", "version": 1, "gpus": [{"index": g, "uuid": f"GPU-{g}", "name": "fake"} for g in range(gpus)]}
    xids = 0
    with path.open("w") as f:
        f.write(json.dumps(head) + "\n")
        for i in range(frames):
            t = 1_700_000_000.0 + i * 0.1
            for g in range(gpus):
                f.write(json.dumps({"type": "sample", "t": t, "gpu": g, "uuid": f"GPU-{g}", "name": "fake",
                                    "temperature_celsius": 50.0, "power_watts": 300.0 + i % 7, "utilization_gpu_ratio": 0.5}) + "\n")
            if i % 1000 == 500:
                f.write(json.dumps({"type": "xid", "t": t, "gpu": 0, "uuid": "GPU-0", "xid": 79}) + "\n")
                xids += 1
    return frames * gpus, xids


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM] if FULL else [signal.SIGKILL],
                         ids=["kill-9", "ctrl-c", "sigterm"] if FULL else ["kill-9"])
def test_an_interrupted_replay_rerun_stores_each_sample_once(tmp_path, how):
    rec = tmp_path / "rec.jsonl"
    samples, xids = _recording(rec, 3000)
    db = tmp_path / "s.db"
    p = subprocess.Popen([*CLI, "replay", str(rec), "--store", str(db)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    wal = db.with_name(db.name + "-wal")
    wait_until(lambda: (wal.exists() and wal.stat().st_size > 2_000_000) or p.poll() is not None, 60,
               "the import to write 2 MB of batches")
    assert p.poll() is None, "the import ended before it could be interrupted"
    p.send_signal(how)
    p.wait(30)
    conn = _check_store(db)
    assert _gpu_up_rows(conn) < samples  # the whole frames committed before the kill stay, with the claim's position
    conn.close()
    r = subprocess.run([*CLI, "replay", str(rec), "--store", str(db)], capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr
    conn = _check_store(db)
    assert _gpu_up_rows(conn) == samples
    assert conn.execute("SELECT count(*) FROM events WHERE kind = 'xid'").fetchone()[0] == xids
    conn.close()
