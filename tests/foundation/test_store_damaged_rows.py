"""A store that opens but holds damaged rows (a hand edit, a bad disk): every command answers one
sentence naming the store, the table and the row, with exit 2, never a traceback; samples whose value
is no number the door would let in are left out of every read (docs/store.md, "What the store refuses")."""

from __future__ import annotations

import logging
import math
import shutil
import sqlite3

import pytest

from gpulens.cli.main import main
from gpulens.errors import EXIT_BAD_INPUT, StoreError
from gpulens.store import Store, alert_state, baselines, runs

T0 = 1_700_000_000.0
COMMANDS = [["diagnose"], ["energy"], ["report", "-o", "r.html"], ["scale"]]


@pytest.fixture
def damaged(tmp_path, replayed_store, monkeypatch):
    """damaged(sql) -> a copy of the replayed H200 store with `sql` run on it."""
    monkeypatch.chdir(tmp_path)  # the report's -o r.html lands here

    def make(sql: str):
        db = tmp_path / "x.db"
        shutil.copy(replayed_store, db)
        conn = sqlite3.connect(db, isolation_level=None)
        assert conn.execute(sql).rowcount > 0, sql
        conn.close()
        return db

    return make


def _run(argv, capsys, caplog):
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        rc = main(argv)
    out, err = capsys.readouterr()
    err = " ".join(err.split())
    assert "Traceback" not in out + err and not [r for r in caplog.records if r.levelno >= logging.ERROR], (argv, err)
    return rc, out, err


# (the damage, the table and column the sentence names)
STRUCTURE = {
    "data not JSON": ("UPDATE events SET data = '{garbage' WHERE id % 3 = 0", "events", "data", "is not a JSON object ('{garbage')"),
    "data a list": ("UPDATE events SET data = '[1,2]'", "events", "data", "is not a JSON object ('[1,2]')"),
    "data null": ("UPDATE events SET data = 'null'", "events", "data", "is not a JSON object ('null')"),
    "event labels not JSON": ("UPDATE events SET labels = 'not json'", "events", "labels", "is not a JSON object ('not json')"),
    "event label not text": ("""UPDATE events SET labels = '{"host":[1]}'""", "events", "labels", "holds a value that is not text"),
    # gpu_up (1) and gpu_energy_joules_total (16), which energy reads; infer_request_latency_seconds (65), which scale reads
    "series labels not JSON": ("UPDATE series SET labels = 'not json' WHERE id IN (1, 16, 65)", "series", "labels",
                               "is not a JSON object ('not json')"),
}


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("case", STRUCTURE)
def test_a_damaged_json_column_is_one_sentence_and_exit_2(damaged, capsys, caplog, case, command):
    sql, table, column, what = STRUCTURE[case]
    db = damaged(sql)
    rc, _, err = _run([*command, "--store", str(db)], capsys, caplog)
    assert rc == EXIT_BAD_INPUT, err
    assert f"The store {db} has a damaged row: the {column} column of {table} id " in err and what in err


def test_the_sentence_names_the_row_and_says_how_to_recover(damaged, capsys, caplog):
    db = damaged("UPDATE series SET labels = 'not json' WHERE name = 'gpu_power_watts'")
    sid = sqlite3.connect(db).execute("SELECT id FROM series WHERE name = 'gpu_power_watts'").fetchone()[0]
    rc, out, err = _run(["query", "gpu_power_watts", "--store", str(db)], capsys, caplog)
    assert rc == EXIT_BAD_INPUT and out == ""
    assert err == (f"error: The store {db} has a damaged row: the labels column of series id {sid} is not a JSON object "
                   "('not json'). → Restore it from a backup, or re-import its trace into a new store.")


@pytest.mark.parametrize("value", ["'abc'", "9e999", "-9e999", "X'00'", "1e300"], ids=["text", "inf", "-inf", "blob", "1e300"])
def test_samples_no_door_would_let_in_are_left_out(damaged, replayed_store, capsys, caplog, value):
    """A text in the REAL column is damage; an infinity an older gpulens stored before the door refused
    it. Treated alike: left out of every read, the rest of the store answers as before."""
    db = damaged(f"UPDATE samples SET value = {value} WHERE rowid % 5 = 0")
    for command in [*COMMANDS, ["query", "gpu_power_watts"]]:
        rc, _, err = _run([*command, "--store", str(db)], capsys, caplog)
        assert rc == 0, (command, err)
    with Store(replayed_store, readonly=True) as whole, Store(db, readonly=True) as st:
        (power,) = st.query("gpu_power_watts")
        (before,) = whole.query("gpu_power_watts")
        assert 0 < len(power) < len(before) and all(isinstance(v, float) and math.isfinite(v) for v in power.value)


def test_every_sample_read_leaves_a_damaged_value_out(tmp_path):
    db = tmp_path / "s.db"
    with Store(db) as st:
        for i in range(10):
            st.write("m", {"gpu": "0"}, T0 + i, float(i))
        st.flush()
        sid = st.stored_series("m")[0].id
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("UPDATE samples SET value = 'abc' WHERE t = ?", (T0 + 9,))  # the newest
    conn.execute("UPDATE samples SET value = 9e999 WHERE t = ?", (T0 + 5,))
    conn.execute("INSERT INTO samples (series_id, t, value) VALUES (?, 'later', 1.0)", (sid,))  # a time that is text
    conn.execute("UPDATE rollup_1m SET vmax = 'abc'")  # every bucket of the roll-up
    conn.close()
    kept = [float(i) for i in range(9) if i != 5]
    with Store(db, readonly=True) as st:
        assert st.query("m")[0].value == kept
        assert [p for d in st.query("m", start=T0, end=T0 + 9, max_points=3) for p in d.value_max] == [2.0, 4.0, 8.0]
        assert st.query("m", resolution="1m")[0].value == []
        assert [lv.value for lv in st.latest("m")] == [8.0]
        assert [s.value for s in st.window(sid, 0, 2e9)] == kept
        assert st.window_columns([sid], 0, 2e9).value == kept
        assert [s.value for s in st.window_after(sid, 0, 2e9, 0)[0]] == kept
        assert [v for _, _, v in st.samples_after(["m"])[0]] == kept
        assert st.last_value(sid, T0 + 9, 5) == 8.0 and st.value_at_or_before(sid, T0 + 5) == 4.0
        s = st.summary([sid], T0, T0 + 9)
        assert (s.count, s.total, s.minimum, s.maximum) == (8, sum(kept), 0.0, 8.0)
        assert st.summary([sid], T0, T0 + 9 * 3600, rollup_over_seconds=60).maximum == 8.0  # the roll-up left out
        assert not st.has_samples([sid], T0 + 9, T0 + 9)


def test_the_features_tables_refuse_a_damaged_row_too(tmp_path):
    db = tmp_path / "r.db"
    with Store(db) as s:
        alert_state.save_alert(s, alert_state.AlertRow("GpuHot", "warning", {"gpu": "0"}, "firing", T0, 91.0, "hot", "cool it"))
        alert_state.insert_silence(s, [("gpu", "=", "0")], starts_at=T0, ends_at=T0 + 60, comment="rma")
        baselines.save_baseline(s, baselines.BaselineRow(1, "m", {"gpu": "0"}, "ready", T0, 60.0, quantiles={0.5: 5.0}))
        run_id, _ = runs.insert_run(s, kind="bench", name="x", created=T0, started=None, ended=None, config_json="{}",
                                    summary_json="{}", fingerprint_json="{}", samples={"tps": [1.0]}, changes_of=lambda c, f: [])
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("UPDATE alert_history SET annotations = 'x'")
    conn.execute("UPDATE alert_silences SET matchers = '[[1, 2]]'")
    conn.execute("""UPDATE alert_baselines SET quantiles = '{"half": 5}'""")
    conn.execute("UPDATE runs SET config = '[]'")
    conn.execute("UPDATE run_samples SET vals = '{'")
    conn.close()
    with Store(db) as s:
        for read, where in [
            (lambda: alert_state.load_alerts(s), "the annotations column of alert_history id 1 is not a JSON object ('x')"),
            (lambda: alert_state.list_silences(s), "the matchers column of alert_silences id 1 is not a list of [label, op, value]"),
            (lambda: baselines.load_baselines(s), "alert_baselines id 1 holds something that is not a number"),
            (lambda: runs.list_runs(s), f"the config column of runs id {run_id} is not a JSON object ('[]')"),
            (lambda: runs.run_samples(s, run_id), f"the vals column of run_samples (run {run_id}, metric tps) is not a JSON list"),
        ]:
            with pytest.raises(StoreError) as e:
                read()
            assert str(e.value).startswith(f"The store {db} has a damaged row: ") and where in str(e.value), str(e.value)


def test_a_damaged_row_an_old_store_migrates_is_one_sentence(tmp_path):
    db = tmp_path / "old.db"
    Store(db).close()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("""INSERT INTO series (id, name, labels) VALUES (7, 'train_loss', '{"job": "llama", broken')""")
    conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")  # before the train_job rename
    conn.close()
    with pytest.raises(StoreError, match=r"has a damaged row: the labels column of series id 7 is not a JSON object"):
        Store(db)
