"""GPU health in the diagnosis: faults injected through the fake backend and written by the real
agent into a real SQLite store, with a training rank and a serving service on the GPUs, come out
as findings naming the GPU, the fault, its time and what the workloads on that GPU did."""

from __future__ import annotations

import json
import os

import pytest

from gpulens.cli.main import main
from gpulens.diagnose import DiagnoseScope, diagnose
from gpulens.diagnose.health import clock_cut_events
from gpulens.gpu.fake import H200_LIKE, FakeBackend, schedule_fault
from gpulens.pipeline import NodeConfig, build_node
from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.vocab.xid import xid_info
from gpulens.workload.inference.monitor import InferenceMonitor
from gpulens.workload.training.records import StepRecord, write_step

HOST = "node1"
T0 = 1_800_000_000.0
TRAIN_PID = 4242
TRAIN_LABELS = {N.TRAIN_JOB_LABEL: "llama-ft", "rank": "1", "host": HOST}
REPRO = ["xid:79@3s:gpu=1", "ecc:uncorrected=2@5s", "throttle:hw_thermal@6s:gpu=1", "temp:90@7s"]


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def run(store: Store, faults: list[str], *, seconds: int = 14, train_until: float = 1e9, data_wait_s: float = 0.0,
        latency_s=lambda t: 0.2, step_s=lambda t: 0.45, fake_setup=None, list_processes: bool = True) -> None:
    """The agent over a 2-GPU fake for `seconds` one-second ticks. Training rank 1 of llama-ft on
    GPU 1 steps twice a second until `train_until` (seconds after start); service chat on GPU 0
    (this process) serves five requests a second."""
    clock = Clock()
    fake = FakeBackend(gpus=2, clock=clock)
    for spec in faults:
        schedule_fault(fake, spec)
    if fake_setup:
        fake_setup(fake)
    if list_processes:
        fake.add_process(1, TRAIN_PID, "python train.py", 40 * 2**30)
        fake.add_process(0, os.getpid(), "python serve.py", 20 * 2**30)
    store.event(N.EV_TRAIN_START, T0, TRAIN_LABELS, {"pid": TRAIN_PID, "rank": 1, "world_size": 2, "gpu": 1})
    mon = InferenceMonitor(store, service="chat", host=HOST, clock=clock, flush_interval_seconds=None)
    agent = build_node(NodeConfig(backend=fake, host=HOST, alerts=None, colocation=False), store=store).loop
    for i in range(seconds):
        agent.tick()
        for k in range(2):
            end = clock.t + 0.5 * k
            if end - T0 < train_until:
                write_step(store, TRAIN_LABELS, StepRecord(t_start=end - step_s(end - T0) - data_wait_s, t_end=end, step=2 * i + k,
                                                          step_s=step_s(end - T0) + data_wait_s, data_wait_s=data_wait_s, pid=TRAIN_PID, rank=1))
        for _ in range(5):
            lat = latency_s(clock.t - T0)
            mon.start_request(arrival=clock.t - lat).finish("ok")
        store.flush()
        clock.t += 1.0
    mon.close()
    agent.close()


def health(findings):
    return [f for f in findings if f.kind.startswith("gpu_") and f.workload == "gpu"]


def one(findings, kind, gpu):
    got = [f for f in findings if f.kind == kind and f.labels["gpu"] == gpu]
    assert len(got) == 1, [(f.kind, f.labels) for f in findings]
    return got[0]


def test_the_issue_repro_gives_health_findings_joined_with_workloads(store):
    run(store, [*REPRO, "remap-failure@4s:gpu=1", "xid:13@8s"], train_until=3)
    found = diagnose(store)
    hf = health(found)

    xid = one(hf, "gpu_xid", "1")
    assert xid.start == T0 + 3 and xid.severity == "critical" and xid.evidence["xid"] == 79
    assert xid.evidence["meaning"] == xid_info(79).meaning and xid.advice[0] == xid_info(79).action
    assert "XID 79 on GPU 1 on node1" in xid.summary
    assert "Job llama-ft rank 1 made no step after it" in xid.summary
    assert xid.labels[N.TRAIN_JOB_LABEL] == "llama-ft" and xid.labels["rank"] == "1"
    assert "service" not in xid.labels  # chat ran on GPU 0
    assert xid.evidence["workload_impact"][0]["steps_after_start"] == 0

    app_xid = one(hf, "gpu_xid", "0")
    assert app_xid.evidence["xid"] == 13 and app_xid.severity == xid_info(13).severity == "warning"

    ecc = one(hf, "gpu_ecc_uncorrectable", "0")
    assert ecc.severity == "critical" and ecc.start == T0 + 5 and ecc.evidence["ecc_uncorrected_increase"] == 2
    assert ecc.labels["service"] == "chat" and "Service chat served" in ecc.summary

    remap = one(hf, "gpu_row_remap_failure", "1")
    assert remap.severity == "critical" and remap.start == T0 + 4
    assert any("RMA" in a for a in remap.advice)

    cut = one(hf, "gpu_clock_cut", "1")
    assert cut.severity == "warning" and cut.start == T0 + 6 and cut.evidence["reason"] == "hw_thermal"
    assert cut.evidence["cut_seconds"] == 8.0  # samples 6..13, each standing for the second that ended
    assert cut.evidence["sm_clock_before_hz"] == pytest.approx(0.95 * H200_LIKE["sm_clock_max_hz"])
    assert cut.evidence["sm_clock_drop_ratio"] == pytest.approx(1 - 0.5 / 0.95, abs=1e-3)
    assert any("cooling" in a.lower() for a in cut.advice[:1])

    hot = one(hf, "gpu_temperature_high", "0")
    assert hot.severity == "warning" and hot.start == T0 + 7 and hot.evidence["temperature_max_celsius"] == 90
    assert hot.evidence["temperature_slowdown_celsius"] == H200_LIKE["temperature_slowdown_celsius"]
    assert hot.labels["service"] == "chat"

    # Hardware faults first, then the conditions, then every other finding.
    kinds = [f.kind for f in found]
    faults = {"gpu_xid", "gpu_ecc_uncorrectable", "gpu_row_remap_failure"}
    assert set(kinds[: len(faults) + 1]) == faults and kinds.index("gpu_clock_cut") > kinds.index("gpu_xid")
    assert all(f.kind.startswith("gpu_") for f in found[: len(hf)])


def test_a_healthy_fake_run_gives_no_health_finding(store):
    run(store, [])
    assert health(diagnose(store)) == []


def test_the_bundled_h200_session_has_no_health_finding(replayed_store):
    with Store(replayed_store, readonly=True) as st:
        assert health(diagnose(st)) == []
        # What it does hold: a sub-second power cap while the clocks rise at the very start. The
        # detector sees it; it is below the two seconds a condition must last to be reported.
        blips = clock_cut_events(st, DiagnoseScope(), min_seconds=0)
    assert [b.evidence["reason"] for b in blips] == ["sw_power_cap"]
    assert blips[0].evidence["cut_seconds"] < 1.0


def test_a_clock_cut_names_the_p99_rise_of_the_service_on_that_gpu(store):
    # GPU 0 (service chat) is cut from 6 s; requests take 0.28 s instead of 0.2 s from then on.
    run(store, ["throttle:hw_thermal@6s:gpu=0"], latency_s=lambda t: 0.28 if t >= 6 else 0.2)
    cut = one(health(diagnose(store)), "gpu_clock_cut", "0")
    assert "P99 of service chat rose 40% (0.2 s → 0.28 s) while the clocks of GPU 0 on node1 were cut for hw_thermal" in cut.summary
    impact = cut.evidence["workload_impact"][0]
    assert impact["p99_latency_change_ratio"] == pytest.approx(0.4, abs=1e-4)


def test_a_clock_cut_names_the_step_time_of_the_job_on_that_gpu(store):
    run(store, ["throttle:hw_power_brake@6s:gpu=1"], step_s=lambda t: 0.6 if t >= 6 else 0.45)
    cut = one(health(diagnose(store)), "gpu_clock_cut", "1")
    assert "Step time of job llama-ft rank 1 rose 33%" in cut.summary
    assert "power brake" in cut.summary and "power suppl" in cut.advice[0]


def test_a_lost_gpu_and_full_memory(store):
    run(store, ["lost@5s:gpu=1"], fake_setup=lambda f: f.set(0, memory_used_bytes=0.97 * H200_LIKE["memory_total_bytes"]), train_until=5)
    hf = health(diagnose(store))
    lost = one(hf, "gpu_lost", "1")
    assert lost.severity == "critical" and lost.start == T0 + 5 and lost.evidence["lost_at_last_sample"] is True
    assert "made no step after it" in lost.summary
    full = one(hf, "gpu_memory_full", "0")
    assert full.severity == "warning" and full.evidence["memory_used_max_ratio"] == 0.97
    assert full.labels["service"] == "chat"


def test_a_job_or_service_selection_keeps_the_health_of_its_gpu_only(store):
    run(store, REPRO, train_until=3)
    kinds = {(f.kind, f.labels["gpu"]) for f in health(diagnose(store, DiagnoseScope(job="llama-ft")))}
    assert kinds == {("gpu_xid", "1"), ("gpu_clock_cut", "1")}
    kinds = {(f.kind, f.labels["gpu"]) for f in health(diagnose(store, DiagnoseScope(service="chat")))}
    assert kinds == {("gpu_ecc_uncorrectable", "0"), ("gpu_temperature_high", "0")}


def test_without_a_process_list_the_train_start_gpu_places_the_job(store):
    # No GPU process listing: the rank's train_start names its GPU; the service's GPU is unknown
    # on a two-GPU host, and the finding says no known workload ran there rather than guess.
    run(store, ["xid:79@3s:gpu=1", "remap-pending@4s:gpu=0"], train_until=3, list_processes=False)
    hf = health(diagnose(store))
    xid = one(hf, "gpu_xid", "1")
    assert xid.evidence["workload_impact"][0]["identified_by"] == "its train_start event"
    assert "made no step after it" in xid.summary
    pending = one(hf, "gpu_row_remap_pending", "0")
    assert pending.severity == "warning" and "reset" in pending.advice[0].lower()
    assert "No workload gpulens knows of ran on it" in pending.summary and "service" not in pending.labels


def test_the_cli_shows_health_first_and_carries_it_in_json(store, store_path, capsys):
    # An input-bound job from the start and an XID on its GPU at 10 s: the XID is listed first.
    run(store, ["xid:79@10s:gpu=1"], data_wait_s=0.4, train_until=10)
    store.close()
    assert main(["diagnose", "--store", str(store_path), "--format", "json"]) == 0
    findings = json.loads(capsys.readouterr().out)
    kinds = [f["kind"] for f in findings]
    assert kinds[0] == "gpu_xid" and "input_bound" in kinds
    assert findings[0]["labels"]["gpu"] == "1" and findings[0]["evidence"]["xid"] == 79
    assert findings[0]["evidence"]["workloads"] == ["job llama-ft rank 1 made no step after it (its last step ended 0.5 s before)"]
    assert main(["diagnose", "--store", str(store_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.index("1. CRITICAL gpu xid") < out.index("input bound")
    assert "GPU faults first" in out and "XID 79 on GPU 1 on node1" in out
    # The demo's summary and the dashboard's findings list read the same diagnosis.
    from gpulens.cli.common import console
    from gpulens.render.session import print_session_summary
    from gpulens.views.integrations import findings as dashboard_findings

    print_session_summary(console, store_path)
    out = " ".join(capsys.readouterr().out.split())
    assert out.index("gpu_xid") < out.index("input_bound")
    with Store(store_path, readonly=True) as st:
        listed = dashboard_findings(st, T0, T0 + 60, None, None).findings
    assert listed[0].kind == "gpu_xid" and listed[0].evidence["workloads"]  # typed findings, JSON only at the edge


def test_a_short_fault_in_a_long_store_is_found_through_the_roll_ups(store):
    # 20 h sampled once a minute: the first look reads the 1-minute roll-up, not the raw samples.
    clock = Clock()
    fake = FakeBackend(gpus=1, clock=clock)
    agent = build_node(NodeConfig(backend=fake, host=HOST, alerts=None, colocation=False), store=store).loop
    for i in range(20 * 60):
        if i == 600:
            fake.throttle(0, "sw_thermal")
        if i == 605:
            fake.clear(0)
        agent.tick()
        clock.t += 60.0
        if i % 100 == 99:
            store.flush()
    agent.close()
    cut = one(health(diagnose(store)), "gpu_clock_cut", "0")
    assert cut.start == T0 + 600 * 60 and cut.evidence["cut_seconds"] == 300.0 and cut.evidence["reason"] == "sw_thermal"


def test_on_a_one_gpu_host_every_workload_of_the_host_is_on_that_gpu(store):
    clock = Clock()
    fake = FakeBackend(gpus=1, clock=clock)
    schedule_fault(fake, "xid:48@3s")
    mon = InferenceMonitor(store, service="chat", host=HOST, clock=clock, flush_interval_seconds=None)
    agent = build_node(NodeConfig(backend=fake, host=HOST, alerts=None, colocation=False), store=store).loop
    for i in range(8):
        agent.tick()
        if i < 3:  # the service fails after the double-bit error
            mon.start_request(arrival=clock.t - 0.1).finish("ok")
        else:
            mon.start_request(arrival=clock.t - 0.1).finish("error")
        clock.t += 1.0
    mon.close()
    agent.close()
    xid = one(health(diagnose(store)), "gpu_xid", "0")
    assert xid.severity == "critical" and xid.evidence["xid"] == 48
    impact = xid.evidence["workload_impact"][0]
    assert impact["identified_by"] == "the only GPU of its host"
    assert impact["requests_after_start"] == 5 and impact["failed_requests_after_start"] == 5
    assert "Service chat served 5 requests after it, 5 failed" in xid.summary


def test_gpu_telemetry_alone_is_not_called_a_healthy_workload(tmp_path, capsys):
    # only the agent's GPU samples: the empty diagnosis says that only the GPU checks ran, not "no bottleneck
    # ... keep this run as your baseline", which it said before
    path = tmp_path / "gpu-only.db"
    with Store(path) as st:
        agent = build_node(NodeConfig(backend=FakeBackend(gpus=1, clock=Clock()), host=HOST, alerts=None, colocation=False),
                           store=st).loop
        for _ in range(3):
            agent.tick()
        agent.close()
        st.flush()
        assert st.time_range() is not None and not [k for k in st.series() if k.name.startswith(("train_", "infer_"))]
    assert main(["diagnose", "--store", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "only the GPU health checks ran" in out and "No bottleneck found" not in out
