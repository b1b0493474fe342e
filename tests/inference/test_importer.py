"""Recorded request / cold_start / mem records -> inference series and events."""

from __future__ import annotations

import json

import pytest

from gpulens.store import Store
from gpulens.vocab import names as N


def test_h200_requests_become_series_and_events(replayed_store, h200_trace):
    recs = [json.loads(line) for line in (h200_trace / "events.jsonl").open()]
    reqs = [r for r in recs if r["kind"] == "request"]
    with Store(replayed_store, readonly=True) as s:
        events = s.events(N.EV_REQUEST)
        assert len(events) == len(reqs) == 106
        lat = s.query(N.INFER_LATENCY_SECONDS)
        assert len(lat) == 1 and lat[0].key.labels["service"] == "h200-demo"
        assert lat[0].key.labels["model"] == "m400m"  # the model of the cold start before serving
        want = sorted(r["end"] - r["arrival"] for r in reqs)
        assert sorted(lat[0].value) == pytest.approx(want)
        ttft = s.query(N.INFER_TTFT_SECONDS)[0].value
        assert sorted(ttft) == pytest.approx(sorted(r["first_token"] - r["arrival"] for r in reqs))
        assert sorted(s.query(N.INFER_TPOT_SECONDS)[0].value) == pytest.approx(sorted(r["tpot_s"] for r in reqs))
        assert s.query(N.INFER_REQUESTS_TOTAL, {"status": "ok"})[0].value[-1] == 106
        assert max(s.query(N.INFER_QUEUE_DEPTH)[0].value) == max(r["queue_depth_at_start"] for r in reqs)
        assert max(s.query(N.INFER_BATCH_SIZE)[0].value) == max(r["batch"] for r in reqs)
        assert max(s.query(N.INFER_IN_FLIGHT)[0].value) > 1  # overlapping requests under load
        assert s.query(N.INFER_COLD_START_SECONDS)[0].value == pytest.approx([7.782], abs=1e-3)
        mem = [r for r in recs if r["kind"] == "mem"]
        assert len(s.query(N.INFER_MEMORY_RESERVED_BYTES)[0].value) == len(mem)
        assert "phase" not in events[0].data  # kept only as recorded_phase, for tests


def test_colocation_requests_count_latency_from_the_intended_time(tmp_path, colocation_trace):
    from gpulens.pipeline.ingest import import_trace

    recs = [json.loads(line) for line in (colocation_trace / "coloc_events.jsonl").open()]
    reqs = [r for r in recs if r["kind"] == "request"]
    with Store(tmp_path / "c.db") as s:
        import_trace(colocation_trace, s)
        lat = s.query(N.INFER_LATENCY_SECONDS)[0].value
        assert sorted(lat) == pytest.approx(sorted(r["end"] - r["intended"] for r in reqs))
        queue = s.query(N.INFER_QUEUE_WAIT_SECONDS)[0].value
        assert max(queue) > 1.0  # the backlog behind the first, slow requests
        ev = s.events(N.EV_REQUEST)[0]
        assert ev.data["pid"] == reqs[0]["pid"] and ev.data["status"] == "ok"
