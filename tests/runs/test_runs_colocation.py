"""The co-location guard: on the fake backend (live path) and on the real H200 co-location recording."""

from __future__ import annotations

import pytest

from gpulens.clock import FakeClock
from gpulens.diagnose import DiagnoseScope, diagnose
from gpulens.diagnose.colocation import find_colocations, latency_stats
from gpulens.gpu.fake import FakeBackend
from gpulens.pipeline.writer import SampleWriter
from gpulens.store import Store
from gpulens.vocab import names as N

GiB = 1 << 30


class Clock:
    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _live(store: Store, train_gpu: int, serve_gpu: int, *, extra_procs=(), seconds: int = 30) -> None:
    """Sample a 2-GPU fake backend for `seconds`, with the monitors' start events as a live agent
    would store them: the training job (pid 4242) and the service (pid 5151) report their pids."""
    clock = Clock()
    fake = FakeBackend(2, clock=clock, seed=1)
    fake.add_process(train_gpu, 4242, "python", 60 * GiB)
    fake.add_process(serve_gpu, 5151, "python", 30 * GiB)
    for gpu, pid, name in extra_procs:
        fake.add_process(gpu, pid, name, GiB)
    store.event(N.EV_TRAIN_START, clock.t, {"train_job": "llama-ft", "rank": "0"}, {"pid": 4242, "rank": 0, "world_size": 1})
    store.event(N.EV_INFER_START, clock.t, {"service": "chat"}, {"pid": 5151, "service": "chat", "model": "llama"})
    writer = SampleWriter(store, host="node1")
    for _ in range(seconds):
        writer.write_samples(fake.sample())
        clock.t += 1.0
    store.flush()


def test_training_and_serving_on_one_gpu_is_a_finding(store):
    _live(store, 1, 1)
    (f,) = [f for f in diagnose(store) if f.kind == "colocation"]
    assert f.severity == "warning" and f.labels["gpu"] == "1" and f.labels["train_job"] == "llama-ft" and f.labels["service"] == "chat"
    assert "pid 4242" in f.summary and "pid 5151" in f.summary and "without isolation" in f.summary
    assert f.evidence["training_identified_by"] == "train_start events" and f.evidence["seconds_together"] == pytest.approx(29, abs=1)
    assert any("MIG" in a for a in f.advice) and any("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in a for a in f.advice)
    assert any("CUDA_VISIBLE_DEVICES" in a for a in f.advice)


def test_on_different_gpus_there_is_no_finding(store):
    _live(store, 0, 1)
    assert [f for f in diagnose(store) if f.kind == "colocation"] == []


def test_unmonitored_serving_process_is_recognised_by_name(store):
    clock = Clock()
    fake = FakeBackend(1, clock=clock)
    fake.add_process(0, 4242, "python", 60 * GiB)
    fake.add_process(0, 777, "tritonserver", 10 * GiB)
    store.event(N.EV_TRAIN_START, clock.t, {"train_job": "j"}, {"pid": 4242})
    w = SampleWriter(store, host="n")
    for _ in range(5):
        w.write_samples(fake.sample())
        clock.t += 1
    store.flush()
    (c,) = find_colocations(store)
    assert c.serving.pid == 777 and c.serving.how == "its process name" and c.interference is None


def test_mps_lowers_the_severity(store):
    _live(store, 0, 0, extra_procs=[(0, 99, "nvidia-cuda-mps-server")])
    (f,) = [f for f in diagnose(store) if f.kind == "colocation"]
    assert f.severity == "info" and "MPS is running" in f.summary


def test_mig_mode_lowers_the_severity(store):
    _live(store, 0, 0)
    store.write("gpu_mig_mode", {"gpu": "0", "host": "node1"}, 1_800_000_000.0, 1.0)
    store.flush()
    (f,) = [f for f in diagnose(store) if f.kind == "colocation"]
    assert f.severity == "info" and "in MIG mode" in f.summary and f.evidence["mig_mode"] is True


def test_processes_one_after_the_other_are_not_together(store):
    clock = Clock()
    fake = FakeBackend(1, clock=clock)
    w = SampleWriter(store, host="n")
    store.event(N.EV_TRAIN_START, clock.t, {}, {"pid": 1})
    store.event(N.EV_INFER_START, clock.t, {}, {"pid": 2})
    fake.add_process(0, 1, "python", GiB)
    for _ in range(5):
        w.write_samples(fake.sample())
        clock.t += 1
    fake = FakeBackend(1, clock=clock)  # the same GPU (same uuid); the training job has ended
    fake.add_process(0, 2, "python", GiB)
    for _ in range(5):
        w.write_samples(fake.sample())
        clock.t += 1
    store.flush()
    assert find_colocations(store) == []


@pytest.fixture(scope="module")
def coloc_store(tmp_path_factory, colocation_trace):
    from gpulens.pipeline.ingest import import_trace

    path = tmp_path_factory.mktemp("coloc") / "c.db"
    with Store(path) as s:
        import_trace(colocation_trace, s)
    return path


def test_real_h200_recording_names_both_and_quantifies_interference(coloc_store):
    """README of h200-colocation: 18 requests alone, 49 with training; service = end - start; the
    first ~5 s are a cold start. The README's table (alone p50 0.367 s / p95 0.415 s, with training
    p50 0.398 s / p95 0.502 s) is nearest-rank; gpulens.stats interpolates (type 7), hence these."""
    with Store(coloc_store, readonly=True) as st:
        (f,) = [f for f in diagnose(st) if f.kind == "colocation"]
    ev = f.evidence
    assert (ev["training_pid"], ev["serving_pid"]) == (465, 418)
    assert "pid 465" in f.summary and "pid 418" in f.summary
    i = ev["interference"]
    assert i["alone"]["requests"] == 18 and i["with_training"]["requests"] == 49
    assert i["alone"]["p50_seconds"] == pytest.approx(0.365, abs=0.001)
    assert i["alone"]["p95_seconds"] == pytest.approx(0.402, abs=0.001)
    assert i["with_training"]["p50_seconds"] == pytest.approx(0.398, abs=0.001)
    assert i["with_training"]["p95_seconds"] == pytest.approx(0.501, abs=0.001)
    assert i["p95_change_ratio"] == pytest.approx(0.25, abs=0.01) and i["p50_change_ratio"] == pytest.approx(0.09, abs=0.01)
    # the cold start is kept apart: its first request took 2.7 s and the backlog behind it ~2 s
    cold = i["cold_start"]
    assert 1 <= cold["requests"] <= 14 and cold["p99_seconds"] > 2.0 and i["cold_start_latency"]["p50_seconds"] > 1.0
    assert i["cold_start_load_seconds"] == pytest.approx(11.14, abs=0.01)
    assert "+25%" in f.summary and "cold start" in f.summary


def test_scope_outside_the_overlap_has_no_finding(coloc_store):
    with Store(coloc_store, readonly=True) as st:
        first = st.time_range()[0]
        assert [f for f in diagnose(st, DiagnoseScope(start=first, end=first + 15)) if f.kind == "colocation"] == []


def test_latency_stats_use_the_one_percentile_definition():
    """gpulens.stats (linear interpolation), as in every other finding; it was nearest-rank here."""
    s = latency_stats([1.0, 2.0, 3.0, 4.0])
    assert s.requests == 4 and s.p50_seconds == 2.5
    assert latency_stats([float(i) for i in range(1, 101)]).p99_seconds == pytest.approx(99.01)
    assert latency_stats([]).p50_seconds is None


def test_live_series_raises_and_resolves_an_alert_in_the_rule_engine(store, tmp_path):
    """The guard as an alert: the agent writes the co-location series, gpulens's own rule engine
    evaluates the rule shipped beside it."""
    from gpulens.alerts.runtime import AlertRuntime
    from gpulens.diagnose.colocation import ALERT_RULE_YAML, COLOCATION_SERIES
    from gpulens.pipeline.sinks import write_colocation_series

    rules = tmp_path / "coloc.yaml"
    rules.write_text(ALERT_RULE_YAML)
    clock = Clock()
    fake = FakeBackend(1, clock=clock)
    fake.add_process(0, 4242, "python", GiB)
    fake.add_process(0, 5151, "python", GiB)
    store.event(N.EV_TRAIN_START, clock.t, {"train_job": "j"}, {"pid": 4242})
    store.event(N.EV_INFER_START, clock.t, {"service": "s"}, {"pid": 5151})
    w = SampleWriter(store, host="n")
    rt = AlertRuntime(store, learn_seconds=60, rules_file=rules, packs=())
    firing = []
    for i in range(100):
        if i == 60:  # the service moves to another GPU: the listing no longer shows it here
            fake = FakeBackend(1, clock=clock)
            fake.add_process(0, 4242, "python", GiB)
        w.write_samples(fake.sample())
        store.flush()
        if i % 5 == 0:
            write_colocation_series(store, clock.t, window_seconds=10)
            firing.append([a.state for a in rt.evaluate(clock.t) if a.rule == "GpuTrainingServingColocated"])
        clock.t += 1
    rt.close()
    states = [x[0] if x else None for x in firing]  # one evaluation every 5 s
    assert states[0] == "pending" and "firing" in states  # held for the rule's 1 minute, then fired
    assert states.index("firing") >= 11 and "resolved" in states[states.index("firing"):]
    assert states[-1] is None  # resolved after the service left
    (lv,) = store.latest(COLOCATION_SERIES)
    assert lv.value == 0 and lv.key.labels["training_pid"] == "4242" and lv.key.labels["serving_pid"] == "5151"


def test_real_monitors_in_two_processes_are_matched_to_the_gpu_process_list(tmp_path):
    """The live path end to end: an InferenceMonitor in another process and a TrainingMonitor here
    announce their pids; the GPU lists both pids on GPU 0; the guard names both."""
    import os
    import subprocess
    import sys
    import time

    from gpulens import InferenceMonitor, TrainingMonitor  # noqa: F401  (public API)

    db = tmp_path / "live.db"
    Store(db).close()
    server = subprocess.Popen(
        [sys.executable, "-c", (
            "import sys, time\n"
            "from gpulens import InferenceMonitor\n"
            f"m = InferenceMonitor({str(db)!r}, service='chat', model='tiny')\n"
            "with m.request() as h: h.token(); h.token()\n"
            "m.close(); print('ready', flush=True); sys.stdin.read()\n"
        )],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert server.stdout.readline().strip() == "ready"
        with Store(db) as store:
            mon = TrainingMonitor(job="llama-ft", store=store)
            for _ in mon.data(range(3)):
                with mon.step(samples=1):
                    pass
            mon.close()
            clock = FakeClock(start=time.time())  # GPU samples from now on, 50 ms apart, without waiting
            fake = FakeBackend(1, clock=clock)
            fake.add_process(0, os.getpid(), "python train.py", 40 * GiB)
            fake.add_process(0, server.pid, "python serve.py", 20 * GiB)
            writer = SampleWriter(store, host="node1")
            for _ in range(3):
                writer.write_samples(fake.sample())
                clock.advance(0.05)
            store.flush()
            found = [f for f in diagnose(store) if f.kind == "colocation"]
    finally:
        server.communicate("", timeout=10)
    (f,) = found
    assert f"pid {os.getpid()}" in f.summary and f"pid {server.pid}" in f.summary
    assert f.labels["train_job"] == "llama-ft" and f.labels["service"] == "chat"
