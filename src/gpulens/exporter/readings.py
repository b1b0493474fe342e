"""The newest reading of each GPU, shared by the sampling loop (which writes it) and `/metrics`
scrapes (which read it from another thread)."""

from __future__ import annotations

import threading
import time

from gpulens.gpu.types import GpuInfo, GpuSample
from gpulens.k8s.attribution import DeviceAttribution

# A GPU absent from this many frames in a row is no longer exported: a GPU that fell off the bus
# sends nothing, and a reading kept forever would say `gpu_up 1` for it. A few frames, not one,
# because a replay's frame may hold only the GPUs sampled at that instant.
STALE_AFTER_FRAMES = 3


class LatestReadings:
    """The newest sample of each GPU and the XID counts, shared by the agent loop and the scrapes.

    `gpus` (the backend's static facts) give the labels a sample lacks (PCI bus id, device, driver);
    `attribution`, when set, says which pod holds each GPU."""

    def __init__(self, host: str, gpus: list[GpuInfo] | None = None, attribution: DeviceAttribution | None = None):
        self.host = host
        self.infos: dict[int, GpuInfo] = {g.index: g for g in gpus or []}
        self.attribution = attribution
        self._lock = threading.Lock()
        self._samples: dict[int, GpuSample] = {}
        self._xids: dict[tuple[int, int], int] = {}
        self._xid_last: dict[int, int] = {}
        self._missing: dict[int, int] = {}  # GPU -> frames in a row without a sample of it
        self.source_time: float | None = None  # recorded time of the newest sample (replays)
        self.store_write_failing = False  # set by the sampling loop while the store cannot be written
        self.store_write_error = ""  # the sentence of that failure (for /ready)
        self.last_frame_monotonic: float | None = None  # when the loop last produced a frame (for /ready)

    def update(self, samples: list[GpuSample], source_time: float | None = None) -> None:
        with self._lock:
            seen = {s.gpu for s in samples}
            for s in samples:
                self._samples[s.gpu] = s
                self._missing.pop(s.gpu, None)
            for gpu in [g for g in self._samples if g not in seen]:
                self._missing[gpu] = self._missing.get(gpu, 0) + 1
                if self._missing[gpu] >= STALE_AFTER_FRAMES:
                    del self._samples[gpu]
                    del self._missing[gpu]
            if source_time is not None:
                self.source_time = source_time
            self.last_frame_monotonic = time.monotonic()

    def add_xid(self, gpu: int, xid: int) -> None:
        with self._lock:
            self._xids[(gpu, xid)] = self._xids.get((gpu, xid), 0) + 1
            self._xid_last[gpu] = xid

    def snapshot(self) -> tuple[list[GpuSample], dict[tuple[int, int], int], dict[int, int]]:
        with self._lock:
            return sorted(self._samples.values(), key=lambda s: s.gpu), dict(self._xids), dict(self._xid_last)
