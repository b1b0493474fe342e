"""What a gpulens store can teach the planner's calibration: `gpulens bench train` runs (measured
tokens/s x FLOPs per token = the achieved rate) and the healthy steps of monitored training jobs
(their MFU, per job and batch size). The planner reads no store; `gpulens plan calibrate --store`
calls this and passes the list on.

A step is healthy when its time is the model's and the GPU's, not something else's: not in
warm-up (compilation, allocator and cache warm-up), not waiting for data (input-bound), not
writing a checkpoint, and with an MFU that is possible at all. Everything left out is reported
with its reason, so a user sees what the fit stood on.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from gpulens.mfu import MFU_IMPOSSIBLE
from gpulens.plan.calibration import Rejected
from gpulens.plan.measured_runs import Measurement
from gpulens.plan.models import ModelSpec
from gpulens.runs.registry import list_runs
from gpulens.store import Store
from gpulens.vocab import names as N

DATA_WAIT_RATIO_MAX = 0.2  # a step that waited longer than this share for its batch is input-bound
WARMUP_STEPS = 3  # the first steps of a job, and the first after its batch size changes
MIN_HEALTHY_STEPS = 3  # fewer healthy steps of one configuration are not a measurement

# these runs carry rates, not shapes
_NO_SHAPES = ModelSpec("recorded", "llama", 64, 1, 1, 1, 64, 64, 64)


@dataclass
class StoreMeasurements:
    measurements: list[Measurement] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)


def _bench_runs(store: Store, out: StoreMeasurements) -> None:
    for run in list_runs(store, kind="bench-train"):
        s, c = run.summary, run.config
        tps, fpt = s.get("tokens_per_second"), s.get("flops_per_token")
        name = c.get("device_name") or s.get("device_name")
        if str(c.get("device", "")).startswith("cpu"):
            out.rejected.append(Rejected(f"bench run {run.label}", "measured on the CPU"))
        elif not (tps and fpt and name):
            out.rejected.append(Rejected(f"bench run {run.label}", "no tokens/s, FLOPs per token or device name"))
        else:
            out.measurements.append(Measurement(kind="train", model=_NO_SHAPES, gpu=name,
                                                precision=str(c.get("precision", "bf16")),
                                                achieved_flops=float(tps) * float(fpt), label=f"bench run {run.label}"))


def _by_time(store: Store, name: str, labels: dict[str, str]) -> dict[float, float]:
    return {t: v for sd in store.query(name, labels) for t, v in zip(sd.t, sd.value, strict=True) if v is not None}


def step_verdict(index: int, mfu: float, data_wait_ratio: float, checkpoint_seconds: float,
                 since_config_change: int) -> str | None:
    """None for a healthy step, else why it is left out."""
    if index < WARMUP_STEPS or since_config_change == 0:
        return "warm-up"
    if checkpoint_seconds > 0:
        return "checkpoint step"
    if data_wait_ratio > DATA_WAIT_RATIO_MAX:
        return f"input-bound (waited for data more than {DATA_WAIT_RATIO_MAX:.0%} of the step)"
    if mfu > 1.0:
        return f"MFU {MFU_IMPOSSIBLE}"
    if mfu <= 0:
        return "no MFU"
    return None


def _monitored_jobs(store: Store, out: StoreMeasurements) -> None:
    for series in store.query(N.TRAIN_MFU_RATIO):
        labels = dict(series.key.labels)
        job = labels.get(N.TRAIN_JOB_LABEL) or labels.get("job") or "?"
        who = f"monitored job {job}" + (f" rank {labels['rank']}" if labels.get("rank") not in (None, "0") else "")
        wait = _by_time(store, N.TRAIN_DATA_WAIT_RATIO, labels)
        ckpt = _by_time(store, N.TRAIN_CHECKPOINT_SECONDS, labels)
        batch = _by_time(store, N.TRAIN_BATCH_SIZE, labels)
        healthy: dict[float | None, list[float]] = {}
        left_out: Counter[str] = Counter()
        last_batch: float | None = None
        since_change = 0
        for i, (t, mfu) in enumerate(zip(series.t, series.value, strict=True)):
            b = batch.get(t, last_batch)
            since_change = since_change + 1 if b == last_batch or i == 0 else 0
            last_batch = b
            why = step_verdict(i, mfu or 0.0, wait.get(t, 0.0), ckpt.get(t, 0.0), since_change)
            if why:
                left_out[why] += 1
            else:
                healthy.setdefault(b, []).append(float(mfu))
        for why, n in left_out.items():
            out.rejected.append(Rejected(f"{who}: {n} step{'s' if n != 1 else ''}", why))
        for b, vals in healthy.items():
            what = f"{who}" + (f" at batch {b:g}" if b is not None else "")
            if len(vals) < MIN_HEALTHY_STEPS:
                out.rejected.append(Rejected(f"{what}: {len(vals)} healthy steps", f"fewer than {MIN_HEALTHY_STEPS}"))
                continue
            out.measurements.append(Measurement(kind="train", model=_NO_SHAPES, gpu=labels.get("gpu_model") or None,
                                                mfu_ratio=float(statistics.median(vals)),
                                                label=f"{what} ({len(vals)} healthy steps)"))


def measurements_from_store(store: Store) -> StoreMeasurements:
    """Benchmark runs and monitored jobs' healthy steps, with what was left out and why."""
    out = StoreMeasurements()
    _bench_runs(store, out)
    _monitored_jobs(store, out)
    return out


def read_store_measurements(path: Path) -> StoreMeasurements:
    """`measurements_from_store` of the store file at `path`, which must exist."""
    from gpulens.errors import StoreError

    if not path.exists():
        raise StoreError(f"There is no gpulens store at {path}.", hint="Pass the --store of a recorded session.")
    with Store(path) as store:
        return measurements_from_store(store)
