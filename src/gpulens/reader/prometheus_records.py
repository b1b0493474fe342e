"""Training records over a fleet's Prometheus: what the training analyzers read from a store's
`train_step` and `train_start` events, rebuilt from what the agents export.

- A **step record per rank per scrape interval**: between two scrapes of a rank's
  `train_step_seconds`, the increase of `_count` is the steps it finished and the increase of `_sum`
  their total time; each part (`train_data_wait_seconds`, `_compute_`, `_comm_wait_`, `_checkpoint_`)
  the same way. The record says: `steps` = n, `step_s` = mean step time, `data_wait_s`... = the mean
  of each part per step (a checkpoint's time spread over the interval's steps), `t_start` / `t_end` =
  the two scrape times. Exact as means (counts and sums are exact); the single steps inside an
  interval, and each step's own time, are not there.
- A **start record per rank** from `train_rank_info{train_job, rank, host, pid, cuda_device}`: its pid
  and CUDA device, which the one join (gpulens.diagnose.gpu_workloads) turns into the rank's GPU as it
  does with a store's `train_start`; the step records carry that pid too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from gpulens.reader.answers import EventRow
from gpulens.vocab import names as N

# (labels, sample times, values) of each series of a metric in [lo, hi], the reader's raw read.
RawRead = Callable[[str, Mapping[str, str] | None, float, float], list[tuple[dict[str, str], list[float], list[float]]]]
Key = tuple[tuple[str, str], ...]

PARTS = {
    N.TRAIN_DATA_WAIT_SECONDS: "data_wait_s",
    N.TRAIN_COMPUTE_SECONDS: "compute_s",
    N.TRAIN_COMM_WAIT_SECONDS: "comm_wait_s",
    N.TRAIN_CHECKPOINT_SECONDS: "checkpoint_s",
}
RANK_KEYS = (N.TRAIN_JOB_LABEL, "rank", "host")


def _key(labels: Mapping[str, str]) -> Key:
    return tuple(sorted(labels.items()))


def interval_increases(t: Sequence[float], v: Sequence[float], *, born_inside: bool) -> list[tuple[float, float, float]]:
    """(previous scrape, scrape, increase) wherever a counter rose; a drop is a restart (the new value
    is the increase); a series born inside the read counts its first value from zero, over one
    interval before it (the next gap, or 1 s)."""
    out = []
    if born_inside and t and v[0] > 0:
        gap = t[1] - t[0] if len(t) > 1 else 1.0
        out.append((t[0] - gap, t[0], v[0]))
    for i in range(1, len(t)):
        d = v[i] - v[i - 1]
        if d < 0:
            d = v[i]
        if d > 0:
            out.append((t[i - 1], t[i], d))
    return out


def _increases(raw: RawRead, metric: str, match: Mapping[str, str] | None, lo: float, hi: float, lookback: float) -> dict[Key, dict[float, tuple[float, float]]]:
    """series -> scrape time -> (previous scrape time, increase), for increases at or after `lo`."""
    out: dict[Key, dict[float, tuple[float, float]]] = {}
    for labels, t, v in raw(metric, match, lo - lookback, hi):
        incs = interval_increases(t, v, born_inside=t[0] >= lo)
        out[_key(labels)] = {b: (a, d) for a, b, d in incs if b >= lo}
    return out


def rank_processes(raw: RawRead, match: Mapping[str, str] | None, lo: float, hi: float, lookback: float) -> list[EventRow]:
    """One `train_start` per rank and pid seen in `train_rank_info` in [lo - lookback, hi], at its first sample."""
    out = []
    for labels, t, _v in raw(N.RANK_INFO, match, lo - lookback, hi):
        pid, dev = labels.pop(N.PID_LABEL, ""), labels.pop(N.CUDA_DEVICE_LABEL, "")
        data: dict[str, object] = {"pid": int(pid) if pid.isdigit() else None, "gpu": int(dev) if dev.isdigit() else None}
        rank = labels.get("rank", "")
        if rank.isdigit():
            data["rank"] = int(rank)
        out.append(EventRow(t[0], N.EV_TRAIN_START, labels, data))
    return sorted(out, key=lambda e: e.t)


def step_records(raw: RawRead, match: Mapping[str, str] | None, lo: float, hi: float, lookback: float) -> list[EventRow]:
    """One `train_step` record per rank per scrape interval in which the rank finished steps."""
    counts = _increases(raw, N.TRAIN_STEP_SECONDS + "_count", match, lo, hi, lookback)
    if not counts:
        return []
    sums = _increases(raw, N.TRAIN_STEP_SECONDS + "_sum", match, lo, hi, lookback)
    parts = {field: _increases(raw, name + "_sum", match, lo, hi, lookback) for name, field in PARTS.items()}
    pids = {tuple(e.labels.get(k, "") for k in RANK_KEYS): e.data.get("pid") for e in rank_processes(raw, match, lo, hi, lookback)}
    out = []
    for key, by_t in counts.items():
        labels = dict(key)
        pid = pids.get(tuple(labels.get(k, "") for k in RANK_KEYS))
        rank = labels.get("rank", "0")
        for t_end, (t_start, n) in by_t.items():
            total = sums.get(key, {}).get(t_end)
            if total is None or n <= 0:
                continue
            data: dict[str, object] = {"t_start": t_start, "t_end": t_end, "steps": int(round(n)), "step_s": total[1] / n}
            for field, incs in parts.items():
                got = incs.get(key)
                if got is not None:  # a part the rank measures: 0 in an interval where it did not rise
                    data[field] = got[t_end][1] / n if t_end in got else 0.0
            if rank.isdigit():
                data["rank"] = int(rank)
            if pid is not None:
                data["pid"] = pid
            out.append(EventRow(t_end, N.EV_TRAIN_STEP, dict(labels), data))
    return sorted(out, key=lambda e: e.t)
