"""Inference diagnosis on the replayed H200 session and on small stores built for one cause each.
Phase labels are used here only as ground truth; the analyzers never see them."""

from __future__ import annotations

import json

import pytest

from gpulens.diagnose import DiagnoseScope, diagnose
from gpulens.diagnose.inference import set_slos
from gpulens.store import Store
from gpulens.vocab import names as N


def _phases(trace) -> dict[str, tuple[float, float]]:
    marks = [json.loads(line) for line in (trace / "events.jsonl").open() if '"phase"' in line]
    marks = [m for m in marks if m.get("kind") == "phase"]
    return {m["name"]: (m["t"], nxt["t"]) for m, nxt in zip(marks, marks[1:], strict=False)}


@pytest.fixture(scope="module")
def h200_findings(replayed_store):
    with Store(replayed_store, readonly=True) as s:
        return [f for f in diagnose(s) if f.workload == "inference"]


def test_h200_serving_is_latency_bound_at_low_utilization(h200_findings, h200_trace):
    phases = _phases(h200_trace)
    serving = (phases["infer_online"][0], phases["infer_recover"][1])
    found = [f for f in h200_findings if f.kind == "latency_bound_low_utilization"]
    assert len(found) == 1
    f = found[0]
    # it spans the serving phases and nothing of the training before them
    assert serving[0] <= f.start < phases["infer_online"][0] + 2
    assert phases["infer_recover"][0] < f.end <= serving[1] + 1
    assert f.evidence["gpu_utilization_while_serving_ratio"] < 0.25
    assert f.evidence["latency_p99_seconds"] > 2.0
    assert "CUDA graphs" in f.advice[0] and "batching" in f.advice[1] and "INT8/FP8" in f.advice[2]
    assert f.labels["service"] == "h200-demo"


def test_one_window_never_advises_both_fewer_and_more_replicas(h200_findings):
    # the overload phase queues inside the idle-GPU window: "fewer replicas" would deepen that queue
    lat = next(f for f in h200_findings if f.kind == "latency_bound_low_utilization")
    queued = [f for f in h200_findings if f.kind == "queueing" and lat.start <= f.start and f.end <= lat.end]
    assert queued
    advice = " ".join(lat.advice + [a for f in queued for a in f.advice])
    assert not ("fewer replicas" in advice.replace("not fewer replicas", "") and "more replicas" in advice)
    assert "not fewer replicas" in lat.advice[-1] and "queue" in lat.advice[-1]


def test_h200_cold_start_is_the_model_load(h200_findings, h200_trace):
    phases = _phases(h200_trace)
    found = [f for f in h200_findings if f.kind == "cold_start"]
    assert len(found) == 1
    assert found[0].evidence["cold_start_seconds"] == pytest.approx(7.78, abs=0.01)
    lo, hi = phases["cold_start"]
    assert lo - 0.5 <= found[0].start and found[0].end <= hi + 0.5


def test_h200_has_no_false_alarms(h200_findings, h200_trace):
    phases = _phases(h200_trace)
    kinds = {f.kind for f in h200_findings}
    assert not kinds & {"error_rate", "timeouts", "memory_headroom", "slo_violation"}
    training_end = phases["idle_between"][1]
    assert all(f.start >= training_end for f in h200_findings if f.kind != "cold_start")
    # queueing, where reported, is in the overloaded part of serving, not the calm start
    for f in h200_findings:
        if f.kind == "queueing":
            assert f.end > phases["infer_overload"][0]


def test_colocation_warm_up_is_reported_with_the_cold_start(tmp_path, colocation_trace):
    from gpulens.pipeline.ingest import import_trace

    with Store(tmp_path / "c.db") as s:
        import_trace(colocation_trace, s)
        cold = [f for f in diagnose(s) if f.kind == "cold_start"]
    assert len(cold) == 1
    assert cold[0].evidence["cold_start_seconds"] == pytest.approx(11.14, abs=0.01)
    assert cold[0].evidence["slow_requests_after_load"] >= 5


def _req(store: Store, t: float, *, latency: float, queue: float = 0.0, status: str = "ok", service: str = "svc"):
    arrival = t - latency
    store.event(N.EV_REQUEST, t, {"service": service, "model": "m", "host": "h"},
                {"arrival": arrival, "start": arrival + queue, "end": t, "status": status})


def test_errors_timeouts_slo_and_memory(store):
    for i in range(100):
        status = "error" if i % 10 == 0 else ("timeout" if i % 25 == 1 else "ok")
        _req(store, 1000 + i * 0.5, latency=0.2 if status != "timeout" else 5.0, status=status)
    for i in range(20):  # the cache fills while requests wait for it (the monitor's set_memory / set_queue_depth)
        store.write(N.INFER_KV_CACHE_USAGE_RATIO, {"service": "svc", "model": "m", "host": "h"}, 1000 + i, 0.5 + i * 0.025)
        store.write(N.INFER_QUEUE_DEPTH, {"service": "svc", "model": "m", "host": "h"}, 1000 + i, float(i // 10))
    set_slos(store, ["p99_latency<=1s", "error_rate<=5%"])
    store.flush()
    kinds = {f.kind: f for f in diagnose(store, DiagnoseScope(service="svc"))}
    assert kinds["error_rate"].evidence["errors"] == 10 and kinds["error_rate"].severity == "critical"
    assert kinds["timeouts"].evidence["timeouts"] == 4
    missed = {m["slo"] for m in kinds["slo_violation"].evidence["missed"]}
    assert missed == {"p99_latency<=1s", "error_rate<=5%"}
    assert kinds["memory_headroom"].evidence["kv_cache_usage_max_ratio"] == pytest.approx(0.975)
    assert "latency_bound_low_utilization" not in kinds  # no GPU series: no claim about the GPU
    # a healthy service beside it gets no findings
    for i in range(50):
        _req(store, 5000 + i * 0.5, latency=0.1, service="calm")
    store.flush()
    assert diagnose(store, DiagnoseScope(service="calm")) == [] or all(
        f.workload != "inference" for f in diagnose(store, DiagnoseScope(service="calm")))


def test_queueing_needs_queue_wait_to_dominate(store):
    for i in range(60):  # latency grows with a queue: service 0.1 s, waits up to 3 s
        _req(store, 2000 + i * 0.3, latency=0.1 + i * 0.05, queue=i * 0.05)
    store.flush()
    found = [f for f in diagnose(store) if f.kind == "queueing"]
    assert found and found[0].evidence["queue_wait_share"] > 0.5
    assert "replicas" in found[0].advice[0]


def test_diagnose_slo_option_checks_and_keeps_objectives(replayed_store, tmp_path, capsys):
    """`gpulens diagnose --slo`: the H200 session's serving (p50 ≈ 0.37 s) misses a 100 ms p99,
    meets a 60 s one; the objectives stay in the store for the next run; a malformed one changes nothing."""
    import shutil

    from gpulens.cli.main import main

    db = tmp_path / "h200.db"
    shutil.copy(replayed_store, db)

    def kinds(*args: str) -> tuple[int, dict]:
        rc = main(["diagnose", "--store", str(db), "--format", "json", *args])
        out = capsys.readouterr().out
        return rc, ({f["kind"]: f for f in json.loads(out)} if rc == 0 else {})

    rc, before = kinds()
    assert rc == 0 and "slo_violation" not in before
    rc, strict = kinds("--slo", "p99_latency<=100ms")
    assert rc == 0 and strict["slo_violation"]["evidence"]["missed"][0]["slo"] == "p99_latency<=100ms"
    assert strict["slo_violation"]["evidence"]["missed"][0]["value"] > 0.1
    rc, kept = kinds()
    assert "slo_violation" in kept  # remembered
    assert main(["diagnose", "--store", str(db), "--slo", "p99_latency<=fast"]) == 2
    assert "slo_violation" in kinds()[1]  # the malformed objective replaced nothing
    rc, loose = kinds("--slo", "p99_latency<=60s")
    assert rc == 0 and "slo_violation" not in loose
