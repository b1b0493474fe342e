"""The training-step record: one shape for the live monitor, the importer and the diagnosis.

A record's field names follow the recorded H200 session (`t_start`, `t_end`, `data_wait_s`,
`compute_s`, `checkpoint_s`, `step_s`, ...), so a gpulens recording and the bundled trace are read
the same way. Fields a source did not measure are None, never 0: "not measured" is not "no wait".
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from gpulens.store import Store
from gpulens.units import MIN_TIME_SECONDS
from gpulens.vocab import names as N
from gpulens.workload.fields import count, duration, number, time_point


@dataclass(slots=True)
class StepRecord:
    t_start: float  # unix seconds, when the step began (its data wait included)
    t_end: float  # unix seconds, when it ended (its checkpoint included)
    step: int | None = None
    step_s: float | None = None  # data wait + compute + communication wait + checkpoint
    data_wait_s: float | None = None
    compute_s: float | None = None
    comm_wait_s: float | None = None
    checkpoint_s: float | None = None
    samples: int | None = None  # batch size of this step (on this rank)
    tokens: int | None = None
    loss: float | None = None
    loss_scale: float | None = None
    mem_alloc: int | None = None  # bytes, torch allocator, after the step
    mem_peak: int | None = None
    mem_reserved: int | None = None
    mfu: float | None = None  # ratio 0..1
    pid: int | None = None
    rank: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def duration_seconds(self) -> float:
        return self.step_s if self.step_s is not None else max(0.0, self.t_end - self.t_start)

    @property
    def busy_seconds(self) -> float:
        """Step time not explained by waiting for data, other ranks or a checkpoint."""
        return max(0.0, self.duration_seconds - (self.data_wait_s or 0.0) - (self.comm_wait_s or 0.0) - (self.checkpoint_s or 0.0))

    def to_event_data(self) -> dict[str, Any]:
        """The record as an event's data: measured fields only (dataclasses.asdict is 10× slower)."""
        d = {k: v for k in _RECORD_FIELDS if (v := getattr(self, k)) is not None}
        for k, v in self.extra.items():
            d.setdefault(k, v)
        return d


_RECORD_FIELDS = tuple(f.name for f in fields(StepRecord) if f.name != "extra")


# Field names other recorders use for the same quantity (first found wins).
_ALIASES: dict[str, tuple[str, ...]] = {
    "samples": ("samples", "batch", "batch_size"),
    "mem_alloc": ("mem_alloc", "memory_allocated_bytes"),
    "mem_peak": ("mem_peak", "memory_peak_bytes"),
    "mem_reserved": ("mem_reserved", "memory_reserved_bytes"),
}
# Recorder bookkeeping that must not steer a diagnosis (a live monitor has no phase labels),
# and the labels of the series.
_DROPPED = {"kind", "phase", "t", "role", "job", "train_job", "host"}  # job (train_job) and host are labels


def record_from_dict(d: dict[str, Any]) -> StepRecord | None:
    """A StepRecord from a recorded `train_step` line (H200 trace, co-location recording or a
    gpulens recording). None when it has no usable times."""
    t_end = time_point(d.get("t_end", d.get("t")))
    step_s = duration(d.get("step_s"))
    t_start = time_point(d.get("t_start"))
    if t_end is None:
        return None
    if t_start is None:
        if step_s is None:
            return None
        t_start = t_end - step_s
        if t_start < MIN_TIME_SECONDS:
            return None
    if step_s is None:
        step_s = max(0.0, t_end - t_start)

    def pick(key: str) -> Any:
        for k in _ALIASES.get(key, (key,)):
            if k in d:
                return d[k]
        return None

    known = {"t_start", "t_end", "step", "step_s", "data_wait_s", "compute_s", "comm_wait_s", "checkpoint_s",
             "tokens", "loss", "loss_scale", "mfu", "pid", "rank"}
    known.update(k for ks in _ALIASES.values() for k in ks)
    return StepRecord(
        t_start=t_start,
        t_end=t_end,
        step=count(d.get("step")),
        step_s=step_s,
        data_wait_s=duration(d.get("data_wait_s")),
        compute_s=duration(d.get("compute_s")),
        comm_wait_s=duration(d.get("comm_wait_s")),
        checkpoint_s=duration(d.get("checkpoint_s")),
        samples=count(pick("samples")),
        tokens=count(d.get("tokens")),
        loss=number(d.get("loss")),
        loss_scale=number(d.get("loss_scale")),
        mem_alloc=count(pick("mem_alloc")),
        mem_peak=count(pick("mem_peak")),
        mem_reserved=count(pick("mem_reserved")),
        mfu=number(d.get("mfu")),
        pid=count(d.get("pid")),
        rank=count(d.get("rank")) or 0,
        extra={k: v for k, v in d.items() if k not in known and k not in _DROPPED},
    )


def step_fault(d: dict[str, Any]) -> str | None:
    """What makes a recorded step impossible, or None: it ends before it begins. (A step the
    parser reads without its times is None from `record_from_dict`.)"""
    t_start, t_end = time_point(d.get("t_start")), time_point(d.get("t_end", d.get("t")))
    if t_start is not None and t_end is not None and t_end < t_start:
        return f"it ends {t_start - t_end:.3g} s before it starts (t_end {t_end!r} < t_start {t_start!r})"
    return None


def step_series_values(rec: StepRecord, peak_flops: float | None = None, flops_per_token: float | None = None) -> list[tuple[str, float]]:
    """(series name, value) pairs one step contributes, all at its end time."""
    dur = rec.duration_seconds
    out: list[tuple[str, float]] = [(N.TRAIN_STEP_SECONDS, dur)]
    for name, v in (
        (N.TRAIN_DATA_WAIT_SECONDS, rec.data_wait_s),
        (N.TRAIN_COMPUTE_SECONDS, rec.compute_s),
        (N.TRAIN_COMM_WAIT_SECONDS, rec.comm_wait_s),
        # one sample per checkpoint, not a zero per step
        (N.TRAIN_CHECKPOINT_SECONDS, rec.checkpoint_s if rec.checkpoint_s else None),
        (N.TRAIN_LOSS, rec.loss),
        (N.TRAIN_LOSS_SCALE, rec.loss_scale),
        (N.TRAIN_MEMORY_ALLOCATED_BYTES, rec.mem_alloc),
        (N.TRAIN_MEMORY_PEAK_BYTES, rec.mem_peak),
        (N.TRAIN_MEMORY_RESERVED_BYTES, rec.mem_reserved),
        (N.TRAIN_BATCH_SIZE, rec.samples),
    ):
        if v is not None:
            out.append((name, float(v)))
    if dur > 0:
        if rec.data_wait_s is not None:
            out.append((N.TRAIN_DATA_WAIT_RATIO, min(1.0, rec.data_wait_s / dur)))
        if rec.comm_wait_s is not None:
            out.append((N.TRAIN_COMM_WAIT_RATIO, min(1.0, rec.comm_wait_s / dur)))
        if rec.samples is not None:
            out.append((N.TRAIN_SAMPLES_PER_SECOND, rec.samples / dur))
        if rec.tokens is not None:
            out.append((N.TRAIN_TOKENS_PER_SECOND, rec.tokens / dur))
            mfu = rec.mfu
            if mfu is None and peak_flops and flops_per_token:
                mfu = rec.tokens / dur * flops_per_token / peak_flops
            if mfu is not None:
                out.append((N.TRAIN_MFU_RATIO, mfu))
    return out


def write_step(store: Store, labels: dict[str, str], rec: StepRecord, ids: dict[str, int] | None = None, **mfu_args: float | None) -> None:
    """Write one step's series and its `train_step` event. `ids` caches series ids per name."""
    for name, value in step_series_values(rec, **mfu_args):
        if ids is None:
            store.write(name, labels, rec.t_end, value)
            continue
        sid = ids.get(name)
        if sid is None:
            sid = ids[name] = store.series_id(name, labels)
        store.write_id(sid, rec.t_end, value)
    store.event(N.EV_TRAIN_STEP, rec.t_end, labels, rec.to_event_data())
