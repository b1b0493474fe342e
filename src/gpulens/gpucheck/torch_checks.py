"""The training monitor on a real CUDA loop: its overhead against the same loop bare (CUDA events, no
per-step synchronisation), whether its CUDA-event step times match the GPU's, and a real out-of-memory
error inside `mon.step()` with the allocator numbers it recorded."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

GiB = 1024**3
OVERHEAD_LIMIT = 0.02  # the monitor's budget: 2 % of a step


def overhead_ratio(bare_seconds: list[float], monitored_seconds: list[float]) -> float:
    """Median of the monitored blocks over the median of the bare ones, minus 1 (blocks alternate,
    bare then monitored, so a clock drift or a thermal slowdown hits both alike)."""
    if not bare_seconds or not monitored_seconds:
        raise ValueError("need at least one bare and one monitored block")
    return statistics.median(monitored_seconds) / statistics.median(bare_seconds) - 1.0


def _model(torch: Any, width: int, batch: int, device: str) -> tuple[Any, Any, Any]:
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, width)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device=device)
    return model, opt, x


def _step(model: Any, opt: Any, x: Any) -> Any:
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def monitor_overhead(*, blocks: int = 6, steps_per_block: int = 200, width: int = 4096, batch: int = 1024,
                     device: str = "cuda", clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """Alternating blocks of the bare loop and the monitored loop; each block ends with one
    synchronize (as a real loop does at logging time), never per step. The default model is fp32 and
    takes a few ms a step on an H200: GPU-bound, as real training is. `device="cpu"` runs the same
    code without CUDA events (how the tests exercise it)."""
    import torch

    from gpulens.workload.training.monitor import TrainingMonitor

    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model, opt, x = _model(torch, width, batch, device)
    for _ in range(min(20, steps_per_block)):  # warm-up: cuBLAS handles, allocator pools
        _step(model, opt, x)
    sync()
    gpu_step_s = None
    if cuda:  # the GPU time of one step, measured directly (events around a synchronized block)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps_per_block):
            _step(model, opt, x)
        end.record()
        end.synchronize()
        gpu_step_s = start.elapsed_time(end) / 1000 / steps_per_block
    records: list[Any] = []
    bare: list[float] = []
    monitored: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        mon = TrainingMonitor("gpu-check", Path(tmp) / "check.db", cuda_timing=cuda, rank=0, world_size=1)
        mon.on_step(records.append)
        try:
            for _ in range(blocks):
                t0 = clock()
                for _ in range(steps_per_block):
                    _step(model, opt, x)
                sync()
                bare.append(clock() - t0)
                t0 = clock()
                for _ in range(steps_per_block):
                    with mon.step(samples=x.shape[0]):
                        _step(model, opt, x)
                sync()
                monitored.append(clock() - t0)
            mon.flush()
        finally:
            mon.close()
    compute = [r.compute_s for r in records if r.compute_s is not None][steps_per_block:]  # after the first block
    ratio = overhead_ratio(bare, monitored)
    recorded_step_s = statistics.median(compute) if compute else None
    return {
        "device": device,
        "steps_per_block": steps_per_block,
        "blocks": blocks,
        "bare_block_seconds": bare,
        "monitored_block_seconds": monitored,
        "overhead_ratio": ratio,
        "overhead_ok": ratio <= OVERHEAD_LIMIT,
        "steps_recorded": len(records),
        "gpu_step_seconds_measured": gpu_step_s,
        "gpu_step_seconds_recorded_median": recorded_step_s,
        # CUDA events around each step: with no per-step sync they still time the GPU's work
        "cuda_timing_ok": (recorded_step_s is not None and gpu_step_s is not None
                           and abs(recorded_step_s - gpu_step_s) <= 0.25 * gpu_step_s) if cuda else None,
    }


def forced_oom(*, hold_bytes: int = 2 * GiB) -> dict[str, Any]:
    """Hold `hold_bytes`, then ask for more than the GPU has inside `mon.step()`; read back the
    train_oom event the monitor wrote and check its numbers against the allocator's own."""
    import torch

    from gpulens.store import Store
    from gpulens.vocab import names as wn
    from gpulens.workload.training.monitor import TrainingMonitor

    free, total = torch.cuda.mem_get_info()
    held = torch.empty(hold_bytes, dtype=torch.uint8, device="cuda")
    allocated_before = torch.cuda.memory_allocated()
    reserved_before = torch.cuda.memory_reserved()
    ask = int(total * 2)  # more than the device has: the allocator must refuse
    raised = None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "oom.db"
        mon = TrainingMonitor("gpu-check-oom", path, cuda_timing=True, rank=0, world_size=1)
        try:
            with mon.step():
                torch.empty(ask, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError as e:
            raised = type(e).__name__
        finally:
            mon.close()
        with Store(path, readonly=True) as st:
            events = st.events(wn.EV_TRAIN_OOM)
    del held
    torch.cuda.empty_cache()
    out: dict[str, Any] = {"raised": raised, "asked_bytes": ask, "held_bytes": hold_bytes,
                           "allocated_before_bytes": allocated_before, "reserved_before_bytes": reserved_before,
                           "device_total_bytes": total, "device_free_before_bytes": free, "events": len(events)}
    if not events:
        out["ok"] = False
        return out
    data = events[-1].data
    out["recorded"] = {k: data.get(k) for k in ("requested_bytes", "device_free_bytes", "allocated_bytes", "reserved_bytes",
                                                "peak_bytes", "largest_free_block_bytes", "error")}
    out["checks"] = checks = oom_checks(data, ask=ask, allocated_before=allocated_before, reserved_before=reserved_before,
                                        total=total)
    out["ok"] = raised is not None and all(checks.values())
    return out


def oom_checks(data: dict[str, Any], *, ask: int, allocated_before: int, reserved_before: int, total: int) -> dict[str, bool]:
    """What a recorded OOM must say: the size asked (from torch's message, which rounds to 2 decimals of
    its unit), the allocator's allocated/reserved at that moment, and a free figure below the total."""
    req, alloc, res, free = (data.get(k) for k in ("requested_bytes", "allocated_bytes", "reserved_bytes", "device_free_bytes"))
    return {
        "requested_bytes_is_the_ask": req is not None and abs(req - ask) <= 0.01 * ask,
        "allocated_bytes_is_what_was_held": alloc == allocated_before,
        "reserved_at_least_allocated": res is not None and alloc is not None and res >= alloc and res >= reserved_before,
        "device_free_below_total": free is not None and 0 <= free < total,
    }
