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

from gpulens.errors import (
    BackendUnavailableError,
    BadInputError,
    GpulensError,
    MonitorUsageError,
    PortInUseError,
    StoreError,
    TraceError,
)
from gpulens.gpu import FakeBackend, GpuBackend, GpuInfo, GpuProcess, GpuSample, ReplayBackend, XidEvent
from gpulens.runs import add_note, save_run, take_fingerprint
from gpulens.store import Store
from gpulens.workload.inference import InferenceMiddleware, InferenceMonitor
from gpulens.workload.training import TrainingMonitor

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
    "XidEvent",
    "add_note",
    "save_run",
    "take_fingerprint",
    "__version__",
]
