"""The hardware seam: `GpuBackend` and its implementations (NVML, fake, replay).

`gpulens.gpu.nvml` is imported only when the NVML backend is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpulens.errors import BadInputError, shown
from gpulens.gpu.backend import GpuBackend
from gpulens.gpu.types import (
    ClockEvent,
    GpuInfo,
    GpuProcess,
    GpuSample,
    MigInstanceSample,
    XidEvent,
    decode_clock_events,
)
from gpulens.lazy import lazy_getattr

# The fake and replay backends load on first use (PEP 562): the NVML backend and a run's
# fingerprint (gpulens.runs) import this package without paying for a trace reader.
_LAZY = {"FakeBackend": "gpulens.gpu.fake", "ReplayBackend": "gpulens.gpu.replay"}

if TYPE_CHECKING:
    from gpulens.gpu.fake import FakeBackend
    from gpulens.gpu.replay import ReplayBackend


__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = [
    "ClockEvent",
    "FakeBackend",
    "GpuBackend",
    "GpuInfo",
    "GpuProcess",
    "GpuSample",
    "MigInstanceSample",
    "ReplayBackend",
    "XidEvent",
    "decode_clock_events",
    "open_backend",
    "nvidia_driver_present",
]


def nvidia_driver_present() -> bool:
    from gpulens.gpu.nvml import driver_available

    return driver_available()


def open_backend(spec: str | None, *, speed: float | None = 1.0, rebase: bool = True, loop: bool = False,
                 max_gap_seconds: float | None = None) -> GpuBackend:
    """A backend from a command-line spec: `nvml`, `fake`, `fake:N`, `replay:PATH` (or `replay` for the
    bundled H200 session). None picks NVML when a driver is present."""
    from gpulens.errors import BackendUnavailableError

    if spec is None:
        if nvidia_driver_present():
            spec = "nvml"
        else:
            raise BackendUnavailableError(
                "No NVIDIA driver was found on this machine, so there are no real GPUs to watch.",
                hint="Use --backend fake (simulated GPUs) or --backend replay (the bundled H200 session).",
            )
    kind, _, arg = spec.partition(":")
    if kind == "nvml":
        from gpulens.gpu.nvml import NvmlBackend

        return NvmlBackend()
    if kind == "fake":
        from gpulens.gpu.fake import FakeBackend, parse_fake_spec

        return FakeBackend(gpus=parse_fake_spec(spec))
    if kind == "replay":
        from gpulens.data import bundled_trace
        from gpulens.gpu.replay import ReplayBackend

        gap = {} if max_gap_seconds is None else {"max_gap_seconds": max_gap_seconds}
        return ReplayBackend(arg or bundled_trace(), speed=speed, rebase=rebase, loop=loop, **gap)
    raise BadInputError(f"Unknown backend {shown(spec)}.", hint="Use nvml, fake, fake:N, replay or replay:PATH.")
