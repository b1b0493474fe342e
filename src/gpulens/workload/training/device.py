"""What the monitor asks torch about the device: lazy CUDA-event timing, allocator numbers, OOM
details and the GPU's peak FLOP/s. torch is never imported here: a loop that uses torch has already
imported it, and a loop that does not gets wall-clock timing only."""

from __future__ import annotations

import logging
import re
import sys
from collections import deque
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


def torch_module() -> Any | None:
    """The torch module if the program imported it (importing it here would cost seconds)."""
    return sys.modules.get("torch")


def cuda_available() -> bool:
    torch = torch_module()
    try:
        return bool(torch is not None and torch.cuda.is_available())
    except Exception:  # a broken driver must not stop training
        return False


class CudaTimer:
    """Start/end CUDA events per step, recorded on the current stream and read back only once the
    GPU has passed them (`Event.query()`), so timing never adds a device synchronization."""

    def __init__(self) -> None:
        torch = torch_module()
        assert torch is not None
        self._Event = torch.cuda.Event
        self._pool: deque[Any] = deque()

    def record(self) -> Any:
        try:
            ev = self._pool.pop()
        except IndexError:
            ev = self._Event(enable_timing=True)
        ev.record()
        return ev

    @staticmethod
    def ready(end: Any) -> bool:
        return bool(end.query())

    def elapsed_seconds(self, start: Any, end: Any) -> float:
        """GPU time between two recorded events; both go back to the pool."""
        try:
            return float(start.elapsed_time(end)) / 1000.0
        finally:
            self._pool.append(start)
            self._pool.append(end)


@dataclass(frozen=True, slots=True)
class AllocatorReading:
    allocated_bytes: int | None = None
    peak_bytes: int | None = None
    reserved_bytes: int | None = None


def read_allocator(device: int | None) -> AllocatorReading:
    """The torch CUDA allocator's counters (host-side numbers: no synchronization)."""
    if not cuda_available():
        return AllocatorReading()
    cuda = torch_module().cuda  # type: ignore[union-attr]
    try:
        return AllocatorReading(
            int(cuda.memory_allocated(device)), int(cuda.max_memory_allocated(device)), int(cuda.memory_reserved(device))
        )
    except Exception:
        return AllocatorReading()


_SIZE = re.compile(r"([\d.]+)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)\b")
_SCALE = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def _size(text: str) -> int | None:
    m = _SIZE.search(text)
    return int(float(m.group(1)) * _SCALE[m.group(2)]) if m else None


def is_oom(exc: BaseException) -> bool:
    torch = torch_module()
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError | MemoryError) and "out of memory" in str(exc).lower()


def oom_details(exc: BaseException, device: int | None) -> dict[str, Any]:
    """Allocator numbers at an out-of-memory error, and what the message says was requested."""
    msg = str(exc)
    out: dict[str, Any] = {"message": msg.splitlines()[0][:500] if msg else type(exc).__name__, "error": type(exc).__name__}
    m = re.search(r"Tried to allocate ([\d.]+\s*\w+)", msg)
    out["requested_bytes"] = _size(m.group(1)) if m else None
    m = re.search(r"of which ([\d.]+\s*\w+) is free", msg)
    out["device_free_bytes"] = _size(m.group(1)) if m else None
    reading = read_allocator(device)
    out["allocated_bytes"] = reading.allocated_bytes
    out["reserved_bytes"] = reading.reserved_bytes
    out["peak_bytes"] = reading.peak_bytes
    out["largest_free_block_bytes"] = _largest_free_block(device)
    return out


def _largest_free_block(device: int | None) -> int | None:
    """The largest cached-but-free block: what the allocator could hand out without asking the driver."""
    if not cuda_available():
        return None
    try:
        segments = torch_module().cuda.memory_snapshot()  # type: ignore[union-attr]
        sizes = [b["size"] for s in segments if device is None or s.get("device") == device for b in s.get("blocks", ()) if b.get("state") == "inactive"]
        return max(sizes) if sizes else 0
    except Exception:
        return None


def device_index() -> int | None:
    if not cuda_available():
        return None
    try:
        return int(torch_module().cuda.current_device())  # type: ignore[union-attr]
    except Exception:
        return None


def device_name(device: int | None) -> str | None:
    if device is None:
        return None
    try:
        return str(torch_module().cuda.get_device_name(device))  # type: ignore[union-attr]
    except Exception:
        return None


def catalog_peak_flops(gpu_name: str | None) -> float | None:
    """Dense bf16 FLOP/s of `gpu_name` from the planner's catalog, or None if unknown/unavailable."""
    if not gpu_name:
        return None
    try:
        from gpulens.plan.catalog import find_gpu  # the planner's catalog (may not be installed yet)
    except Exception:
        return None
    try:
        spec = find_gpu(gpu_name)
        peak = getattr(spec, "bf16_dense_flops", None) if spec is not None else None
        return float(peak) if peak else None
    except Exception:
        return None
