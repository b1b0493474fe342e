"""Rank detection and communication timing under torch.distributed.

Two ways to measure communication wait, both feeding `TrainingMonitor.add_comm_wait`:
- `mon.comm()` around the user's own collectives (or `timed_collectives(mon)` to wrap the
  synchronous torch.distributed collectives for the monitor's lifetime);
- `ddp_comm_hook(mon)` for DistributedDataParallel: it runs the usual all-reduce and charges the
  time from the first bucket's launch to the last bucket's completion that the backward pass did
  not overlap with computation.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from gpulens.workload.training.device import torch_module

if TYPE_CHECKING:
    from gpulens.workload.training.monitor import TrainingMonitor

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "broadcast", "barrier", "all_to_all")


def detect_rank() -> tuple[int, int, int | None]:
    """(rank, world size, local rank) from an initialized process group, else torchrun's env."""
    torch = torch_module()
    dist = getattr(torch, "distributed", None) if torch is not None else None
    local = os.environ.get("LOCAL_RANK")
    local_rank = int(local) if local and local.isdigit() else None
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size()), local_rank
    except Exception:
        pass
    rank = os.environ.get("RANK", "0")
    world = os.environ.get("WORLD_SIZE", "1")
    return (int(rank) if rank.isdigit() else 0), (int(world) if world.isdigit() else 1), local_rank


@contextmanager
def timed_collectives(mon: TrainingMonitor) -> Iterator[None]:
    """Charge every synchronous torch.distributed collective called inside a step to the step's
    communication wait, while the block runs."""
    torch = torch_module()
    if torch is None:
        yield
        return
    dist = torch.distributed
    originals: dict[str, Callable[..., Any]] = {}

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not mon.in_step or kwargs.get("async_op"):
                return fn(*args, **kwargs)
            t0 = mon.clock.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                mon.add_comm_wait(mon.clock.monotonic() - t0)

        return timed

    for name in COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is not None:
            originals[name] = fn
            setattr(dist, name, wrap(fn))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


def ddp_comm_hook(mon: TrainingMonitor, process_group: Any = None) -> tuple[Any, Callable[[Any, Any], Any]]:
    """(state, hook) for `DistributedDataParallel.register_comm_hook(state, hook)`.

    The hook averages gradients as DDP's default does. It measures, per backward pass, the span
    from the end of the last bucket's launch to the completion of every bucket: the time the
    optimizer step has to wait for communication, which is what slows a communication-bound job."""
    torch = torch_module()
    assert torch is not None, "torch is required for a DDP hook"
    dist = torch.distributed
    state = {"pending": 0, "last_launch": 0.0}

    # No annotations on purpose: DDP rejects any annotation but its own classes.
    def hook(st, bucket):  # type: ignore[no-untyped-def]
        group = process_group or dist.group.WORLD
        world = dist.get_world_size(group)
        tensor = bucket.buffer().div_(world)
        st["pending"] += 1
        st["last_launch"] = mon.clock.monotonic()
        fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

        def done(f):  # type: ignore[no-untyped-def]
            st["pending"] -= 1
            if st["pending"] == 0:
                mon.add_comm_wait(max(0.0, mon.clock.monotonic() - st["last_launch"]))
            return f.value()[0]

        return fut.then(done)

    return state, hook
