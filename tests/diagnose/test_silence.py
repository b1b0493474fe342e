"""Silence is a signal (issue 23 item 3): a GPU, a rank or a service that stops reporting while the
others go on is a finding, joined to the last thing seen on it. Each rule is tested with its cause
present (a finding) and absent (none): GPUs through the real agent over the fake backend, ranks and
services from records written in the test."""

from __future__ import annotations

import pytest

from gpulens.diagnose import DiagnoseScope, diagnose
from gpulens.diagnose.silence import MIN_SILENCE_SECONDS, SILENCE_INTERVALS, rhythm
from gpulens.gpu.fake import FakeBackend, schedule_fault
from gpulens.pipeline import NodeConfig, build_node
from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.vocab.gpu import GPU_UP
from gpulens.workload.training.records import StepRecord, write_step

HOST = "node1"
T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def agent_run(store: Store, faults: list[str], *, gpus: int = 2, seconds: int = 80, stop_sampling_at: int | None = None,
              interval_s: float = 1.0, train_gpu: int = 1, train_until: float = 1e9, pid: int = 4242) -> None:
    """The agent over a fake for `seconds` ticks of `interval_s`; rank 0 of job ft on `train_gpu`
    steps once a tick until `train_until`. From `stop_sampling_at` the agent stops (the workload goes on)."""
    clock = Clock()
    fake = FakeBackend(gpus=gpus, clock=clock)
    for spec in faults:
        schedule_fault(fake, spec)
    fake.add_process(train_gpu, pid, "python train.py", 40 * 2**30)
    labels = {N.TRAIN_JOB_LABEL: "ft", "rank": "0", "host": HOST}
    store.event(N.EV_TRAIN_START, T0, labels, {"pid": pid, "rank": 0, "world_size": 1, "gpu": train_gpu})
    agent = build_node(NodeConfig(backend=fake, host=HOST, alerts=None, colocation=False), store=store).loop
    for i in range(seconds):
        if stop_sampling_at is None or i < stop_sampling_at:
            agent.tick()
        if clock.t - T0 < train_until:
            write_step(store, labels, StepRecord(t_start=clock.t - 0.8, t_end=clock.t, step=i, step_s=0.8, pid=pid, rank=0))
        store.flush()
        clock.t += interval_s
    agent.close()


def of_kind(findings, kind):
    return [f for f in findings if f.kind == kind]


# ------------------------------------------------------------------ the threshold
def test_the_threshold_follows_the_rhythm_before_the_silence() -> None:
    """Ten median intervals, twice the longest gap seen, never under the floor."""
    assert rhythm([T0 + i for i in range(10)]).threshold_seconds == MIN_SILENCE_SECONDS
    assert rhythm([T0 + 10 * i for i in range(10)]).threshold_seconds == SILENCE_INTERVALS * 10
    pause = [T0 + i for i in range(5)] + [T0 + 45 + i for i in range(5)]
    assert rhythm(pause).threshold_seconds == pytest.approx(2 * 41)
    assert rhythm([T0, T0 + 1]) is None  # too few intervals to know a rhythm


# ------------------------------------------------------------------ GPUs
def test_a_gpu_silent_after_xid_79_is_critical_and_names_the_xid_and_the_job(store: Store) -> None:
    agent_run(store, ["xid:79@10s:gpu=1", "silent@10s:gpu=1"], train_until=10)
    f = diagnose(store)
    [s] = of_kind(f, "gpu_silent")
    assert s.severity == "critical" and s.labels["gpu"] == "1" and s.labels["host"] == HOST
    assert s.evidence["last_xid"] == 79 and "XID 79" in s.summary and "GPU 0 on node1 went on sampling" in s.summary
    assert s.labels[N.TRAIN_JOB_LABEL] == "ft" and s.evidence["pids_listed_last"] == [4242]
    assert [w["workload"] for w in s.evidence["workload_impact"]] == ["job ft rank 0"]
    assert s.start == pytest.approx(T0 + 9, abs=1.01) and s.end == pytest.approx(T0 + 79)
    assert not of_kind(f, "gpu_lost")  # it never sent gpu_up == 0


def test_a_gpu_silent_without_an_xid_is_still_reported(store: Store) -> None:
    agent_run(store, ["silent@10s:gpu=1"])
    [s] = of_kind(diagnose(store), "gpu_silent")
    assert "last_xid" not in s.evidence and "saying it was up" in s.summary


def test_a_short_gap_or_a_healthy_run_is_not_silent(store: Store) -> None:
    agent_run(store, ["silent@60s:gpu=1"], seconds=80)  # 20 s of silence: under the 30 s floor
    assert not of_kind(diagnose(store), "gpu_silent")


def test_a_recording_that_ends_is_not_a_silent_gpu(store: Store) -> None:
    """Every GPU stops at once (the agent stopped) while the job's records go on: the sampler, not a GPU."""
    agent_run(store, [], stop_sampling_at=20, seconds=90)
    assert not of_kind(diagnose(store), "gpu_silent")


def test_a_lone_gpu_is_silent_only_after_an_xid(tmp_path) -> None:
    with Store(tmp_path / "a.db") as a:
        agent_run(a, ["silent@10s:gpu=0"], gpus=1, train_gpu=0)
        assert not of_kind(diagnose(a), "gpu_silent")
    with Store(tmp_path / "b.db") as b:
        # a tick apart: a node whose every GPU went silent gives the agent no frame to carry the XID in
        agent_run(b, ["xid:79@9s:gpu=0", "silent@10s:gpu=0"], gpus=1, train_gpu=0)
        [s] = of_kind(diagnose(b), "gpu_silent")
        assert "the recording went on" in s.summary


def test_a_slow_sampler_needs_a_longer_silence(store: Store) -> None:
    """At a 5 s interval the threshold is 50 s: a 40 s silence is not one."""
    agent_run(store, ["silent@360s:gpu=1"], interval_s=5.0, seconds=80)  # silent for the last 40 s
    assert not of_kind(diagnose(store), "gpu_silent")


# ------------------------------------------------------------------ ranks
def steps(store: Store, rank: int, until: float, *, job: str = "sweep", pid: int | None = None, start: float = 0.0) -> None:
    labels = {N.TRAIN_JOB_LABEL: job, "rank": str(rank), "host": HOST}
    store.event(N.EV_TRAIN_START, T0, labels, {"pid": pid or 7000 + rank, "rank": rank, "world_size": 4, "gpu": rank})
    t, i = T0 + start, 0
    while t < T0 + until:
        t += 0.8
        write_step(store, labels, StepRecord(t_start=t - 0.8, t_end=t, step=i, step_s=0.8, pid=pid or 7000 + rank, rank=rank))
        i += 1
    store.flush()


def test_a_rank_that_stops_while_the_others_go_on_is_silent(store: Store) -> None:
    for r in range(3):
        steps(store, r, until=120 if r != 2 else 50)
    [s] = of_kind(diagnose(store), "rank_silent")
    assert s.severity == "warning" and s.labels == {N.TRAIN_JOB_LABEL: "sweep", "rank": "2", "host": HOST, "gpu": "2"}
    assert "other ranks stepped on" in s.summary and s.evidence["last_step"] == 62
    assert s.start == pytest.approx(T0 + 50, abs=1) and s.end == pytest.approx(T0 + 120, abs=1)


def test_a_job_that_ends_on_all_ranks_is_not_silent(store: Store) -> None:
    for r in range(3):
        steps(store, r, until=60)
    store.event(N.EV_REQUEST, T0 + 200, {"service": "other", "host": HOST}, {"status": "ok"})  # the recording goes on
    store.flush()
    assert not of_kind(diagnose(store), "rank_silent")


def test_a_lone_rank_whose_process_stays_listed_is_silent(store: Store) -> None:
    """One rank, no others: its process still on its GPU is what says it hangs."""
    agent_run(store, [], train_gpu=1, train_until=20)  # the fake lists pid 4242 on GPU 1 to the end
    [s] = of_kind(diagnose(store), "rank_silent")
    assert s.evidence["pid"] == 4242 and "still in the process list of GPU 1" in s.summary and s.severity == "warning"


def test_a_lone_rank_whose_process_left_is_not_silent(store: Store) -> None:
    steps(store, 0, until=30)
    for i in range(120):  # GPU samples go on, the process list is empty
        store.write(GPU_UP, {"host": HOST, "gpu": "0"}, T0 + i, 1.0)
    store.flush()
    assert not of_kind(diagnose(store), "rank_silent")


def test_a_rank_on_a_gpu_that_went_silent_is_critical(store: Store) -> None:
    agent_run(store, ["xid:79@10s:gpu=1", "silent@10s:gpu=1"], train_until=10)
    steps(store, 1, until=80, job="ft", start=0)  # a second rank of ft on GPU 0's side goes on
    [s] = of_kind(diagnose(store), "rank_silent")
    assert s.labels["rank"] == "0" and s.severity == "critical" and "its GPU went silent too" in s.summary


# ------------------------------------------------------------------ services
def requests(store: Store, service: str, until: float, *, rate: float = 3.0, pid: int | None = None) -> None:
    t = T0
    while t < T0 + until:
        t += 1.0 / rate
        store.event(N.EV_REQUEST, t, {"service": service, "host": HOST},
                    {"arrival": t - 0.2, "start": t - 0.2, "end": t, "status": "ok", **({"pid": pid} if pid else {})})
    store.flush()


def test_a_service_that_stops_while_another_goes_on_is_silent(store: Store) -> None:
    requests(store, "chat", 150)
    requests(store, "embed", 80)
    [s] = of_kind(diagnose(store), "service_silent")
    assert s.labels["service"] == "embed" and s.severity == "warning" and "other services served" in s.summary
    assert s.evidence["last_request_status"] == "ok" and s.start == pytest.approx(T0 + 80, abs=1)


def test_a_service_that_simply_ends_is_not_silent(tmp_path) -> None:
    with Store(tmp_path / "alone.db") as alone:  # one service whose load ends
        requests(alone, "chat", 60)
        assert not of_kind(diagnose(alone), "service_silent")
    with Store(tmp_path / "both.db") as both:  # the load ends for both
        requests(both, "chat", 60)
        requests(both, "embed", 60)
        assert not of_kind(diagnose(both), "service_silent")
    with Store(tmp_path / "sparse.db") as sparse:  # a trickle has no steady traffic to miss
        requests(sparse, "chat", 300)
        requests(sparse, "embed", 80, rate=0.1)
        assert not of_kind(diagnose(sparse), "service_silent")


def test_job_scope_keeps_the_jobs_silence_only(store: Store) -> None:
    for r in range(2):
        steps(store, r, until=120 if r else 40)
    requests(store, "chat", 150)
    requests(store, "embed", 60)
    assert {f.kind for f in diagnose(store, DiagnoseScope(job="sweep")) if f.kind.endswith("_silent")} == {"rank_silent"}
    assert {f.kind for f in diagnose(store) if f.kind.endswith("_silent")} == {"rank_silent", "service_silent"}
