"""Diagnosis reads through the Reader seam: a Store and its StoreReader give the same findings, the
co-location analysis only reads, the dashboard's Prometheus reader says in one sentence that the
analysis reader answers diagnosis, and the tracker bridge gets its findings from the callback it is given."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpulens.data import bundled_colocation_trace
from gpulens.diagnose import DiagnoseScope, diagnose
from gpulens.diagnose.colocation import COLOCATION_SERIES, colocation_marks
from gpulens.pipeline.ingest import import_trace
from gpulens.reader import AnalysisReader, CannotAnswerError, StoreReader
from gpulens.store import Store


@pytest.fixture(scope="module")
def colocated(tmp_path_factory):
    db = tmp_path_factory.mktemp("seam") / "c.db"
    with Store(db) as st:
        import_trace(bundled_colocation_trace(), st)
    return db


def test_a_store_and_its_reader_give_the_same_findings(colocated):
    with Store(colocated, readonly=True) as st:
        from_store = [f.to_dict() for f in diagnose(st)]
    with StoreReader(colocated) as r:
        assert isinstance(r, AnalysisReader)
        from_reader = [f.to_dict() for f in diagnose(r, DiagnoseScope())]
    assert from_store and from_store == from_reader
    assert "colocation" in {f["kind"] for f in from_reader}


def test_colocation_marks_only_read(colocated):
    with Store(colocated, readonly=True) as st:
        before = st.data_version()
        rng = st.time_range()
        assert rng is not None
        marks = colocation_marks(StoreReader(st), rng[1], window_seconds=rng[1] - rng[0])
        assert st.data_version() == before  # nothing written: the pipeline's watch writes the marks
        marked = {tuple(sorted(lv.key.labels.items())) for lv in st.latest(COLOCATION_SERIES)}
    assert [m.value for m in marks] == [1.0] and tuple(sorted(marks[0].labels.items())) in marked


def test_the_panel_reader_points_diagnosis_at_the_analysis_reader():
    from gpulens.reader.prometheus import PrometheusAnalysisReader
    from gpulens.views.prometheus import PrometheusReader

    r = PrometheusReader("http://127.0.0.1:1")  # never asked: the analysis questions fail before any query
    with pytest.raises(CannotAnswerError) as e:
        diagnose(r)
    assert "PrometheusAnalysisReader" in e.value.message and "--prometheus" in str(e.value) and e.value.exit_code == 3
    assert isinstance(PrometheusAnalysisReader("http://127.0.0.1:1"), AnalysisReader)  # the protocol, structurally
    assert r.api.url == "http://127.0.0.1:1"  # one transport (gpulens.reader.prometheus_api) for both readers


def test_the_tracker_bridge_logs_the_findings_its_callback_gives(tmp_path):
    from gpulens.integrations.trackers import TrackerBridge
    from gpulens.workload.training.monitor import TrainingMonitor

    logged: list[list[dict]] = []

    class Memory:
        name = "memory"

        def log_metrics(self, values, step):
            pass

        def log_findings(self, findings, step):
            logged.append(findings)

        def close(self):
            pass

    mon = TrainingMonitor(job="j", store=tmp_path / "t.db", flush_interval_seconds=0.1)
    try:
        seen = []
        bridge = TrackerBridge(mon, [Memory()], findings=lambda m: seen.append(m.job) or [{"kind": "input_bound", "severity": "warning"}])
        bridge.finish()
        assert seen == ["j"] and logged == [[{"kind": "input_bound", "severity": "warning"}]]
        quiet = TrackerBridge(mon, [Memory()])  # no callback: no findings
        quiet.finish()
        assert len(logged) == 1
    finally:
        mon.close()


def test_the_tracker_bridge_does_not_import_the_diagnosis():
    import gpulens.integrations.trackers as trackers

    tree = ast.parse(Path(trackers.__file__).read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(m == "gpulens.diagnose" or m.startswith("gpulens.diagnose.") for m in imported)
