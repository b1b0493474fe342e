"""RequestRecord: one write path (monitor, middleware through it, importer) and one parser."""

from __future__ import annotations

import pytest

from gpulens.stats import percentile
from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.workload.importers import ImportContext
from gpulens.workload.inference import InferenceMonitor
from gpulens.workload.inference.importer import import_request
from gpulens.workload.inference.records import (
    RequestRecord,
    request_from_dict,
    request_from_event,
    write_request,
)


def test_parse_once_with_the_old_fallback_keys():
    # Older traces: no arrival (intended instead), no start, no end in data (the event time).
    r = request_from_dict({"intended": 9.5, "status": "timeout", "pid": "42", "batch": 4}, t=12.0)
    assert r is not None
    assert (r.arrival_t, r.start_t, r.end_t, r.status, r.pid, r.batch_size) == (9.5, 9.5, 12.0, "timeout", 42, 4)
    assert r.latency_seconds == 2.5 and r.queue_wait_seconds == 0.0 and r.intended_t == 9.5
    assert request_from_dict({"status": "ok"}) is None  # no end at all


def test_event_format_round_trips_and_keeps_unknown_fields():
    rec = RequestRecord(arrival_t=1.0, start_t=1.5, end_t=3.0, first_token_t=2.0, output_tokens=11,
                        tpot_seconds=0.1, pid=7, prompt_tokens=20, extra={"recorded_phase": "warm"})
    data = rec.to_event_data()
    assert data["arrival"] == 1.0 and data["start"] == 1.5 and data["first_token"] == 2.0 and data["end"] == 3.0
    assert data["tpot_s"] == 0.1 and data["recorded_phase"] == "warm"
    assert request_from_dict(data) == rec


def test_monitor_and_importer_write_the_same_request_the_same_way(tmp_path):
    """arrival 100, start 100.5, first token 101, 5 tokens, end 103: the same series and event
    from the live monitor and from a trace import."""
    t = [100.0]
    with Store(tmp_path / "live.db") as live:
        mon = InferenceMonitor(live, service="chat", model="m", host="h", clock=lambda: t[0], flush_interval_seconds=None)
        h = mon.start_request()
        t[0] = 100.5
        h.started()
        t[0] = 101.0
        h.token()
        t[0] = 103.0
        h.finish("ok", output_tokens=5, prompt_tokens=20)
        mon.flush()
        (ev_live,) = live.events(N.EV_REQUEST)
        live_series = {n: [v for s in live.query(n) for v in s.value]
                       for n in (N.INFER_LATENCY_SECONDS, N.INFER_TTFT_SECONDS, N.INFER_TPOT_SECONDS, N.INFER_QUEUE_WAIT_SECONDS)}
    with Store(tmp_path / "trace.db") as traced:
        record = {"kind": "request", "arrival": 100.0, "start": 100.5, "first_token": 101.0, "end": 103.0,
                  "status": "ok", "output_tokens": 5, "prompt_tokens": 20}
        import_request(record, traced, ImportContext(service="chat", model="m", host="h"))
        traced.flush()
        (ev_trace,) = traced.events(N.EV_REQUEST)
        trace_series = {n: [v for s in traced.query(n) for v in s.value] for n in live_series}
    a, b = request_from_event(ev_live), request_from_event(ev_trace)
    assert a is not None and b is not None
    fields = ("arrival_t", "start_t", "first_token_t", "end_t", "status", "output_tokens", "prompt_tokens", "tpot_seconds")
    assert {f: getattr(a, f) for f in fields} == {f: getattr(b, f) for f in fields}
    assert live_series == trace_series
    assert live_series[N.INFER_TPOT_SECONDS] == [pytest.approx(0.5)]


def test_same_requests_same_p99_in_diagnosis_dashboard_and_report(tmp_path):
    """One percentile everywhere: the slo_violation finding, the dashboard reader's stat, the
    report's headline number and `bench serve`'s histogram all equal gpulens.stats.percentile of
    the latencies (which, for these 20 requests, is not what nearest-rank gives)."""
    from gpulens.diagnose import DiagnoseScope, diagnose
    from gpulens.diagnose.inference import set_slos
    from gpulens.reader import StoreReader
    from gpulens.report.build import build_report_data

    db = tmp_path / "s.db"
    latencies = [0.1 + 0.01 * i for i in range(19)] + [2.0]
    with Store(db) as st:
        for i, lat in enumerate(latencies):
            arrival = 1000.0 + i
            write_request(st, {"service": "chat", "model": "m", "host": "h"},
                          RequestRecord(arrival_t=arrival, start_t=arrival, end_t=arrival + lat))
        set_slos(st, ["p99_latency<=50ms"], "chat")
    expected = percentile(latencies, 99)
    assert expected is not None and expected != pytest.approx(max(latencies))  # nearest-rank: 2.0

    with Store(db, readonly=True) as st:
        (slo,) = [f for f in diagnose(st, DiagnoseScope(service="chat")) if f.kind == "slo_violation"]
    assert slo.evidence["missed"][0]["value"] == pytest.approx(expected)
    with StoreReader(db) as r:
        assert r.aggregate(N.INFER_LATENCY_SECONDS, {"service": "chat"}, "p99", 0, 2000) == pytest.approx(expected)
    report = build_report_data(db, service="chat")
    stats = {s.id: s.value for p in report.panels for s in p.stats}
    assert stats["latency_p99"] == pytest.approx(expected)
    # `bench serve` records into HdrHistogram; its p99 is the same definition, to within 0.1%.
    from gpulens.bench.serve.stats import Distribution

    d = Distribution()
    for lat in latencies:
        d.record(lat)
    assert d.percentile(99) == pytest.approx(expected, rel=2e-3)


def test_times_outside_the_stores_range_are_not_the_requests():
    """An arrival of 1e300 (or -inf, NaN) became the request's arrival, and `gpulens diagnose` and
    `gpulens report` died formatting it (OverflowError) after `gpulens replay` had imported it."""
    for bad in (1e300, -1e300, float("inf"), float("nan"), -5.0):
        r = request_from_dict({"arrival": bad, "start": 100.5, "first_token": bad, "end": 103.0, "intended": bad})
        assert r is not None and (r.arrival_t, r.start_t, r.first_token_t, r.intended_t) == (100.5, 100.5, None, 100.5), bad
        assert request_from_dict({"end": bad}) is None
    r = request_from_dict({"end": 103.0, "output_tokens": float("inf"), "batch": float("nan")})
    assert r is not None and r.output_tokens is None and r.batch_size is None


def test_replay_diagnose_and_report_of_a_trace_with_absurd_request_times(h200_trace, tmp_path, capsys):
    import json

    from testlib import replay_diagnose_and_report

    lines = (h200_trace / "events.jsonl").read_text().splitlines()
    req = next(json.loads(line) for line in lines if '"request"' in line)
    bad = [{**req, "arrival": v} for v in (1e300, -1e300, 1e30)] + [{**req, "first_token": -1e300}]
    assert "Traceback" not in replay_diagnose_and_report(h200_trace, tmp_path, capsys, bad)
