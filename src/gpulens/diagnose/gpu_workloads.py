"""Which workloads ran on which GPU, and what a GPU fault did to them.

Who is who comes from the workloads' own records: a training rank's `train_start` event names its
pid and GPU, its `train_step` events carry the pid; an inference service's `infer_start` and
`request` events carry its pid. Where a pid runs comes from the GPU process listing
(`gpu_process_memory_bytes{host, gpu, pid}`), which is preferred to `train_start`'s GPU because
that one is a CUDA index (it differs from NVML's under CUDA_VISIBLE_DEVICES). A workload without
either lands on its host's GPU when the host has only one.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal

from gpulens.diagnose.colocation import event_pid, percentile
from gpulens.reader import AnalysisReader, EventRow, analysis_reader
from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.vocab.gpu import GPU_PROCESS_MEMORY, GPU_UP

Role = Literal["training", "serving"]

# A workload counts as "on the GPU at that time" if its records reach within this of the fault:
# a job killed by the fault stops one step before it; a service may idle between requests.
JOIN_SLACK_SECONDS = 30.0
# Before/after windows that a fault's effect on a workload is measured over.
REFERENCE_SECONDS = 120.0
MIN_STEPS = 3  # per window, for a median step time worth comparing
MIN_REQUESTS = 5  # per window, for a p99 worth comparing
NOTABLE_CHANGE_RATIO = 0.10  # a step time or p99 change smaller than this is reported as unchanged


@dataclass(frozen=True)
class GpuRef:
    host: str
    gpu: str

    def __str__(self) -> str:
        return f"GPU {self.gpu}" + (f" on {self.host}" if self.host else "")


@dataclass
class Occupant:
    """One training rank or one inference service, and the GPU it ran on."""

    role: Role
    labels: dict[str, str]  # train_job + rank + host, or service + host
    pids: set[int] = field(default_factory=set)
    cuda_gpu: str | None = None  # from train_start (a CUDA index)
    first_t: float = float("inf")
    last_t: float = float("-inf")
    identified_by: str = ""

    @property
    def name(self) -> str:
        if self.role == "training":
            return f"job {self.labels.get(N.TRAIN_JOB_LABEL, '?')} rank {self.labels.get('rank', '0')}"
        return f"service {self.labels.get('service', '?')}"

    def seen(self, t: float) -> None:
        self.first_t, self.last_t = min(self.first_t, t), max(self.last_t, t)

    def overlaps(self, start: float, end: float) -> bool:
        return self.first_t - JOIN_SLACK_SECONDS <= end and self.last_t + JOIN_SLACK_SECONDS >= start


@dataclass
class WorkloadImpact:
    """What one workload on the GPU did around a fault. Counts are in the windows named."""

    workload: str  # "job llama-ft rank 1" / "service chat"
    role: Role
    identified_by: str
    steps_before: int | None = None
    steps_after_start: int | None = None  # steps that ended after the fault began
    last_step_end_t: float | None = None
    step_seconds_before: float | None = None  # median
    step_seconds_during: float | None = None
    step_time_change_ratio: float | None = None
    requests_before: int | None = None
    requests_after_start: int | None = None
    failed_requests_after_start: int | None = None
    p99_latency_before_seconds: float | None = None
    p99_latency_during_seconds: float | None = None
    p99_latency_change_ratio: float | None = None
    sentence: str = ""


def _occupants_by_identity(reader: AnalysisReader, start: float | None, end: float | None) -> list[Occupant]:
    found: dict[tuple, Occupant] = {}
    # Start events are few and may precede the window; steps and requests (many) make the time span.
    for kind, role in ((N.EV_TRAIN_START, "training"), (N.EV_TRAIN_STEP, "training"), (N.EV_INFER_START, "serving"), (N.EV_REQUEST, "serving")):
        since = None if kind in (N.EV_TRAIN_START, N.EV_INFER_START) else start
        for e in reader.event_rows(kind, start=since, end=end):
            if role == "training":
                labels = {N.TRAIN_JOB_LABEL: e.labels.get(N.TRAIN_JOB_LABEL, ""), "rank": e.labels.get("rank", str(e.data.get("rank", 0))), "host": e.labels.get("host", "")}
            else:
                labels = {"service": e.labels.get("service", ""), "host": e.labels.get("host", "")}
            key = (role, *sorted(labels.items()))
            occ = found.get(key)
            if occ is None:
                occ = found[key] = Occupant(role, labels)  # type: ignore[arg-type]
            pid = event_pid(e)
            if pid is not None:
                occ.pids.add(pid)
            if kind == N.EV_TRAIN_START and e.data.get("gpu") is not None:
                occ.cuda_gpu = str(e.data["gpu"])
            occ.seen(e.t)
    return list(found.values())


def occupants(source: AnalysisReader | Store, start: float | None = None, end: float | None = None) -> dict[GpuRef, list[Occupant]]:
    """Every training rank and service with records in [start, end] (or started before `end`), by
    the GPU it ran on; those gpulens cannot place are left out."""
    reader = analysis_reader(source)
    gpus_of_host: dict[str, set[str]] = defaultdict(set)
    for k in reader.series_labels(GPU_UP):
        gpus_of_host[k.get("host", "")].add(k.get("gpu", ""))
    pid_gpu: dict[tuple[str, int], set[str]] = defaultdict(set)
    for k in reader.series_labels(GPU_PROCESS_MEMORY):
        try:
            pid_gpu[(k.get("host", ""), int(k.get("pid", "")))].add(k.get("gpu", ""))
        except ValueError:
            continue
    out: dict[GpuRef, list[Occupant]] = defaultdict(list)
    for occ in _occupants_by_identity(reader, start, end):
        host = occ.labels.get("host", "")
        listed = sorted({g for pid in occ.pids for g in pid_gpu.get((host, pid), ())})
        if listed:
            gpus, occ.identified_by = listed, "its pid in the GPU process list"
        elif occ.cuda_gpu is not None:
            gpus, occ.identified_by = [occ.cuda_gpu], f"its {N.EV_TRAIN_START} event"
        elif len(gpus_of_host.get(host, ())) == 1:
            gpus, occ.identified_by = sorted(gpus_of_host[host]), "the only GPU of its host"
        else:
            continue
        for g in gpus:
            out[GpuRef(host, g)].append(occ)
    return dict(out)


def occupants_around(reader: AnalysisReader, start: float, end: float) -> dict[GpuRef, list[Occupant]]:
    """`occupants` with the records that can matter for faults in [start, end]: a week-long store
    holds millions of requests, and only those near a fault are read."""
    margin = JOIN_SLACK_SECONDS + REFERENCE_SECONDS
    return occupants(reader, start - margin, end + margin)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _change(before: float | None, during: float | None) -> float | None:
    return None if before is None or during is None or before <= 0 else during / before - 1.0


def _latency(e: EventRow) -> float | None:
    d = e.data
    end = d.get("end", e.t)
    begin = d.get("intended", d.get("arrival", d.get("start")))
    if not isinstance(end, int | float) or not isinstance(begin, int | float):
        return None
    return float(end) - float(begin)


def training_impact(reader: AnalysisReader, occ: Occupant, start: float, end: float, what: str, point: bool) -> WorkloadImpact:
    steps = reader.event_rows(N.EV_TRAIN_STEP, start=start - REFERENCE_SECONDS, end=end + REFERENCE_SECONDS, match=occ.labels)
    before = [e for e in steps if e.t < start]
    after = [e for e in steps if e.t >= start and (point or e.t <= end)]
    dur = [float(e.data["step_s"]) for e in before if isinstance(e.data.get("step_s"), int | float)]
    dur_during = [float(e.data["step_s"]) for e in after if isinstance(e.data.get("step_s"), int | float)]
    imp = WorkloadImpact(occ.name, "training", occ.identified_by, steps_before=len(before), steps_after_start=len(after))
    imp.last_step_end_t = steps[-1].t if steps else None
    if len(dur) >= MIN_STEPS and len(dur_during) >= MIN_STEPS:
        imp.step_seconds_before, imp.step_seconds_during = _median(dur), _median(dur_during)
        imp.step_time_change_ratio = _change(imp.step_seconds_before, imp.step_seconds_during)
    if point or not after:
        if before and not after:
            gap = start - before[-1].t
            imp.sentence = (f"{occ.name} made no step after it (its last step ended {gap:.1f} s before)" if point
                            else f"{occ.name} made no step while {what} (its last step ended {gap:.1f} s before)")
        elif after:
            imp.sentence = f"{occ.name} kept running ({len(after)} steps after it)"
        else:
            imp.sentence = f"{occ.name} ran on it"
    elif imp.step_time_change_ratio is not None and abs(imp.step_time_change_ratio) >= NOTABLE_CHANGE_RATIO:
        verb = "rose" if imp.step_time_change_ratio > 0 else "fell"
        imp.sentence = (f"step time of {occ.name} {verb} {abs(imp.step_time_change_ratio):.0%} "
                        f"({imp.step_seconds_before:.3g} s → {imp.step_seconds_during:.3g} s) while {what}")
    elif imp.step_time_change_ratio is not None:
        imp.sentence = f"{occ.name} ran on it with its step time unchanged ({imp.step_time_change_ratio:+.0%}) while {what}"
    else:
        imp.sentence = f"{occ.name} ran {len(after)} steps while {what}"
    return imp


def serving_impact(reader: AnalysisReader, occ: Occupant, start: float, end: float, what: str, point: bool) -> WorkloadImpact:
    hi = end + REFERENCE_SECONDS if point else end
    reqs = reader.event_rows(N.EV_REQUEST, start=start - REFERENCE_SECONDS, end=hi, match=occ.labels)
    if occ.pids:  # a service name may be shared by replicas on other GPUs of the host
        reqs = [e for e in reqs if event_pid(e) is None or event_pid(e) in occ.pids]
    before = [e for e in reqs if e.t < start]
    after = [e for e in reqs if e.t >= start]
    failed = [e for e in after if e.data.get("status", "ok") != "ok"]
    # Like with like: latency over the requests that succeeded (a fast failure is not a fast answer);
    # failures are counted apart.
    ok = [e for e in reqs if e.data.get("status", "ok") == "ok"]
    lat_before = [x for x in map(_latency, (e for e in ok if e.t < start)) if x is not None]
    lat_after = [x for x in map(_latency, (e for e in ok if e.t >= start)) if x is not None]
    imp = WorkloadImpact(occ.name, "serving", occ.identified_by, requests_before=len(before), requests_after_start=len(after),
                         failed_requests_after_start=len(failed))
    if len(lat_before) >= MIN_REQUESTS and len(lat_after) >= MIN_REQUESTS:
        imp.p99_latency_before_seconds, imp.p99_latency_during_seconds = percentile(lat_before, 99), percentile(lat_after, 99)
        imp.p99_latency_change_ratio = _change(imp.p99_latency_before_seconds, imp.p99_latency_during_seconds)
    ch = imp.p99_latency_change_ratio
    if point:
        if before and not after:
            imp.sentence = f"{occ.name} served no request after it"
        else:
            imp.sentence = f"{occ.name} served {len(after)} requests after it, {len(failed)} failed"
            if ch is not None and abs(ch) >= NOTABLE_CHANGE_RATIO:
                imp.sentence += f", p99 {ch:+.0%}"
    elif ch is not None and abs(ch) >= NOTABLE_CHANGE_RATIO:
        verb = "rose" if ch > 0 else "fell"
        imp.sentence = (f"p99 of {occ.name} {verb} {abs(ch):.0%} ({imp.p99_latency_before_seconds:.3g} s → "
                        f"{imp.p99_latency_during_seconds:.3g} s) while {what}")
        if failed:
            imp.sentence += f"; {len(failed)} requests failed"
    elif ch is not None:
        imp.sentence = f"{occ.name} served {len(after)} requests with its p99 unchanged ({ch:+.0%}) while {what}"
    else:
        imp.sentence = f"{occ.name} served {len(after)} requests while {what}" + (f", {len(failed)} failed" if failed else "")
    return imp


def impacts(reader: AnalysisReader, placed: dict[GpuRef, list[Occupant]], ref: GpuRef, start: float, end: float, what: str, *, point: bool) -> list[WorkloadImpact]:
    """What each workload on `ref` around [start, end] did. `point`: the fault is an event (an XID,
    an ECC error) whose effect shows after it, not a condition that lasts over [start, end]."""
    out = []
    for occ in placed.get(ref, []):
        if not occ.overlaps(start, end):
            continue
        fn = training_impact if occ.role == "training" else serving_impact
        out.append(fn(reader, occ, start, end, what, point))
    return out


def workload_labels(imps: list[WorkloadImpact], placed: list[Occupant]) -> dict[str, Any]:
    """The labels of the first training rank and the first service among the impacted workloads."""
    names = {i.workload for i in imps}
    labels: dict[str, str] = {}
    for occ in placed:
        if occ.name in names:
            for k, v in occ.labels.items():
                if k != "host":
                    labels.setdefault(k, v)
    return labels
