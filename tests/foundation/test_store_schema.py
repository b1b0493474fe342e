"""Schema versions and migrations of the store, a store from a newer gpulens, and a full disk."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from testlib import fill_disk, tiny_tmpfs

from gpulens.cli.main import main
from gpulens.errors import EXIT_BAD_INPUT, EXIT_STORAGE_FULL, StorageFullError, StoreError
from gpulens.store import Store
from gpulens.store.migrations import SCHEMA_VERSION
from gpulens.store.schema import CORE_TABLES

# The store as gpulens wrote it before versioned migrations (schema 1) and before the training
# label was renamed: `job` in training series and events.
OLD_SERIES = [
    (1, "train_step_seconds", {"job": "llama", "rank": "0"}),
    (2, "train_tokens_per_second", {"job": "llama"}),  # a train_* series without a rank
    (3, "gpu_utilization_ratio", {"gpu": "0", "host": "n1", "job": "node-exporter"}),  # not training: kept
    (4, "train_step_seconds", {"train_job": "llama", "rank": "0"}),  # the twin a newer gpulens already wrote
    (5, "train_step_seconds", {"job": "llama", "rank": "1"}),
]
OLD_EVENTS = [
    (1, 100.0, "train_step", {"job": "llama", "rank": "0"}),
    (2, 101.0, "train_start", {"job": "llama"}),
    (3, 102.0, "request", {"job": "batch", "service": "chat"}),  # not training: kept
    (4, 103.0, "note", {"job": "llama", "rank": "0"}),  # labelled with a rank: training
]


def _labels(d: dict[str, str]) -> str:
    return json.dumps(dict(sorted(d.items())), separators=(",", ":"))


def build_old_store(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    for sql in CORE_TABLES:
        conn.execute(sql)
    conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    conn.executemany("INSERT INTO series (id, name, labels) VALUES (?, ?, ?)", [(i, n, _labels(lb)) for i, n, lb in OLD_SERIES])
    for sid in (1, 4, 5):
        conn.executemany("INSERT INTO samples VALUES (?, ?, ?)", [(sid, 100.0 + k, float(sid)) for k in range(3)])
        conn.execute("INSERT INTO rollup_1m VALUES (?, 60, ?, ?, ?, 3)", (sid, float(sid), float(sid), 3.0 * sid))
    conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, '{}')", [(i, t, k, _labels(lb)) for i, t, k, lb in OLD_EVENTS])
    conn.close()


def test_new_store_is_at_the_current_schema_with_every_table(tmp_path):
    with Store(tmp_path / "s.db") as st:
        assert st.schema_version == SCHEMA_VERSION
    conn = sqlite3.connect(tmp_path / "s.db")
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    conn.close()
    assert {"series", "samples", "events", "alert_history", "alert_silences", "alert_baselines", "runs"} <= tables


def test_old_store_is_migrated_job_to_train_job_for_training_only(tmp_path):
    db = tmp_path / "old.db"
    build_old_store(db)
    with Store(db) as st:
        assert st.schema_version == SCHEMA_VERSION
        names = {(k.name, k.labels_json) for k in st.series()}
        assert ("train_tokens_per_second", _labels({"train_job": "llama"})) in names
        assert ("gpu_utilization_ratio", _labels({"gpu": "0", "host": "n1", "job": "node-exporter"})) in names
        assert not any('"job"' in lj for n, lj in names if n.startswith("train_"))
        # The old rank-0 series folded into the twin: one series, all six samples, roll-ups merged.
        rank0 = st.query("train_step_seconds", {"train_job": "llama", "rank": "0"})
        assert len(rank0) == 1 and sorted(rank0[0].value) == [1.0] * 3 + [4.0] * 3
        (rolled,) = st.query("train_step_seconds", {"rank": "0"}, resolution="1m")
        assert rolled.count == [6] and rolled.value_min == [1.0] and rolled.value_max == [4.0]
        assert [k.labels for k in st.series("train_step_seconds", {"rank": "1"})] == [{"train_job": "llama", "rank": "1"}]
        ev = {e.id: e.labels for e in st.events()}
        assert ev[1] == {"train_job": "llama", "rank": "0"} and ev[2] == {"train_job": "llama"}
        assert ev[3] == {"job": "batch", "service": "chat"}
        assert ev[4] == {"train_job": "llama", "rank": "0"}
    # Opening again changes nothing (the migration ran once).
    with Store(db) as st:
        assert len(st.series("train_step_seconds")) == 2


def test_migrated_old_store_answers_diagnose_by_job(tmp_path, capsys):
    db = tmp_path / "old.db"
    build_old_store(db)
    assert main(["diagnose", "--job", "llama", "--store", str(db), "--format", "json"]) == 0
    out = capsys.readouterr()
    assert "no training job" not in (out.out + out.err).lower()


def test_store_from_a_newer_gpulens_is_refused(tmp_path, capsys):
    db = tmp_path / "new.db"
    Store(db).close()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    conn.close()
    with pytest.raises(StoreError) as err:
        Store(db)
    assert err.value.message == (
        f"This store was written by a newer gpulens (schema {SCHEMA_VERSION + 1}, this one knows {SCHEMA_VERSION}); "
        "upgrade gpulens or use another --store."
    )
    assert main(["query", "gpu_utilization_ratio", "--store", str(db)]) == EXIT_BAD_INPUT
    assert "newer gpulens" in capsys.readouterr().err


def test_a_failed_migration_leaves_the_store_as_it_was(tmp_path, monkeypatch):
    from gpulens.store import migrations

    db = tmp_path / "old.db"
    build_old_store(db)

    def boom(conn):
        conn.execute("UPDATE series SET labels = '{}'")
        raise sqlite3.OperationalError("simulated failure half-way")

    monkeypatch.setattr(migrations, "MIGRATIONS", (*migrations.MIGRATIONS[:1], migrations.Migration(2, "boom", boom)))
    with pytest.raises(StoreError):
        Store(db)
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("1",)
    assert conn.execute("SELECT labels FROM series WHERE id = 1").fetchone() == (_labels({"job": "llama", "rank": "0"}),)
    conn.close()


def test_full_database_is_a_storage_full_error_and_keeps_committed_data(tmp_path):
    """SQLite's own "database or disk is full", from a page limit on the store's connection."""
    db = tmp_path / "s.db"
    st = Store(db)
    st.write("m", {"gpu": "0"}, 1.0, 1.0)
    st.flush()
    with st._guard("limit") as conn:  # this test reaches in to set a size limit on the same connection
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")
    for i in range(5_000):
        st.write("m", {"gpu": "0"}, 2.0 + i, float(i))
    with pytest.raises(StorageFullError) as err:
        st.flush()
    assert err.value.exit_code == EXIT_STORAGE_FULL and "is full" in err.value.message
    assert st.pending_count == 5_000  # kept for a retry
    with st._guard("limit") as conn:
        conn.execute("PRAGMA max_page_count = 1073741823")
    assert st.flush() == 5_000
    st.close()


def test_cli_on_a_full_disk_says_so_in_one_sentence_and_exits_4(tmp_path):
    with tiny_tmpfs(tmp_path, "1m") as mnt:
        db = mnt / "s.db"
        with Store(db) as st:
            for i in range(100):
                st.write("kept_total", None, float(i), float(i))
        filler = fill_disk(mnt)  # fill the disk, then give back a little: the store opens, then fills
        with open(filler, "r+b") as f:
            f.truncate(max(0, filler.stat().st_size - 160 * 1024))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        r = subprocess.run(
            [sys.executable, "-m", "gpulens.cli.main", "replay", "--store", str(db)],
            capture_output=True, text=True, env=env, timeout=120,
        )
        assert r.returncode == EXIT_STORAGE_FULL, r.stderr
        said = " ".join(r.stderr.split())  # the terminal renderer wraps long lines
        # The sampling loop logs the failing sink once (a warning, no traceback); the CLI ends with the error.
        assert "Traceback" not in said and f"error: The disk that holds the store {db} is full." in said
        filler.unlink()
        with Store(db) as st:
            (kept,) = st.query("kept_total")
            assert kept.value == [float(i) for i in range(100)]


def test_old_store_with_feature_tables_keeps_their_rows(tmp_path):
    """Before versioned migrations each feature created its tables on first use: they may exist."""
    from gpulens.store import alert_state
    from gpulens.store.schema import ALERT_TABLES

    db = tmp_path / "old.db"
    build_old_store(db)
    conn = sqlite3.connect(db, isolation_level=None)
    for sql in ALERT_TABLES:
        conn.execute(sql)
    conn.execute(
        "INSERT INTO alert_history (fingerprint, rule, severity, labels, state, active_since, value, summary, advice, annotations) "
        "VALUES ('f', 'GpuHot', 'warning', '{\"gpu\":\"0\"}', 'firing', 1.0, 90.0, 's', 'a', '{}')"
    )
    conn.close()
    with Store(db) as st:
        assert st.schema_version == SCHEMA_VERSION
        (a,) = alert_state.load_alerts(st)
        assert a.rule == "GpuHot" and a.labels == {"gpu": "0"}


def test_sqlite_file_of_another_program_is_one_clear_error(tmp_path, capsys):
    db = tmp_path / "other.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE contacts (name TEXT)")
    conn.close()
    assert main(["diagnose", "--store", str(db)]) == EXIT_BAD_INPUT
    err = " ".join(capsys.readouterr().err.split())
    assert f"{db} is an SQLite database but not a gpulens store: it holds tables but no gpulens schema version." in err
    assert "Traceback" not in err


@pytest.mark.parametrize(("value", "why"), [
    ("abc", "its schema version 'abc' is not a whole number"),
    ("-3", "its schema version '-3' is not a whole number"),
    ("1.5", "its schema version '1.5' is not a whole number"),
    (None, "its meta table has no schema_version"),
])
@pytest.mark.parametrize("command", [["query", "gpu_utilization_ratio"], ["diagnose"]])
def test_damaged_schema_version_is_refused_and_left_as_it_was(tmp_path, capsys, value, why, command):
    """A version that is not a count of migrations is neither migrated from nor read as current:
    re-running every migration on a store could rename its labels twice."""
    db = tmp_path / "s.db"
    Store(db).close()
    conn = sqlite3.connect(db, isolation_level=None)
    if value is None:
        conn.execute("DELETE FROM meta WHERE key = 'schema_version'")
    else:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (value,))
    tables_before = conn.execute("SELECT name FROM sqlite_master ORDER BY name").fetchall()
    conn.close()
    assert main([*command, "--store", str(db)]) == EXIT_BAD_INPUT
    err = " ".join(capsys.readouterr().err.split())
    assert f"{db} is an SQLite database but not a gpulens store: {why}." in err and "Traceback" not in err
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ((value,) if value else None)
    assert conn.execute("SELECT name FROM sqlite_master ORDER BY name").fetchall() == tables_before
    conn.close()


def test_no_room_for_the_store_folder_is_storage_full_too(tmp_path):
    with tiny_tmpfs(tmp_path, "256k", "noinodes", nr_inodes=2) as mnt:
        (mnt / "taken").write_bytes(b"")  # the last free inode
        with pytest.raises(StorageFullError) as err:
            Store(mnt / "new" / "s.db")
        assert err.value.exit_code == EXIT_STORAGE_FULL
