"""Training records rebuilt from scraped histograms (gpulens.reader.prometheus_records), and the
`train_rank_info` gauge they join through (gpulens.exporter.ranks). The scrapes here are the samples a
range read returns; the whole path through a real Prometheus is tests/diagnose/test_fleet_rig.py."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from gpulens.exporter.exposition import render_text
from gpulens.exporter.prometheus import LatestReadings, make_registry
from gpulens.reader.prometheus_records import interval_increases, rank_processes, step_records
from gpulens.store import Store
from gpulens.vocab import names as N

RANK = {N.TRAIN_JOB_LABEL: "j", "rank": "3", "host": "node-1", "instance": "a:1"}
T = [100.0, 101.0, 102.0, 103.0]


def _scrapes(series: dict[str, tuple[dict, list[float]]]):
    def raw(metric, match, lo, hi):
        out = []
        if metric in series:
            labels, values = series[metric]
            if all(labels.get(k) == v for k, v in (match or {}).items()):
                pts = [(t, v) for t, v in zip(T, values, strict=True) if lo <= t <= hi]
                out.append((dict(labels), [p[0] for p in pts], [p[1] for p in pts]))
        return out

    return raw


def test_interval_increases():
    assert interval_increases([1, 2, 3], [2, 2, 5], born_inside=True) == [(0, 1, 2), (2, 3, 3)]
    assert interval_increases([1, 2, 3], [4, 1, 1], born_inside=False) == [(1, 2, 1)]  # a drop is a restart


def test_a_record_per_scrape_interval_holds_the_means():
    raw = _scrapes({
        N.TRAIN_STEP_SECONDS + "_count": (RANK, [10, 14, 14, 16]),
        N.TRAIN_STEP_SECONDS + "_sum": (RANK, [5.0, 7.0, 7.0, 8.5]),
        N.TRAIN_COMM_WAIT_SECONDS + "_sum": (RANK, [1.0, 1.8, 1.8, 1.8]),
        N.TRAIN_CHECKPOINT_SECONDS + "_sum": (RANK, [0.0, 0.0, 0.0, 0.6]),
        N.RANK_INFO: ({**RANK, N.PID_LABEL: "4242", N.CUDA_DEVICE_LABEL: "3"}, [1, 1, 1, 1]),
    })
    recs = step_records(raw, None, 100.5, 103.0, lookback=300)
    assert [(e.t, e.data["t_start"], e.data["steps"]) for e in recs] == [(101.0, 100.0, 4), (103.0, 102.0, 2)]
    first, second = (e.data for e in recs)
    assert first["step_s"] == 0.5 and first["comm_wait_s"] == 0.2 and first["checkpoint_s"] == 0.0
    assert second["step_s"] == 0.75 and second["comm_wait_s"] == 0.0 and second["checkpoint_s"] == 0.3
    assert "data_wait_s" not in first  # a part the rank does not measure stays unmeasured, not 0
    assert first["pid"] == 4242 and first["rank"] == 3 and recs[0].labels["host"] == "node-1"
    (start,) = rank_processes(raw, {"rank": "3"}, 100.0, 103.0, lookback=300)
    assert start.kind == N.EV_TRAIN_START and start.data == {"pid": 4242, "gpu": 3, "rank": 3}
    assert N.PID_LABEL not in start.labels and start.labels["rank"] == "3"
    assert step_records(raw, {"rank": "4"}, 100.0, 103.0, lookback=300) == []


def test_the_agent_exports_each_fresh_rank_with_its_process(tmp_path):
    now = time.time()
    with Store(tmp_path / "node.db") as st:
        for rank, t in (("0", now - 5), ("1", now - 500)):  # rank 1's steps are stale
            labels = {N.TRAIN_JOB_LABEL: "j", "rank": rank, "host": "node-1"}
            st.event(N.EV_TRAIN_START, t - 60, labels, {"pid": 7000 + int(rank), "rank": int(rank), "gpu": int(rank)})
            st.write(N.TRAIN_STEP_SECONDS, labels, t, 0.5)
        st.event(N.EV_TRAIN_START, now - 10, {N.TRAIN_JOB_LABEL: "j", "rank": "0", "host": "node-1"}, {"pid": 7100, "gpu": 2})  # restarted
        st.flush()
        text = render_text(make_registry(LatestReadings(host="node-1"), store=st)).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    samples = [(s.labels, s.value) for s in fams[N.RANK_INFO].samples]
    assert samples == [({N.TRAIN_JOB_LABEL: "j", "rank": "0", "host": "node-1", N.PID_LABEL: "7100", N.CUDA_DEVICE_LABEL: "2"}, 1.0)]
