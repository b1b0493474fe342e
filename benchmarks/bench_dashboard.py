"""Dashboard API speed: a 7-day range of one series (1 s samples, 604,800 rows) answered by
GET /api/series with server-side downsampling, against a bare `SELECT count(*)` over the same rows
in the same store. Also the whole GPU panel (stats + 7 charts) over the same 7 days.

Goal (issue #7): the series answer in under 150 ms on this machine.
"""

from __future__ import annotations

import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

DAYS = 7
SECONDS = DAYS * 86400
T0 = 1_790_000_000.0
GOAL_SECONDS = 0.150
REPEATS = 15


def _build(db: Path) -> None:
    from gpulens.store import Store

    rng = np.random.default_rng(0)
    with Store(db, batch_size=100_000) as s:
        labels = {"gpu": "0", "uuid": "GPU-bench", "model": "bench", "host": "bench"}
        sid = s.series_id("gpu_power_watts", labels)
        lim = s.series_id("gpu_power_limit_watts", labels)
        chunk = 86400
        for day in range(DAYS):
            t = T0 + day * chunk + np.arange(chunk, dtype=float)
            v = 300 + 100 * np.sin(t / 3600) + rng.normal(0, 10, chunk)
            s.write_many(zip([sid] * chunk, t.tolist(), v.tolist(), strict=True))
            s.write_many(zip([lim] * chunk, t.tolist(), [700.0] * chunk, strict=True))
        s.flush()


def _median_seconds(fn, repeats: int = REPEATS) -> float:
    fn()  # warm the page cache and the app
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run() -> list[dict]:
    from starlette.testclient import TestClient

    from gpulens.web import create_app

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "week.db"
        _build(db)
        conn = sqlite3.connect(db)
        sid = conn.execute("SELECT id FROM series WHERE name = 'gpu_power_watts'").fetchone()[0]

        def reference() -> None:
            n = conn.execute("SELECT count(*) FROM samples WHERE series_id = ? AND t >= ? AND t <= ?", (sid, T0, T0 + SECONDS)).fetchone()[0]
            assert n == SECONDS

        ref = _median_seconds(reference)
        with TestClient(create_app(store_path=db)) as client:
            url = f"/api/series?metric=gpu_power_watts&start={T0}&end={T0 + SECONDS}&points=1000"

            def series() -> None:
                r = client.get(url)
                assert r.status_code == 200 and 500 <= len(r.json()["series"][0]["t"]) <= 1000

            api = _median_seconds(series)

            def panel() -> None:
                r = client.get(f"/api/panel/gpu?start={T0}&end={T0 + SECONDS}&points=1000")
                assert r.status_code == 200 and r.json()["has_data"]

            panel_s = _median_seconds(panel, repeats=5)
        conn.close()
    return [
        {
            "name": "7-day series via /api/series (604,800 samples -> 1000 points)",
            "value": api * 1000,
            "unit": "ms",
            "reference": "SELECT count(*) over the same rows (ms)",
            "reference_value": ref * 1000,
            "ratio": api / ref,
            "goal": f"< {GOAL_SECONDS * 1000:.0f} ms",
            "met": api < GOAL_SECONDS,
        },
        {
            "name": "7-day GPU panel via /api/panel/gpu (stats + 7 charts)",
            "value": panel_s * 1000,
            "unit": "ms",
            "reference": "SELECT count(*) over one series (ms)",
            "reference_value": ref * 1000,
            "ratio": panel_s / ref,
            "goal": "informational",
            "met": None,
        },
    ]


if __name__ == "__main__":
    for row in run():
        print(row)
