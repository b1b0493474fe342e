"""Foundation figures: store ingest rate, a week-long chart query. (The agent's CPU cost is
bench_agent_cost.py: the real `gpulens agent` process beside a floor loop doing its visible work.)

Each is printed beside a reference measured in the same run:
- ingest: samples/s through Store (batched commits + roll-ups) against a bare sqlite3 executemany
  into a plain table with the same index (goal >= 200,000/s);
- chart query: one metric of one GPU over 7 days of 1 s samples (20 metrics of that GPU stored,
  ~12 M samples) answered as ~1,000 points from roll-ups (goal < 100 ms), against the same
  downsampling computed from the raw samples.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from gpulens import Store


def _ingest(tmp: Path, n: int = 2_000_000, batch: int = 20_000) -> tuple[float, float]:
    """(Store samples/s, bare sqlite3 samples/s)."""
    rows = [(1 + i % 20, 1_700_000_000.0 + i // 20, float(i % 1000)) for i in range(n)]
    with Store(tmp / "ingest.db", batch_size=10**12) as st:
        ids = [st.series_id(f"m{k}", {"gpu": "0"}) for k in range(20)]
        assert ids == list(range(1, 21))
        t0 = time.perf_counter()
        for i in range(0, n, batch):
            st.write_many(rows[i : i + batch])
            st.flush()
        store_rate = n / (time.perf_counter() - t0)
    conn = sqlite3.connect(tmp / "bare.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE samples (series_id INTEGER, t REAL, value REAL)")
    conn.execute("CREATE INDEX s_idx ON samples (series_id, t)")
    t0 = time.perf_counter()
    for i in range(0, n, batch):
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO samples VALUES (?, ?, ?)", rows[i : i + batch])
        conn.execute("COMMIT")
    bare_rate = n / (time.perf_counter() - t0)
    conn.close()
    return store_rate, bare_rate


def _chart_query(tmp: Path) -> tuple[float, float, int]:
    """(roll-up query ms, raw query ms, points returned) for 7 days x 20 metrics of 1 s samples."""
    days = 7
    n_seconds = days * 86400
    t0 = 1_700_000_000.0
    path = tmp / "week.db"
    with Store(path, batch_size=10**12) as st:
        ids = [st.series_id(f"gpu_metric_{k}", {"gpu": "0"}) for k in range(20)]
        chunk = 3600
        for start in range(0, n_seconds, chunk):
            st.write_many((sid, t0 + s, float((s + k) % 977)) for s in range(start, start + chunk) for k, sid in enumerate(ids))
            st.flush()
    with Store(path, readonly=True) as st:
        st.query("gpu_metric_3", start=t0, end=t0 + n_seconds, max_points=1000)  # warm the page cache once
        times = []
        for _ in range(5):
            t = time.perf_counter()
            (d,) = st.query("gpu_metric_3", start=t0, end=t0 + n_seconds, max_points=1000)
            times.append(time.perf_counter() - t)
        raw_times = []
        for _ in range(3):
            t = time.perf_counter()
            (r,) = st.query("gpu_metric_3", start=t0, end=t0 + n_seconds, max_points=1000, resolution="raw")
            raw_times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times), 1000 * statistics.median(raw_times), len(d)


def run() -> list[dict]:
    out = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("GPULENS_BENCH_TMP")) as tmp_s:
        tmp = Path(tmp_s)
        store_rate, bare_rate = _ingest(tmp)
        out.append(
            dict(
                name="store ingest (batched, with roll-ups)",
                value=store_rate,
                unit="samples/s",
                reference="bare sqlite3 executemany",
                reference_value=bare_rate,
                ratio=store_rate / bare_rate,
                goal=">= 200,000/s",
                met=store_rate >= 200_000,
            )
        )
        q_ms, raw_ms, points = _chart_query(tmp)
        out.append(
            dict(
                name=f"7-day chart query ({points} points of ~12 M samples)",
                value=q_ms,
                unit="ms",
                reference="same downsampling from raw samples",
                reference_value=raw_ms,
                ratio=q_ms / raw_ms,
                goal="< 100 ms",
                met=q_ms < 100,
            )
        )
    return out


if __name__ == "__main__":
    for r in run():
        print(r)
