"""The JSON edge of a load run stays byte for byte what it was: `LoadSummary.to_dict()` and a sweep
probe's `to_dict()` of fixed records against a recorded golden file (typed counts, SLO verdicts and
concurrency inside; the same keys, order and values outside)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpulens.bench.serve import (
    LoadSpec,
    Probe,
    RequestCounts,
    RequestRates,
    RequestRecord,
    SloResult,
    Target,
    parse_slos,
)
from gpulens.bench.serve.runner import CANCELLED_ERROR, DIST_NAMES, WorkerResult
from gpulens.bench.serve.stats import Distribution
from gpulens.bench.serve.summary import summarize

GOLDEN = Path(__file__).parent / "data" / "load_summary_golden.json"


def _records() -> list[RequestRecord]:
    out = []
    for i in range(40):
        t = i * 0.05
        status = "ok" if i % 10 < 6 else ("error", "timeout", "rejected", "error")[i % 10 - 6]
        rec = RequestRecord(index=i, worker=0, intended=t, sent=t + 0.001 * (i % 3), status=status)
        if status in ("ok", "timeout"):
            rec.first_token = t + 0.02 + 0.001 * i
            rec.end = t + 0.08 + 0.002 * i if status == "ok" else t + 0.5
        if status == "ok":
            rec.http_status, rec.output_tokens, rec.input_tokens = 200, 8 + i % 4, 16
            rec.planned_output_tokens, rec.itl_mean, rec.itls = 10, 0.005, [0.005] * 7
        else:
            rec.http_status = {"error": 500, "rejected": 429}.get(status)
            rec.error = CANCELLED_ERROR if i == 39 else f"HTTP {rec.http_status}" if rec.http_status else "timeout"
        out.append(rec)
    return out


def _worker(records: list[RequestRecord]) -> WorkerResult:
    dists = {k: Distribution() for k in DIST_NAMES}
    for r in records:
        if r.sent is not None:
            dists["send_lag"].record(r.sent - r.intended)
        if r.end is not None:
            dists["latency"].record(r.end - r.intended)
            dists["latency_uncorrected"].record(r.end - r.sent)
        if r.status == "ok":
            dists["ttft"].record(r.first_token - r.intended)
            dists["itl"].record(r.itl_mean)
            dists["tpot"].record(r.tpot)
    return WorkerResult(worker=0, records=records, dists=dists, not_sent=3, cpu_seconds=0.1, wall_seconds=2.0)


def _golden_now() -> str:
    spec = LoadSpec(Target("http://127.0.0.1:1/v1/completions", kind="completions"), rate=20.0, duration_seconds=2.0)
    slos = parse_slos(["p99_ttft<=200ms", "p99_latency<=100ms"])
    plain = summarize(spec, [_worker(_records())], [], wall_start_unix=1_700_000_000.0)
    gated = summarize(spec, [_worker(_records())], slos, wall_start_unix=1_700_000_000.0, min_goodput_ratio=0.5)
    probe = Probe(20.0, gated.summary.passed, gated, slos=slos)
    doc = {"summary": plain.summary.to_dict(), "gated": gated.summary.to_dict(), "probe": probe.to_dict()}
    return json.dumps(doc, indent=2, default=str) + "\n"


def test_load_summary_json_is_unchanged():
    assert _golden_now() == GOLDEN.read_text()


def test_request_counts_keys_in_their_json_order():
    doc = json.loads(GOLDEN.read_text())
    assert list(doc["summary"]["requests"]) == ["ok", "error", "timeout", "rejected", "total", "not_sent"]
    assert list(doc["gated"]["slo_results"][0]) == ["slo", "metric", "stat", "bound", "value", "met", "gating"]
    assert list(doc["summary"]["concurrency"]) == ["mean", "p50", "p90", "p99", "max"]


def test_request_counts_of_statuses():
    q = RequestCounts.of(["ok", "ok", "error", "timeout", "rejected", "rejected"], not_sent=2)
    assert (q.ok, q.error, q.timeout, q.rejected, q.total, q.not_sent) == (2, 1, 1, 2, 6, 2)
    assert q.failed == 4 == q.total - q.ok and q.by_status("rejected") == 2
    with pytest.raises(KeyError):
        q.by_status("total")  # a count, not a status
    assert RequestRates.of(q, 2.0).rejected == 1.0 and RequestRates.of(q, 0.0) == RequestRates()


def test_slo_result_shown_as_a_person_reads_it():
    assert SloResult("p99_ttft<=200ms", "ttft", "p99", 0.2, 0.1234, True).shown() == "123.4 ms"
    assert SloResult("error_rate<=1%", "error_rate", None, 0.01, 0.5, False).shown() == "50.00%"
    assert SloResult("p99_itl<=5ms", "itl", "p99", 0.005, None, False).shown("nothing measured") == "nothing measured"


if __name__ == "__main__":  # regenerate the golden file (only when the JSON is meant to change)
    GOLDEN.write_text(_golden_now())
