"""A `GpuSample` as series values, by the names of `gpulens.vocab.gpu` (the store writer, the exporter
and the recorder share this one reading of a sample)."""

from __future__ import annotations

from collections.abc import Iterator

from gpulens.gpu.types import CLOCK_EVENT_LABELS, GpuSample, MigInstanceSample
from gpulens.vocab.gpu import (
    GPU_CLOCK_EVENT_ACTIVE,
    GPU_METRICS,
    GPU_PROCESS_COUNT,
    GPU_PROCESS_MEMORY,
    GPU_UP,
    GpuMetric,
)

# What NVML reads per MIG GPU instance: the rows above whose field a MigInstanceSample also has.
MIG_METRICS: tuple[GpuMetric, ...] = tuple(m for m in GPU_METRICS if m.field in MigInstanceSample.__dataclass_fields__)


def gpu_labels(sample: GpuSample, host: str) -> dict[str, str]:
    return {"gpu": str(sample.gpu), "uuid": sample.uuid, "model": sample.name, "host": host}


def sample_values(sample: GpuSample) -> Iterator[tuple[str, dict[str, str], float]]:
    """(metric name, extra labels, value) for every available value of one sample."""
    yield GPU_UP, {}, 0.0 if sample.lost else 1.0
    if sample.lost:
        return
    for m in GPU_METRICS:
        v = getattr(sample, m.field)
        if v is not None:
            yield m.name, {}, float(v)
    mask = sample.clock_event_mask
    if mask is not None:
        for bit, reason in CLOCK_EVENT_LABELS.items():
            yield GPU_CLOCK_EVENT_ACTIVE, {"reason": reason}, 1.0 if mask & bit else 0.0
    count = sample.compute_process_count
    if count is None and sample.processes is not None:
        count = len(sample.processes)
    if count is not None:
        yield GPU_PROCESS_COUNT, {}, float(count)
    if sample.processes:
        for p in sample.processes:
            if p.used_memory_bytes is not None:
                yield GPU_PROCESS_MEMORY, {"pid": str(p.pid), "process": p.name}, float(p.used_memory_bytes)
