"""The store: roll-ups, downsampling, retention, several processes, a kill mid-write."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from gpulens import Store, StoreError


def test_write_query_and_labels(store):
    store.write("gpu_temperature_celsius", {"gpu": "0"}, 10.0, 40)
    store.write("gpu_temperature_celsius", {"gpu": "1"}, 10.0, 50)
    store.write("gpu_temperature_celsius", {"gpu": "0"}, 11.0, None)  # missing: no sample
    store.flush()
    assert [d.key.labels["gpu"] for d in store.query("gpu_temperature_celsius")] == ["0", "1"]
    (only,) = store.query("gpu_temperature_celsius", {"gpu": "1"})
    assert only.t == [10.0] and only.value == [50.0]
    assert store.latest("gpu_temperature_celsius", {"gpu": "0"})[0].value == 40.0


def test_rollups_equal_recomputation_from_raw(store):
    rng = random.Random(7)
    sid_a = store.series_id("m", {"gpu": "0"})
    sid_b = store.series_id("m", {"gpu": "1"})
    t0 = 1_700_000_000.0
    rows = [(rng.choice((sid_a, sid_b)), t0 + rng.uniform(0, 3 * 3600), rng.uniform(-5, 100)) for _ in range(20_000)]
    # several flushes, out of time order, so buckets are folded incrementally
    for i in range(0, len(rows), 3_001):
        store.write_many(rows[i : i + 3_001])
        store.flush()
    conn = sqlite3.connect(store.path)
    for table, width in (("rollup_1m", 60), ("rollup_1h", 3600)):
        expected = conn.execute(
            f"SELECT series_id, CAST(t / {width} AS INTEGER) * {width} AS b, min(value), max(value), sum(value), count(*) "
            "FROM samples GROUP BY 1, 2 ORDER BY 1, 2"
        ).fetchall()
        got = conn.execute(f"SELECT series_id, bucket, vmin, vmax, vsum, n FROM {table} ORDER BY 1, 2").fetchall()
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            assert g[:4] == pytest.approx(e[:4]) and g[4] == pytest.approx(e[4]) and g[5] == e[5]


def test_rollups_fold_only_each_flush_own_rows_with_two_writers_on_one_file(store):
    """Each flush folds the rows it inserted (those above the table's largest rowid when it took the
    write lock), so interleaved flushes of another writer are neither missed nor counted twice."""
    rng = random.Random(28)
    other = Store(store.path)
    t0 = 1_700_000_000.0
    for step in range(40):
        for s in (store, other):
            s.write_many([(s.series_id("m", {"gpu": str(g)}), t0 + step * 7 + rng.random(), rng.uniform(0, 9)) for g in range(3)])
            if rng.random() < 0.5:
                s.flush()
    store.flush()
    other.flush()
    other.close()
    conn = sqlite3.connect(store.path)
    for table, width in (("rollup_1m", 60), ("rollup_1h", 3600)):
        expected = conn.execute(
            f"SELECT series_id, CAST(t / {width} AS INTEGER) * {width}, count(*), sum(value) FROM samples GROUP BY 1, 2 ORDER BY 1, 2"
        ).fetchall()
        got = conn.execute(f"SELECT series_id, bucket, n, vsum FROM {table} ORDER BY 1, 2").fetchall()
        assert [g[:3] for g in got] == [e[:3] for e in expected]
        assert [g[3] for g in got] == pytest.approx([e[3] for e in expected])


def test_chart_query_reads_rollups_and_downsamples(store):
    sid = store.series_id("gpu_power_watts", {"gpu": "0"})
    t0 = 1_700_000_000.0
    store.write_many((sid, t0 + i, float(i % 600)) for i in range(3 * 86400 // 10 * 10) if i % 10 == 0)
    store.flush()
    (week,) = store.query("gpu_power_watts", start=t0, end=t0 + 3 * 86400, max_points=500)
    assert week.resolution == "1m"
    assert 0 < len(week) <= 500
    assert min(week.value_min) == 0.0 and max(week.value_max) == 590.0
    (raw,) = store.query("gpu_power_watts", start=t0, end=t0 + 590)  # both ends inclusive
    assert raw.resolution == "raw" and len(raw) == 60
    (few,) = store.query("gpu_power_watts", start=t0, end=t0 + 600, max_points=6)
    assert len(few) == 6 and sum(few.count) == 61


def test_events_round_trip_and_filters(store):
    store.event("xid", 5.0, {"gpu": "0"}, {"xid": 79})
    store.event("phase", 1.0, {}, {"name": "idle"})
    store.flush()
    assert [e.kind for e in store.events()] == ["phase", "xid"]
    (x,) = store.events("xid", labels={"gpu": "0"})
    assert x.data == {"xid": 79} and x.t == 5.0
    assert store.events("xid", start=6.0) == []


def test_retention_drops_old_data_only(store):
    now = 10 * 86400.0
    store.write("m", {}, now - 9 * 86400, 1.0)
    store.write("m", {}, now - 100, 2.0)
    store.flush()
    store.apply_retention(now)
    (d,) = store.query("m")
    assert d.value == [2.0]
    (hourly,) = store.query("m", resolution="1h")
    assert len(hourly) == 2  # roll-ups outlive raw samples


def test_unwritable_path_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="Cannot"):
        Store(blocker / "sub" / "db.sqlite")
    with pytest.raises(StoreError, match="no store"):
        Store(tmp_path / "missing.db", readonly=True)


def test_not_a_database_is_a_clear_error(tmp_path):
    p = tmp_path / "junk.db"
    p.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError):
        Store(p)


def _writer(path: str, n_batches: int, per_batch: int) -> None:
    s = Store(path, batch_size=10**9)
    sid = s.series_id("w", {"p": "writer"})
    for b in range(n_batches):
        s.write_many((sid, b * per_batch + i, float(i)) for i in range(per_batch))
        s.flush()
    s.close()


def _reader(path: str, rounds: int, q: mp.Queue) -> None:
    s = Store(path, readonly=True)
    seen = []
    for _ in range(rounds):
        d = s.query("w")
        seen.append(len(d[0]) if d else 0)
        time.sleep(0.005)
    s.close()
    q.put(seen)


def test_one_writer_and_concurrent_readers_in_other_processes(store_path):
    Store(store_path).close()  # schema exists before readers open read-only
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    writer = ctx.Process(target=_writer, args=(str(store_path), 40, 500))
    readers = [ctx.Process(target=_reader, args=(str(store_path), 60, q)) for _ in range(2)]
    writer.start()
    for r in readers:
        r.start()
    writer.join(60)
    results = [q.get(timeout=60) for _ in readers]
    for r in readers:
        r.join(10)
    assert writer.exitcode == 0
    for seen in results:
        # readers only ever see whole committed batches, and never go backwards
        assert all(n % 500 == 0 for n in seen)
        assert seen == sorted(seen)
    with Store(store_path) as s:
        assert len(s.query("w")[0]) == 40 * 500


def test_killed_writer_loses_at_most_the_unflushed_batch(tmp_path):
    path = tmp_path / "kill.db"
    script = textwrap.dedent(
        f"""
        import sys
        from gpulens import Store
        s = Store({str(path)!r}, batch_size=10**9)
        sid = s.series_id("k")
        b = 0
        while True:
            s.write_many((sid, b * 1000 + i, 1.0) for i in range(1000))
            s.flush()
            b += 1
            if b == 5:
                print("ready", flush=True)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    n = conn.execute("SELECT count(*) FROM samples").fetchone()[0]
    assert n >= 5000 and n % 1000 == 0  # whole batches only
    rollup_n = conn.execute("SELECT sum(n) FROM rollup_1m").fetchone()[0]
    assert rollup_n == n  # roll-ups committed with their batch
    conn.close()
    with Store(path) as s:  # and it opens for writing again
        s.write("k", None, 1e9, 2.0)


def test_sample_writer_writes_exactly_the_metric_table(store):
    from gpulens import FakeBackend
    from gpulens.gpu.metrics import gpu_labels, sample_values
    from gpulens.pipeline.writer import SampleWriter

    fake = FakeBackend(gpus=2, clock=lambda: 50.0)
    fake.add_process(1, 7, "serve", 1024)
    fake.throttle(0, "sw_power_cap")
    fake.lose(1)
    fake.clear(1)
    samples = fake.sample()
    SampleWriter(store, host="h").write_samples(samples)
    store.flush()
    expected = {(n, tuple(sorted({**gpu_labels(s, "h"), **e}.items())), v) for s in samples for n, e, v in sample_values(s)}
    got = set()
    for key in store.series():
        (d,) = store.query(key.name, key.labels)
        for v in d.value:
            got.add((key.name, tuple(sorted(key.labels.items())), v))
    assert got == expected


def test_time_range_covers_samples_and_events(store):
    assert store.time_range() is None
    store.write("a", {"gpu": "0"}, 100.0, 1.0)
    store.write("a", {"gpu": "1"}, 250.0, 1.0)
    store.write("b", {}, 50.0, 1.0)
    store.event("phase", 300.0)
    store.flush()
    assert store.time_range() == (50.0, 300.0)
    assert store.time_range("a") == (100.0, 250.0)
    assert store.time_range("missing") is None


def _open_and_write(path: str, k: int, barrier) -> None:
    barrier.wait(30)  # all open at the same moment, as the ranks of one job do
    for i in range(20):  # and keep opening while the others write
        with Store(path) as s:
            s.write("race", {"writer": str(k)}, float(i), 1.0)


def test_many_processes_create_the_same_new_store_at_once(tmp_path):
    path = str(tmp_path / "race.db")
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(6)
    procs = [ctx.Process(target=_open_and_write, args=(path, k, barrier)) for k in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 6
    with Store(path) as s:
        assert [len(d) for d in s.query("race")] == [20] * 6


def test_a_burst_does_not_leave_the_wal_at_its_high_water_mark(tmp_path, monkeypatch):
    """The rows a full disk held back are written in one go once space is back; the WAL they grow is
    cut back when it next starts over, instead of holding the space the user just freed."""
    from gpulens.store import connect

    monkeypatch.setattr(connect, "WAL_SIZE_LIMIT_BYTES", 2**20)
    wal = tmp_path / "s.db-wal"
    with Store(tmp_path / "s.db", batch_size=10**7) as st:
        sid = st.series_id("burst")
        st.write_many((sid, 1000.0 + i, float(i)) for i in range(300_000))
        st.flush()
        assert wal.stat().st_size > 4 * 2**20  # past SQLite's checkpoint (1,000 pages): the case in point
        for i in range(5):  # the next commits start the WAL over
            st.write_id(sid, 1e6 + i, 1.0)
            st.flush()
        assert wal.stat().st_size <= 2**20
        assert len(st.window(sid, 0, 1e10)) == 300_005
