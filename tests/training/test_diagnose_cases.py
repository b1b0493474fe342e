"""Each training analyzer on a store built from step records and GPU series, with a healthy
control beside every problem so that a finding has to be earned."""

from __future__ import annotations

import random

import pytest

from gpulens.diagnose import DiagnoseScope, diagnose
from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.workload.training.records import StepRecord, write_step

T0 = 1_900_000_000.0
GPU = {"gpu": "0", "uuid": "GPU-x", "model": "NVIDIA H100", "host": "n1"}


def _steps(store: Store, n: int, *, rank: int = 0, job: str = "j", host: str = "n1", t0: float = T0, busy=lambda i: 0.1, comm=lambda i: 0.0, data=lambda i: 0.0005, **extra) -> list[StepRecord]:
    rnd = random.Random(rank)
    t, out = t0, []
    for i in range(n):
        b = busy(i) * (1 + 0.02 * rnd.random())
        rec = StepRecord(t_start=t, t_end=t + data(i) + b + comm(i), step=i, step_s=data(i) + b + comm(i), data_wait_s=data(i), compute_s=b, comm_wait_s=comm(i), checkpoint_s=0.0, samples=8, tokens=8192, pid=100 + rank, rank=rank, **{k: (v(i) if callable(v) else v) for k, v in extra.items()})
        write_step(store, {"train_job": job, "rank": str(rank), "host": host}, rec)
        out.append(rec)
        t = rec.t_end
    return out


def _gpu(store: Store, t0: float, t1: float, *, util=0.95, used=20e9, total=80e9, reasons: dict[str, float] | None = None) -> None:
    t = t0
    while t <= t1:
        store.write("gpu_utilization_ratio", GPU, t, util(t) if callable(util) else util)
        store.write("gpu_memory_used_bytes", GPU, t, used(t) if callable(used) else used)
        store.write("gpu_memory_total_bytes", GPU, t, total)
        for reason, active in (reasons or {"hw_thermal": 0.0}).items():
            store.write("gpu_clock_event_active", {**GPU, "reason": reason}, t, active(t) if callable(active) else active)
        t += 0.1
    store.flush()


def _kinds(store: Store) -> list[str]:
    return [f.kind for f in diagnose(store) if f.workload == "training"]


def test_healthy_job_has_no_findings(store: Store) -> None:
    steps = _steps(store, 100)
    _gpu(store, T0, steps[-1].t_end)
    store.flush()
    assert _kinds(store) == []


def test_comm_bound_names_the_stretch(store: Store) -> None:
    steps = _steps(store, 80, comm=lambda i: 0.15 if 30 <= i < 60 else 0.002)
    _gpu(store, T0, steps[-1].t_end)
    store.flush()
    f = [f for f in diagnose(store) if f.kind == "comm_bound"]
    assert len(f) == 1 and f[0].start == steps[30].t_start and f[0].end == steps[59].t_end
    assert f[0].evidence["comm_wait_share"] > 0.5 and "bucket" in f[0].advice[0]
    assert _kinds(store) == ["comm_bound"]


def test_straggler_names_the_slow_rank(store: Store) -> None:
    # Synchronous data parallel: every rank's step takes as long as the slowest; the fast ones wait.
    slow = 0.16
    for r in range(4):
        busy = slow if r == 2 else 0.1
        _steps(store, 40, rank=r, busy=lambda i, b=busy: b, comm=lambda i, b=busy: slow - b + 0.002)
    store.flush()
    f = [f for f in diagnose(store) if f.kind == "straggler"]
    assert len(f) == 1
    assert f[0].evidence["slow_rank"] == "2" and f[0].labels["rank"] == "2"
    assert f[0].evidence["slow_vs_others"] == pytest.approx(1.6, abs=0.05)
    assert "rank 2" in f[0].summary


def test_equal_ranks_are_no_stragglers(store: Store) -> None:
    for r in range(4):
        _steps(store, 40, rank=r)
    store.flush()
    assert "straggler" not in _kinds(store)


def test_memory_pressure_from_device_memory(store: Store) -> None:
    steps = _steps(store, 60, mem_peak=lambda i: int(50e9))
    t_hot = steps[40].t_start
    _gpu(store, T0, steps[-1].t_end, used=lambda t: 77e9 if t >= t_hot else 50e9)
    store.flush()
    f = [f for f in diagnose(store) if f.kind == "memory_pressure"]
    assert len(f) == 1 and f[0].start >= steps[39].t_start and f[0].evidence["memory_share"] >= 0.92
    assert "accumulation" in f[0].advice[0] and "ZeRO" in " ".join(f[0].advice)


def test_throttling_during_training(store: Store) -> None:
    steps = _steps(store, 100)
    t_hot = steps[50].t_start
    _gpu(store, T0, steps[-1].t_end, reasons={"hw_thermal": lambda t: 1.0 if t >= t_hot else 0.0, "sw_power_cap": 0.0})
    store.flush()
    f = [f for f in diagnose(store) if f.kind == "throttled"]
    assert len(f) == 1 and f[0].evidence["reason"] == "hw_thermal" and f[0].severity == "critical"
    assert f[0].start >= steps[49].t_start


def test_nan_loss_from_imported_steps_and_monitor_events(store: Store) -> None:
    steps = _steps(store, 30, loss=lambda i: float("nan") if i >= 20 else 2.0)
    store.event(N.EV_TRAIN_NAN, T0 + 1, {"train_job": "k", "rank": "0", "host": "n1"}, {"step": 7, "loss": "inf"})
    store.flush()
    f = sorted((f for f in diagnose(store) if f.kind == "nan_loss"), key=lambda f: f.labels["train_job"])
    assert [x.labels["train_job"] for x in f] == ["j", "k"]
    assert f[0].evidence["first_step"] == 20 and f[0].evidence["nan_steps"] == 10 and f[0].start == steps[20].t_end
    assert f[1].evidence["first_step"] == 7


def test_oom_event_becomes_a_critical_finding(store: Store) -> None:
    store.event(N.EV_TRAIN_OOM, T0, {"train_job": "j", "rank": "0", "host": "n1"}, {"step": 3, "requested_bytes": 2**31, "allocated_bytes": 70e9, "reserved_bytes": 79e9, "largest_free_block_bytes": 2**20})
    store.flush()
    (f,) = [f for f in diagnose(store) if f.kind == "oom"]
    assert f.severity == "critical" and f.evidence["requested_bytes"] == 2**31
    assert "gradient accumulation" in f.advice[0]


def test_step_time_regression_but_not_for_data_waits(store: Store) -> None:
    steps = _steps(store, 120, busy=lambda i: 0.2 if 60 <= i < 90 else 0.1, data=lambda i: 0.3 if 100 <= i < 110 else 0.0005)
    _gpu(store, T0, steps[-1].t_end)
    store.flush()
    f = [f for f in diagnose(store) if f.kind == "step_time_regression"]
    assert len(f) == 1 and f[0].evidence["ratio"] == pytest.approx(2.0, abs=0.1)
    assert steps[58].t_start <= f[0].start <= steps[62].t_start and steps[87].t_end <= f[0].end <= steps[91].t_end
    # The slow data stretch is named as input-bound, not as a regression.
    assert sorted(set(_kinds(store))) == ["input_bound", "step_time_regression"]


def test_underutilized_needs_gpu_data(store: Store) -> None:
    steps = _steps(store, 60)
    store.flush()
    assert _kinds(store) == []  # no GPU series: nothing to say about utilization
    _gpu(store, T0, steps[-1].t_end, util=0.1)
    store.flush()
    assert _kinds(store) == ["underutilized"]


def test_service_scope_skips_training(store: Store) -> None:
    _steps(store, 60, comm=lambda i: 0.2)
    store.flush()
    assert [f for f in diagnose(store, DiagnoseScope(service="api")) if f.workload == "training"] == []


def test_gpu_of_the_rank_is_used_when_the_monitor_named_it(store: Store) -> None:
    # Two GPUs on one host: rank 0 on a busy GPU 0, rank 1 on a mostly idle GPU 1.
    for rank in (0, 1):
        store.event(N.EV_TRAIN_START, T0 - 1, {"train_job": "j", "rank": str(rank), "host": "n1"}, {"gpu": rank, "pid": 10 + rank})
    steps = _steps(store, 60, rank=0)
    _steps(store, 60, rank=1)
    t = T0
    while t <= steps[-1].t_end:
        store.write("gpu_utilization_ratio", {**GPU, "gpu": "0"}, t, 0.95)
        store.write("gpu_utilization_ratio", {**GPU, "gpu": "1", "uuid": "GPU-y"}, t, 0.1)
        t += 0.1
    store.flush()
    found = [(f.kind, f.labels["rank"]) for f in diagnose(store) if f.workload == "training"]
    assert found == [("underutilized", "1")]
