"""Two writers on one store: an agent sampling every 0.5 s while `gpulens replay --speed 45` imports
a recording (8 GPUs at 10 Hz, 4.5 min recorded: about 6 s at 45x) into the same store.

Figure: the agent's largest gap between consecutive samples of one GPU while the replay runs,
beside the same agent's largest gap alone, before the replay (the same run, the same machine);
goal: at most two sampling intervals (an import used to hold the write lock for its whole length,
and the agent waited out the 30 s busy timeout).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

INTERVAL_S = 0.5
SPEED = 45
GPUS = 8
FRAMES = 2_700  # 10 Hz: 270 s recorded
CLI = [sys.executable, "-m", "gpulens.cli.main"]
ENV = {**os.environ, "NO_COLOR": "1"}


def _recording(path: Path) -> None:
    with path.open("w") as f:
        f.write(json.dumps({"format": "gpulens-recording", "version": 1,
                            "gpus": [{"index": g, "uuid": f"GPU-{g}", "name": "fake"} for g in range(GPUS)]}) + "\n")
        for i in range(FRAMES):
            for g in range(GPUS):
                f.write(json.dumps({"type": "sample", "t": 1_700_000_000.0 + i * 0.1, "gpu": g, "uuid": f"GPU-{g}", "name": "fake",
                                    "power_watts": 300.0 + i % 7, "temperature_celsius": 50.0, "utilization_gpu_ratio": 0.5}) + "\n")


def _agent_times(db: Path) -> list[float]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        rows = conn.execute("SELECT series.labels, samples.t FROM samples JOIN series ON series.id = samples.series_id "
                            "WHERE series.name = 'gpu_up'").fetchall()
    finally:
        conn.close()
    return sorted(t for labels, t in rows if json.loads(labels).get("host") == "agent-node" and json.loads(labels).get("gpu") == "0")


def _agent_count(db: Path) -> int:
    try:
        return len(_agent_times(db)) if db.exists() else 0
    except sqlite3.Error:
        return 0  # the agent is still creating the store


def _largest_gap(times: list[float], lo: float, hi: float) -> float:
    inside = [t for t in times if lo <= t <= hi]
    return max((b - a for a, b in zip(inside, inside[1:], strict=False)), default=float("nan"))


def _wait(cond, timeout: float) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        time.sleep(0.1)


def measure() -> tuple[float, float, float]:
    """(largest gap under the replay, largest gap alone, replay wall seconds)."""
    with tempfile.TemporaryDirectory() as d:
        db, rec = Path(d) / "s.db", Path(d) / "rec.jsonl"
        _recording(rec)
        agent = subprocess.Popen([*CLI, "agent", "--backend", "fake:2", "--interval", f"{INTERVAL_S}s", "--listen", "off",
                                  "--host", "agent-node", "--store", str(db)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
        try:
            _wait(lambda: _agent_count(db) >= 2, 60)
            alone_from = time.time()
            time.sleep(6.0)  # the agent alone, as long as the replay will take
            t0 = time.time()
            subprocess.run([*CLI, "replay", str(rec), "--store", str(db), "--speed", str(SPEED)],
                           capture_output=True, env=ENV, timeout=300, check=True)
            t1 = time.time()
            _wait(lambda: max(_agent_times(db)) > t1 + 2 * INTERVAL_S, 60)
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(60)
        times = _agent_times(db)
        return _largest_gap(times, t0, t1 + 2 * INTERVAL_S), _largest_gap(times, alone_from, t0), t1 - t0


def run() -> list[dict]:
    under, alone, wall = measure()
    goal = 2 * INTERVAL_S
    return [dict(name=f"agent's largest sampling gap under a {SPEED}x replay ({wall:.1f} s)", value=under, unit="s",
                 reference="the agent alone (same run)", reference_value=alone, ratio=under / INTERVAL_S,
                 goal=f"<= 2 intervals ({goal:g} s); ratio in intervals", met=under <= goal)]


if __name__ == "__main__":
    print(run())
