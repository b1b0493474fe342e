"""TrainingMonitor on a real SQLite store: what one step records, failures, misuse."""

from __future__ import annotations

import logging
import math
import sqlite3
import time

import pytest

from gpulens.clock import SYSTEM_CLOCK, FakeClock
from gpulens.errors import MonitorUsageError, StoreError
from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.workload.training import TrainingMonitor

WAIT_S, COMPUTE_S, COMM_S, CKPT_S = 0.125, 0.25, 0.0625, 0.5  # binary fractions: the sums are exact


def _loader(n: int, wait_s: float, clock: FakeClock):
    for i in range(n):
        clock.advance(wait_s)  # the batch takes wait_s to arrive
        yield i


def test_step_records_its_parts_with_labels_and_pid(store: Store) -> None:
    t0 = 1_700_000_000.0
    clock = FakeClock(start=t0)
    mon = TrainingMonitor(job="unit", store=store, flops_per_token=1e6, peak_flops=1e12, flush_interval_seconds=0.05, host="h1",
                          clock=clock)
    for i in mon.data(_loader(12, WAIT_S, clock)):
        with mon.step(samples=4, tokens=256) as s:
            clock.advance(COMPUTE_S)
            with mon.comm():
                clock.advance(COMM_S)
            s.loss = 2.0 - 0.1 * i
        if i == 5:
            with mon.checkpoint():
                clock.advance(CKPT_S)
    mon.close()

    steps = store.events(N.EV_TRAIN_STEP)
    assert len(steps) == 12
    assert all(e.labels == {"train_job": "unit", "rank": "0", "host": "h1"} for e in steps)
    d = steps[3].data
    assert d["pid"] > 0 and d["rank"] == 0 and d["step"] == 3
    assert (d["data_wait_s"], d["comm_wait_s"], d["compute_s"], d["checkpoint_s"]) == (WAIT_S, COMM_S, COMPUTE_S, 0.0)
    assert d["step_s"] == WAIT_S + COMPUTE_S + COMM_S
    assert d["t_end"] - d["t_start"] == d["step_s"]
    # timestamps are the clock's wall time: step 0 begins with the wait for its batch, at the monitor's start
    step_0 = WAIT_S + COMPUTE_S + COMM_S
    assert (steps[0].data["t_start"], steps[0].data["t_end"]) == (t0, t0 + step_0)
    assert steps[-1].data["t_end"] == t0 + 12 * step_0 + CKPT_S == clock.time()
    assert d["loss"] == pytest.approx(1.7)
    # The checkpoint is charged to the step it followed, and only to that one.
    ck = [e.data["checkpoint_s"] for e in steps]
    assert ck == [0.0] * 5 + [CKPT_S] + [0.0] * 6
    assert steps[5].data["step_s"] == step_0 + CKPT_S
    # MFU = tokens/s × FLOPs per token ÷ peak
    assert d["mfu"] == pytest.approx(256 / step_0 * 1e6 / 1e12, rel=1e-12)
    names = set(store.metric_names())
    for name in (N.TRAIN_STEP_SECONDS, N.TRAIN_DATA_WAIT_SECONDS, N.TRAIN_COMM_WAIT_RATIO, N.TRAIN_TOKENS_PER_SECOND, N.TRAIN_MFU_RATIO, N.TRAIN_LOSS, N.TRAIN_CHECKPOINT_SECONDS):
        assert name in names
    start = store.events(N.EV_TRAIN_START)
    assert len(start) == 1 and start[0].data["pid"] == d["pid"] and start[0].data["world_size"] == 1
    assert start[0].t == t0


def test_the_default_clock_is_the_real_one(store: Store) -> None:
    with TrainingMonitor(job="real", store=store) as mon:
        assert mon.clock is SYSTEM_CLOCK
        before = time.time()
        with mon.step():
            pass
    d = store.events(N.EV_TRAIN_STEP)[0].data
    assert before - 1 < d["t_start"] <= d["t_end"] < time.time() + 1 and d["step_s"] >= 0


def test_torch_loss_tensor_is_read_lazily(store: Store) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    with TrainingMonitor(job="torch", store=store, flush_interval_seconds=0.05) as mon:
        for _ in range(5):
            with mon.step(samples=16) as s:
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                s.loss = loss
    losses = [e.data["loss"] for e in store.events(N.EV_TRAIN_STEP)]
    assert len(losses) == 5 and all(isinstance(v, float) and math.isfinite(v) for v in losses)


def test_nan_loss_and_outlier_step_become_events(store: Store) -> None:
    clock = FakeClock()
    with TrainingMonitor(job="bad", store=store, flush_interval_seconds=0.05, warmup_steps=2, clock=clock) as mon:
        for i in range(30):
            with mon.step(samples=1) as s:
                clock.advance(0.5 if i == 20 else 0.015625)
                s.loss = float("nan") if i == 12 else 1.0
    nan = store.events(N.EV_TRAIN_NAN)
    assert [e.data["step"] for e in nan] == [12]
    out = store.events(N.EV_TRAIN_STEP_OUTLIER)
    assert [e.data["step"] for e in out] == [20]
    assert (out[0].data["step_s"], out[0].data["baseline_s"], out[0].data["ratio"]) == (0.5, 0.015625, 32.0)
    assert out[0].data["cause"] == "compute"


def test_oom_is_recorded_at_once_and_reraised(store_path) -> None:
    torch = pytest.importorskip("torch")
    msg = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which 1.50 GiB is free."
    mon = TrainingMonitor(job="oom", store=store_path, flush_interval_seconds=30)
    with pytest.raises(torch.OutOfMemoryError):
        with mon.step(samples=64):
            raise torch.OutOfMemoryError(msg)
    # Written before the error reaches the caller: the job may not live to close the monitor.
    with Store(store_path) as reader:
        ev = reader.events(N.EV_TRAIN_OOM)
    assert len(ev) == 1
    d = ev[0].data
    assert d["requested_bytes"] == 2 * 2**30 and d["device_free_bytes"] == int(1.5 * 2**30)
    assert d["error"] == "OutOfMemoryError" and d["pid"] > 0 and d["step"] == 0
    assert {"allocated_bytes", "reserved_bytes", "largest_free_block_bytes"} <= set(d)
    # The monitor is usable afterwards (the job may catch the error and lower its batch).
    with mon.step(samples=32):
        pass
    mon.close()


def test_other_exceptions_pass_through_unrecorded(store: Store) -> None:
    with TrainingMonitor(job="x", store=store) as mon:
        with pytest.raises(KeyError):
            with mon.step():
                raise KeyError("boom")
        with mon.step():
            pass
    assert store.events(N.EV_TRAIN_OOM) == []
    assert len(store.events(N.EV_TRAIN_STEP)) == 1


def test_failing_store_write_is_retried_not_raised(store_path, caplog) -> None:
    st = Store(store_path, busy_timeout_seconds=0.05)
    mon = TrainingMonitor(job="locked", store=st, flush_interval_seconds=0.05)
    assert mon.flush()
    blocker = sqlite3.connect(store_path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
    caplog.set_level(logging.WARNING, logger="gpulens")
    for _ in range(10):
        with mon.step(samples=2):
            pass
    assert mon.flush(timeout_seconds=5) is False  # not written yet, and nothing raised into the loop
    assert mon.writer.write_failures >= 1
    assert any("retrying" in r.getMessage() for r in caplog.records)
    blocker.execute("COMMIT")
    blocker.close()
    assert mon.flush(timeout_seconds=10) is True
    mon.close()
    assert len(st.events(N.EV_TRAIN_STEP)) == 10
    st.close()


def test_misuse_raises_a_clear_error(store: Store, tmp_path) -> None:
    mon = TrainingMonitor(job="m", store=store)
    with mon.step():
        with pytest.raises(MonitorUsageError, match="step inside a step"):
            with mon.step():
                pass
        with pytest.raises(MonitorUsageError, match="inside a step"):
            with mon.checkpoint():
                pass
    with pytest.raises(MonitorUsageError, match="outside a step"):
        with mon.comm():
            pass
    with pytest.raises(MonitorUsageError, match="no step open"):
        mon.end_step()
    mon.close()
    with pytest.raises(MonitorUsageError, match="after mon.close"):
        with mon.checkpoint():
            pass
    with pytest.raises(MonitorUsageError, match="after mon.close"):
        with mon.step():
            pass
    with pytest.raises(MonitorUsageError, match="job name"):
        TrainingMonitor(job="", store=store)
    with pytest.raises(MonitorUsageError, match="CUDA"):
        TrainingMonitor(job="j", store=store, cuda_timing=True)
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with pytest.raises(StoreError, match="Cannot create the folder"):
        TrainingMonitor(job="j", store=blocked / "x.db")


def test_rank_comes_from_the_environment(store: Store, monkeypatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    with TrainingMonitor(job="env", store=store) as mon:
        with mon.step():
            pass
    assert mon.rank == 3 and mon.world_size == 8
    ev = store.events(N.EV_TRAIN_STEP)
    assert ev[0].labels["rank"] == "3" and ev[0].data["rank"] == 3
    assert store.events(N.EV_TRAIN_START)[0].data["world_size"] == 8


def test_mfu_is_skipped_without_a_known_peak(store: Store) -> None:
    with TrainingMonitor(job="nopeak", store=store, flops_per_token=1e6) as mon:
        with mon.step(tokens=100):
            pass
    assert N.TRAIN_MFU_RATIO not in store.metric_names()
    assert N.TRAIN_TOKENS_PER_SECOND in store.metric_names()


@pytest.mark.gpu
def test_cuda_oom_records_allocator_numbers(store_path) -> None:
    torch = pytest.importorskip("torch")
    mon = TrainingMonitor(job="gpu-oom", store=store_path)
    assert mon.writer._timer is not None
    keep = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    with pytest.raises(torch.OutOfMemoryError):
        with mon.step():
            torch.empty(10 * 2**40, dtype=torch.uint8, device="cuda")
    mon.close()
    with Store(store_path) as st:
        d = st.events(N.EV_TRAIN_OOM)[0].data
    assert d["allocated_bytes"] >= keep.numel() and d["reserved_bytes"] >= d["allocated_bytes"]
    assert d["requested_bytes"] >= 2**40


def test_flush_writes_the_steps_so_far(store: Store) -> None:
    mon = TrainingMonitor(job="live", store=store, flush_interval_seconds=60)
    for _ in range(3):
        with mon.step(samples=1):
            pass
    assert store.events(N.EV_TRAIN_STEP) == []  # nothing yet: the writer runs once a minute here
    assert mon.flush() is True
    assert len(store.events(N.EV_TRAIN_STEP)) == 3
    # Without comm() no communication was measured: unmeasured, not zero.
    assert "comm_wait_s" not in store.events(N.EV_TRAIN_STEP)[0].data
    mon.close()


def test_mfu_peak_comes_from_the_catalog(store: Store) -> None:
    from gpulens.workload.training.device import catalog_peak_flops

    peak = catalog_peak_flops("NVIDIA H200")
    if peak is None:
        pytest.skip("the planner's GPU catalog is not available")
    assert peak == pytest.approx(989e12, rel=0.01)  # dense bf16, vendor datasheet
    clock = FakeClock()
    with TrainingMonitor(job="cat", store=store, flops_per_token=6e9, gpu_name="NVIDIA H200", clock=clock) as mon:
        with mon.step(tokens=8192):
            clock.advance(0.25)
    d = store.events(N.EV_TRAIN_STEP)[0].data
    assert d["step_s"] == 0.25
    assert d["mfu"] == pytest.approx(8192 / 0.25 * 6e9 / peak, rel=1e-12)
    with TrainingMonitor(job="u", store=store, flops_per_token=1.0, gpu_name="no such gpu") as unknown:
        assert unknown.peak_flops is None


def test_a_forgotten_close_still_writes_at_exit(tmp_path) -> None:
    import subprocess
    import sys

    db = tmp_path / "exit.db"
    code = (
        "from gpulens.workload.training import TrainingMonitor\n"
        f"mon = TrainingMonitor(job='exit', store={str(db)!r}, flush_interval_seconds=60)\n"
        "for _ in range(4):\n"
        "    with mon.step(samples=1):\n"
        "        pass\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    with Store(db) as st:
        assert len(st.events(N.EV_TRAIN_STEP)) == 4


def test_grad_scaler_scale_is_recorded(store: Store) -> None:
    torch = pytest.importorskip("torch")
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    with TrainingMonitor(job="fp16", store=store, scaler=scaler) as mon:
        with mon.step(samples=1) as s:
            s.loss = torch.tensor(0.5)
        with mon.step(samples=1) as s:
            s.loss_scale = 2048.0  # an explicit value wins over the scaler
    assert [e.data["loss_scale"] for e in store.events(N.EV_TRAIN_STEP)] == [1024.0, 2048.0]
    assert store.query(N.TRAIN_LOSS_SCALE)[0].value == [1024.0, 2048.0]
