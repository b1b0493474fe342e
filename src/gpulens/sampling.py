"""GPU samples -> store rows, with series ids cached so the hot path is a tuple append."""

from __future__ import annotations

import socket

from gpulens.gpu.metrics import GPU_XID_LAST, GPU_XID_TOTAL, gpu_labels, sample_values
from gpulens.gpu.types import GpuSample, XidEvent
from gpulens.store import Store


class SampleWriter:
    """Writes GPU samples and XID events to a store under the labels gpu, uuid, model and host."""

    def __init__(self, store: Store, host: str | None = None):
        self.store = store
        self.host = host or socket.gethostname()
        self._ids: dict[tuple[int, str, tuple[tuple[str, str], ...]], int] = {}
        self._base: dict[tuple[int, str], dict[str, str]] = {}
        self._xid_counts: dict[tuple[int, int], int] = {}
        self.samples_written = 0

    def _sid(self, s: GpuSample, name: str, extra: dict[str, str]) -> int:
        key = (s.gpu, name, tuple(sorted(extra.items())) if extra else ())
        sid = self._ids.get(key)
        if sid is None:
            base = self._base.get((s.gpu, s.uuid))
            if base is None:
                base = self._base[(s.gpu, s.uuid)] = gpu_labels(s, self.host)
            sid = self._ids[key] = self.store.series_id(name, {**base, **extra} if extra else base)
        return sid

    def write_samples(self, samples: list[GpuSample]) -> int:
        rows = []
        for s in samples:
            t = s.t
            for name, extra, value in sample_values(s):
                rows.append((self._sid(s, name, extra), t, value))
        self.store.write_many(rows)
        self.samples_written += len(rows)
        return len(rows)

    def write_xid(self, ev: XidEvent, model: str = "") -> None:
        labels = {"gpu": str(ev.gpu), "uuid": ev.uuid, "model": model, "host": self.host}
        self.store.event("xid", ev.t, labels, {"xid": ev.xid})
        n = self._xid_counts[(ev.gpu, ev.xid)] = self._xid_counts.get((ev.gpu, ev.xid), 0) + 1
        self.store.write(GPU_XID_TOTAL, {**labels, "xid": str(ev.xid)}, ev.t, float(n))
        self.store.write(GPU_XID_LAST, labels, ev.t, float(ev.xid))

    def xid_counts(self) -> dict[tuple[int, int], int]:
        """(gpu, xid) -> errors seen, for the exporter."""
        return dict(self._xid_counts)
