"""gpulens: GPU observability that knows training from inference.

Public API (tests import only from here):
- GPU seam: `GpuBackend`, `FakeBackend`, `ReplayBackend`, `GpuSample`, `GpuInfo`, `XidEvent`
- the store: `Store`
- serving: `InferenceMonitor`, `InferenceMiddleware` (ASGI)
- training: `TrainingMonitor` (needs nothing heavy to import; torch is used when present)
- runs: `save_run`, `add_note`, `take_fingerprint`
- errors: `GpulensError` and its subclasses
"""

from __future__ import annotations

__version__ = "0.1.0"

from typing import TYPE_CHECKING

from gpulens.errors import (
    BackendUnavailableError,
    BadInputError,
    GpulensError,
    MonitorUsageError,
    PortInUseError,
    StoreError,
    TraceError,
    UnavailableError,
)
from gpulens.lazy import lazy_getattr

# The rest of the public API loads on first use (PEP 562), so `import gpulens.runs` in a training
# script, or the CLI's start-up, does not pay for the store, the monitors and the GPU backends.
_LAZY = {
    "FakeBackend": "gpulens.gpu", "GpuBackend": "gpulens.gpu", "GpuInfo": "gpulens.gpu",
    "GpuProcess": "gpulens.gpu", "GpuSample": "gpulens.gpu", "ReplayBackend": "gpulens.gpu",
    "XidEvent": "gpulens.gpu",
    "add_note": "gpulens.runs", "save_run": "gpulens.runs", "take_fingerprint": "gpulens.runs",
    "Store": "gpulens.store",
    "InferenceMiddleware": "gpulens.workload.inference", "InferenceMonitor": "gpulens.workload.inference",
    "TrainingMonitor": "gpulens.workload.training",
}

if TYPE_CHECKING:
    from gpulens.gpu import FakeBackend, GpuBackend, GpuInfo, GpuProcess, GpuSample, ReplayBackend, XidEvent
    from gpulens.runs import add_note, save_run, take_fingerprint
    from gpulens.store import Store
    from gpulens.workload.inference import InferenceMiddleware, InferenceMonitor
    from gpulens.workload.training import TrainingMonitor


__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = [
    "BackendUnavailableError",
    "BadInputError",
    "FakeBackend",
    "GpuBackend",
    "GpuInfo",
    "GpuProcess",
    "GpuSample",
    "GpulensError",
    "InferenceMiddleware",
    "InferenceMonitor",
    "MonitorUsageError",
    "PortInUseError",
    "ReplayBackend",
    "Store",
    "StoreError",
    "TraceError",
    "TrainingMonitor",
    "UnavailableError",
    "XidEvent",
    "add_note",
    "save_run",
    "take_fingerprint",
    "__version__",
]
