"""GPU samples -> store rows. Series ids are resolved once per GPU, so the hot path is a loop of
attribute reads and tuple appends (the agent's cost budget is well under 1 % of a core)."""

from __future__ import annotations

from operator import attrgetter

from gpulens.gpu.metrics import gpu_labels
from gpulens.gpu.types import CLOCK_EVENT_LABELS, GpuSample, XidEvent
from gpulens.k8s.node import node_host
from gpulens.store import Store
from gpulens.vocab.gpu import (
    GPU_CLOCK_EVENT_ACTIVE,
    GPU_METRICS,
    GPU_PROCESS_COUNT,
    GPU_PROCESS_MEMORY,
    GPU_UP,
    GPU_XID_LAST,
    GPU_XID_TOTAL,
)


class _GpuSeries:
    """The series ids of one GPU."""

    def __init__(self, store: Store, labels: dict[str, str]):
        self.store = store
        self.labels = labels
        self.up = store.series_id(GPU_UP, labels)
        self.field_sids = tuple(store.series_id(m.name, labels) for m in GPU_METRICS)
        self.field_values = attrgetter(*(m.field for m in GPU_METRICS))  # every field in one call, in that order
        self.clock_events = [(int(bit), store.series_id(GPU_CLOCK_EVENT_ACTIVE, {**labels, "reason": r})) for bit, r in CLOCK_EVENT_LABELS.items()]
        self.process_count = store.series_id(GPU_PROCESS_COUNT, labels)
        self.process_memory: dict[tuple[int, str], int] = {}

    def process_sid(self, pid: int, name: str) -> int:
        sid = self.process_memory.get((pid, name))
        if sid is None:
            sid = self.process_memory[(pid, name)] = self.store.series_id(GPU_PROCESS_MEMORY, {**self.labels, "pid": str(pid), "process": name})
        return sid


class SampleWriter:
    """Writes GPU samples and XID events to a store under the labels gpu, uuid, model and host.
    The values written are exactly those of `gpu.metrics.sample_values` (a test holds them equal)."""

    def __init__(self, store: Store, host: str | None = None):
        self.store = store
        self.host = node_host(host)
        self._gpus: dict[tuple[int, str], _GpuSeries] = {}
        self._xid_counts: dict[tuple[int, int], int] = {}
        self.samples_written = 0

    def _series(self, s: GpuSample) -> _GpuSeries:
        g = self._gpus.get((s.gpu, s.uuid))
        if g is None:
            g = self._gpus[(s.gpu, s.uuid)] = _GpuSeries(self.store, gpu_labels(s, self.host))
        return g

    def write_samples(self, samples: list[GpuSample]) -> int:
        rows: list[tuple[int, float, float]] = []
        append = rows.append
        for s in samples:
            g = self._series(s)
            t = s.t
            append((g.up, t, 0.0 if s.lost else 1.0))
            if s.lost:
                continue
            rows += [(sid, t, float(v)) for sid, v in zip(g.field_sids, g.field_values(s), strict=True) if v is not None]
            mask = s.clock_event_mask
            if mask is not None:
                for bit, sid in g.clock_events:
                    append((sid, t, 1.0 if mask & bit else 0.0))
            count = s.compute_process_count
            if count is None and s.processes is not None:
                count = len(s.processes)
            if count is not None:
                append((g.process_count, t, float(count)))
            if s.processes:
                for p in s.processes:
                    if p.used_memory_bytes is not None:
                        append((g.process_sid(p.pid, p.name), t, float(p.used_memory_bytes)))
        self.store.write_many(rows)
        self.samples_written += len(rows)
        return len(rows)

    def write_xid(self, ev: XidEvent, model: str = "") -> None:
        labels = {"gpu": str(ev.gpu), "uuid": ev.uuid, "model": model, "host": self.host}
        self.store.event("xid", ev.t, labels, {"xid": ev.xid})
        n = self._xid_counts[(ev.gpu, ev.xid)] = self._xid_counts.get((ev.gpu, ev.xid), 0) + 1
        self.store.write(GPU_XID_TOTAL, {**labels, "xid": str(ev.xid)}, ev.t, float(n))
        self.store.write(GPU_XID_LAST, labels, ev.t, float(ev.xid))
