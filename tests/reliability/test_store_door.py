"""The store refuses what would break it, readers open read-only, and one agent holds a store
(issue 18, points 3 and 8)."""

from __future__ import annotations

import math
import os
import sqlite3
import stat
import subprocess
import sys

import pytest
from testlib import tiny_tmpfs, wait_until

from gpulens.errors import StoreError
from gpulens.pipeline.node import NodeConfig, build_node
from gpulens.store import Store
from gpulens.store.writer_lock import WriterLock


@pytest.mark.parametrize("t,value", [
    (math.inf, 1.0), (-math.inf, 1.0), (math.nan, 1.0), (1e300, 1.0), (-1.0, 1.0),
    (100.0, math.inf), (100.0, -math.inf), (100.0, 1e300),
])
def test_the_door_refuses_non_finite_and_out_of_range(tmp_path, t, value):
    with Store(tmp_path / "s.db") as st:
        sid = st.series_id("x")
        st.write_id(sid, 100.0, 1.0)
        st.write_id(sid, t, value)
        st.write_many([(sid, t, value), (sid, 200.0, 2.0)])
        st.write("x", None, t, value)
        st.write("x", None, t, 10**400)
        st.event("e", t, {}, {})
        st.flush()
        assert st.refused_count >= 3
        assert [s.t for s in st.window(sid, 0, 1e10)] == [100.0, 200.0]
        assert st.time_range() == (100.0, 200.0)
        assert st.events() == [] or all(0 <= e.t < 7.3e9 for e in st.events())


def test_query_and_report_work_after_a_hostile_replay(tmp_path):
    """A replayed t of 1e300 used to be stored and break every later query."""
    trace = tmp_path / "rec.jsonl"
    trace.write_text(
        '{"format": "gpulens-recording", "version": 1, "gpus": [{"index": 0, "uuid": "u", "name": "n"}]}\n'
        '{"type": "sample", "t": 1700000000.0, "gpu": 0, "temperature_celsius": 50}\n'
        '{"type": "sample", "t": 1e300, "gpu": 0, "temperature_celsius": 50}\n'
        '{"type": "sample", "t": Infinity, "gpu": 0, "temperature_celsius": 50}\n'
        '{"type": "sample", "t": 1700000001.0, "gpu": 0, "temperature_celsius": 1e999}\n'
    )
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    cli = [sys.executable, "-m", "gpulens.cli.main"]
    db = str(tmp_path / "s.db")
    r = subprocess.run([*cli, "replay", str(trace), "--store", db], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "skipped 3 malformed line" in r.stderr and "line 3: t is 1e+300" in r.stderr
    q = subprocess.run([*cli, "query", "gpu_temperature_celsius", "--store", db], capture_output=True, text=True, env=env, timeout=60)
    assert q.returncode == 0 and "Traceback" not in q.stderr, q.stderr


def _delete_journal_store(path):
    with Store(path) as st:
        st.write("x", None, 100.0, 1.0)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.close()


def test_readers_leave_the_journal_mode_alone(tmp_path):
    db = tmp_path / "s.db"
    _delete_journal_store(db)
    with Store(db, readonly=True) as st:
        assert st.time_range() == (100.0, 100.0)
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through read-only permissions")
def test_a_store_on_read_only_media_opens_for_reading(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    db = folder / "s.db"
    _delete_journal_store(db)
    db.chmod(stat.S_IRUSR)
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with Store(db, readonly=True) as st:
            assert st.time_range() == (100.0, 100.0)
    finally:
        folder.chmod(stat.S_IRWXU)


def test_a_store_on_a_read_only_mount_opens_for_reading(tmp_path):
    with tiny_tmpfs(tmp_path, "4m", "media") as mnt:
        with Store(mnt / "s.db") as st:  # a WAL store, as the agent leaves it
            st.write("x", None, 100.0, 1.0)
        assert subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True).returncode == 0
        with Store(mnt / "s.db", readonly=True) as st:
            assert st.time_range() == (100.0, 100.0)


def test_a_reader_cannot_write(tmp_path):
    db = tmp_path / "s.db"
    _delete_journal_store(db)
    with Store(db, readonly=True) as st, pytest.raises(StoreError, match="readonly"):
        st.write("y", None, 200.0, 2.0)


def test_a_second_writer_lock_names_the_first_pid(tmp_path):
    db = tmp_path / "s.db"
    with WriterLock(db):
        with pytest.raises(StoreError, match=rf"Another gpulens agent \(pid {os.getpid()}\)"):
            WriterLock(db).acquire()
    WriterLock(db).acquire().release()  # released: free again


def test_two_agents_on_one_store(tmp_path):
    """The second agent is refused with the first one's pid (exit 2), not run beside it."""
    db = tmp_path / "s.db"
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    cli = [sys.executable, "-m", "gpulens.cli.main", "agent", "--backend", "fake:1", "--store", str(db), "--listen", "off"]
    first = subprocess.Popen([*cli, "--duration", "60s"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lock = db.with_name(db.name + ".lock")
        wait_until(lambda: lock.exists() and lock.read_text().strip(), 30, "the first agent to take the store's lock")
        second = subprocess.run([*cli, "--duration", "1s"], capture_output=True, text=True, env=env, timeout=60)
        assert second.returncode == 2, second.stderr
        assert f"pid {first.pid}" in second.stderr and "Traceback" not in second.stderr
    finally:
        first.terminate()
        first.wait(30)


def test_a_killed_agent_leaves_no_stale_lock(tmp_path):
    db = tmp_path / "s.db"
    code = f"from gpulens.store.writer_lock import WriterLock; WriterLock({str(db)!r}).acquire(); import time; time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code])
    lock = db.with_name(db.name + ".lock")
    wait_until(lambda: lock.exists() and lock.read_text().strip(), 30, "the child to take the store's lock")
    p.kill()
    p.wait()
    node = build_node(NodeConfig(backend="fake:1", store_path=db, alerts=None, single_writer=True))
    node.close()


def test_readers_do_not_trust_an_older_store_with_absurd_rows(tmp_path):
    """Rows written before the door refused them (t = 1e300, a value of 1e308) must not break
    `query`, `report`, `diagnose` or the dashboard."""
    db = tmp_path / "old.db"
    with Store(db) as st:
        for i in range(100):
            st.write("gpu_temperature_celsius", {"gpu": "0", "uuid": "u", "model": "m", "host": "h"}, 1.7e9 + i, 50.0)
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO samples (series_id, t, value) VALUES (1, 1e300, 1.0)")
    conn.execute("INSERT INTO samples (series_id, t, value) VALUES (1, 1700000200.0, 1e308)")
    conn.execute("INSERT INTO events (t, kind, labels, data) VALUES (1e300, 'xid', '{}', '{}')")
    conn.commit()
    conn.close()
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    for args in (["query", "gpu_temperature_celsius"], ["report", "--out", str(tmp_path / "r.html")], ["diagnose"]):
        r = subprocess.run([sys.executable, "-m", "gpulens.cli.main", *args, "--store", str(db)], capture_output=True,
                           text=True, env=env, timeout=120)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (args, r.stderr)
    from starlette.testclient import TestClient

    from gpulens.web import create_app

    with TestClient(create_app(store_path=db, allowed_hosts=["testserver"])) as client:
        for path in ("/api/meta", "/api/panel/gpu?range=15m"):
            assert client.get(path).status_code == 200, path
