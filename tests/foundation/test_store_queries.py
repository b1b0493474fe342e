"""The store's typed queries (what the alert evaluator, the dashboard and diagnosis ask instead of
running SQL) and its repositories, against a real SQLite file."""

from __future__ import annotations

import pytest

from gpulens.store import DataVersion, Sample, SampleSummary, Store, alert_state, baselines, runs

T0 = 1_700_000_000.0


@pytest.fixture
def st(tmp_path):
    s = Store(tmp_path / "q.db")
    for i in range(10):
        s.write("gpu_power_watts", {"gpu": "0"}, T0 + i, 100.0 + i)
        s.write("gpu_power_watts", {"gpu": "1"}, T0 + i, 200.0 + i)
    s.event("xid", T0 + 5, {"gpu": "0"}, {"xid": 79})
    s.flush()
    yield s
    s.close()


def test_series_by_id_and_their_windows(st):
    rows = st.stored_series("gpu_power_watts")
    assert [r.labels for r in rows] == [{"gpu": "0"}, {"gpu": "1"}] and st.max_series_id() == rows[-1].id
    assert st.series_since(rows[0].id) == [rows[1]]
    sid = rows[0].id
    assert st.window(sid, T0 + 2, T0 + 4) == [Sample(T0 + 3, 103.0), Sample(T0 + 4, 104.0)]  # (start, end]
    assert st.window(sid, T0 + 2, T0 + 4, include_start=True)[0] == Sample(T0 + 2, 102.0)
    assert st.last_value(sid, T0 + 4.5, 1.0) == 104.0 and st.last_value(sid, T0 + 20, 1.0) is None
    assert st.value_at_or_before(sid, T0 + 20) == 109.0 and st.value_at_or_before(sid, T0 - 1) is None
    assert st.first_sample_time(sid) == T0 and st.count_samples(sid, T0, T0 + 4) == 5
    both = st.window_columns([r.id for r in rows], T0, T0 + 1)
    assert both.t == [T0, T0, T0 + 1, T0 + 1] and sorted(both.value) == [100.0, 101.0, 200.0, 201.0]
    assert st.has_samples([sid], T0 + 9, T0 + 30) and not st.has_samples([sid], T0 + 10, T0 + 30)
    assert st.label_values("gpu") == ["0", "1"] and st.has_table("alert_baselines")


def test_summary_over_rollups_equals_raw(tmp_path):
    s = Store(tmp_path / "long.db")
    for i in range(4 * 3600 // 10):  # four hours, a sample every 10 s
        s.write("m", None, T0 + 7 + 10 * i, float(i % 13))
    s.flush()
    (sid,) = [r.id for r in s.stored_series("m")]
    start, end = T0 + 33, T0 + 4 * 3600 - 21
    raw = s.summary([sid], start, end, rollup_over_seconds=10 * 3600)
    rolled = s.summary([sid], start, end, rollup_over_seconds=3600)
    assert rolled == raw and raw.count > 1000
    assert s.summary([], start, end) == SampleSummary(0, 0.0, None, None)
    s.close()


def test_data_version_moves_when_data_is_added(st):
    v = st.data_version()
    assert isinstance(v, DataVersion) and st.data_version() == v
    st.event("note", T0 + 11, None, {"text": "x"})
    st.flush()
    assert st.data_version() != v


def test_events_can_exclude_their_start(st):
    assert [e.t for e in st.events("xid", start=T0 + 5)] == [T0 + 5]
    assert st.events("xid", start=T0 + 5, include_start=False) == []


def test_repositories_keep_their_rows_across_reopen(tmp_path):
    db = tmp_path / "r.db"
    with Store(db) as s:
        aid = alert_state.save_alert(s, alert_state.AlertRow("GpuHot", "warning", {"gpu": "0"}, "firing", T0, 91.0, "hot", "cool it"))
        sil = alert_state.insert_silence(s, [("gpu", "=", "0")], starts_at=T0, ends_at=T0 + 60, comment="rma")
        baselines.save_baseline(s, baselines.BaselineRow(1, "m", {"gpu": "0"}, "ready", T0, 60.0, median=5.0, mad=1.0,
                                                         samples=10, quantiles={0.5: 5.0}, profile={3: {"samples": 10}}))
        run_id, changes = runs.insert_run(s, kind="bench", name="x", created=T0, started=None, ended=None, config_json="{}",
                                          summary_json="{}", fingerprint_json="{}", samples={"tps": [1.0, 2.0]},
                                          changes_of=lambda c, f: [])
        assert changes == []
    with Store(db) as s:
        (a,) = alert_state.load_alerts(s, active_only=True)
        assert a.id == aid and a.labels == {"gpu": "0"} and a.value == 91.0
        assert alert_state.list_silences(s, T0 + 1) == [sil]
        assert alert_state.expire_silence(s, sil.id, T0 + 2) and not alert_state.expire_silence(s, sil.id, T0 + 3)
        (b,) = baselines.load_baselines(s)
        assert b.median == 5.0 and b.quantiles == {0.5: 5.0} and b.profile == {3: {"samples": 10}}
        assert runs.get_run(s, run_id).kind == "bench" and runs.run_samples(s, run_id) == {"tps": [1.0, 2.0]}


def test_run_and_its_changes_are_one_transaction(tmp_path):
    """A failure while computing the changes leaves no half-saved run behind."""
    with Store(tmp_path / "t.db") as s:
        runs.insert_run(s, kind="k", name="n", created=T0, started=None, ended=None, config_json='{"a": 1}',
                        summary_json="{}", fingerprint_json="{}", samples={}, changes_of=lambda c, f: [])

        def boom(c, f):
            raise RuntimeError("diff failed")

        with pytest.raises(RuntimeError):
            runs.insert_run(s, kind="k", name="n", created=T0 + 1, started=None, ended=None, config_json='{"a": 2}',
                            summary_json="{}", fingerprint_json="{}", samples={"x": [1.0]}, changes_of=boom)
        assert runs.run_count(s) == (1, 1)
