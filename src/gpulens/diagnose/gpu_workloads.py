"""Which workloads ran on which GPU at which moment, and what a GPU fault did to them.

The one join every analyzer uses for "who was on this GPU then" (`occupants`, `present`,
`gpu_of`). Who is who comes from the workloads' own records: a training rank's `train_start`
event names its pid and CUDA device, its `train_step` events carry the pid; an inference service's
`infer_start` and `request` events carry its pid. Where and when a pid ran comes from the GPU
process listing (`gpu_process_memory_bytes{host, gpu, pid}`), preferred to `train_start`'s device
because that one is a CUDA index (every rank says 0 under CUDA_VISIBLE_DEVICES); the index is used
only where no other rank of the host claims the same one. A workload with neither lands on its
host's GPU when the host has only one.

A workload is present on its GPU over its runs of records (first..last step or request, a run
broken by a long silence) and the runs of its pid in the process listing, each widened by at most
one interval of its own cadence: no fixed slack reaches a job that had ended or not yet started.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from gpulens.diagnose.colocation import event_pid, percentile
from gpulens.reader import AnalysisReader, EventRow, analysis_reader
from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.vocab.gpu import GPU_PROCESS_MEMORY, GPU_UP, GPU_UTILIZATION_RATIO

Role = Literal["training", "serving"]
Span = tuple[float, float]
LISTED = "its pid in the GPU process list"  # Occupant.identified_by of a workload the listing shows

# A run of a workload's records breaks where it was silent for this many of its own intervals
# (and at least the floor of its role: a server may idle between requests, a training loop not).
RUN_BREAK_CADENCES = 10.0
RUN_BREAK_MIN_SECONDS: dict[str, float] = {"training": 5.0, "serving": 60.0}
LISTING_BREAK_INTERVALS = 3.0  # a pid absent from this many process-list samples had left the GPU
UNBOUNDED_LISTING_POINTS = 2000  # per series, when the whole store is asked for (energy)
# A process that is none of the workloads on a GPU and holds this share of its memory is named:
# a quarter of the card is more than any helper process (a profiler, a metrics agent) needs.
OTHER_PROCESS_SHARE = 0.25
# Records are read this far beyond the reference windows, so a workload's cadence and its runs
# around a fault are known.
READ_MARGIN_SECONDS = 30.0
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
    """One training rank or one inference service on one GPU, and when it was there."""

    role: Role
    labels: dict[str, str]  # train_job + rank + host, or service + host
    pids: set[int] = field(default_factory=set)
    cuda_gpu: str | None = None  # from train_start (a CUDA index)
    first_t: float = float("inf")
    last_t: float = float("-inf")
    identified_by: str = ""
    records: list[tuple[float, float, int | None]] = field(default_factory=list, repr=False)  # (begin, end, pid)
    spans: list[Span] = field(default_factory=list)  # presence on the GPU it is placed on
    cadence_seconds: float = 0.0

    @property
    def name(self) -> str:
        if self.role == "training":
            return f"job {self.labels.get(N.TRAIN_JOB_LABEL, '?')} rank {self.labels.get('rank', '0')}"
        return f"service {self.labels.get('service', '?')}"

    def seen(self, t: float, begin: float | None = None, pid: int | None = None) -> None:
        b = t if begin is None else min(begin, t)
        self.first_t, self.last_t = min(self.first_t, b), max(self.last_t, t)
        self.records.append((b, t, pid))

    def overlaps(self, start: float, end: float) -> bool:
        """Present on its GPU at some moment of [start, end]."""
        return any(a <= end and b >= start for a, b in self.spans)

    def presence_seconds(self, start: float, end: float) -> float:
        return sum(max(0.0, min(b, end) - max(a, start)) for a, b in self.spans)


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


def _begin(kind: str, e: EventRow) -> float:
    d = e.data
    keys = ("t_start",) if kind == N.EV_TRAIN_STEP else ("arrival", "intended", "start") if kind == N.EV_REQUEST else ()
    for k in keys:
        v = d.get(k)
        if isinstance(v, int | float) and not isinstance(v, bool) and v <= e.t:
            return float(v)
    return e.t


def _occupants_by_identity(reader: AnalysisReader, start: float | None, end: float | None, roles: tuple[Role, ...]) -> list[Occupant]:
    found: dict[tuple, Occupant] = {}
    # Start events are few and may precede the window; steps and requests (many) make the time span.
    for kind, role in ((N.EV_TRAIN_START, "training"), (N.EV_TRAIN_STEP, "training"), (N.EV_INFER_START, "serving"), (N.EV_REQUEST, "serving")):
        if role not in roles:
            continue
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
            occ.seen(e.t, _begin(kind, e), pid)
    return list(found.values())


def cadence(ends: list[float], durations: list[float]) -> float:
    """A workload's own interval: the median gap between its records' ends, else the median
    length of one record."""
    gaps = [b - a for a, b in zip(ends, ends[1:], strict=False) if b > a]
    if gaps:
        return statistics.median(gaps)
    return statistics.median(durations) if durations else 0.0


def runs(intervals: Iterable[Span], break_seconds: float, widen: float) -> list[Span]:
    """Merge (begin, end) intervals into runs, a run broken by a gap over `break_seconds`; each
    run widened by `widen` on both sides."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a - out[-1][1] <= break_seconds:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a - widen, b + widen) for a, b in out]


def record_runs(occ: Occupant, pids: set[int] | None = None) -> list[Span]:
    """When the workload's own records (those of `pids`, or with no pid) say it ran."""
    recs = [(a, b) for a, b, p in occ.records if pids is None or p is None or p in pids]
    ends = sorted(b for a, b in recs if b > a)
    cad = cadence(ends, [b - a for a, b in recs if b > a])
    occ.cadence_seconds = cad
    return runs(recs, max(RUN_BREAK_MIN_SECONDS[occ.role], RUN_BREAK_CADENCES * cad), cad)


def _listings(reader: AnalysisReader, start: float | None, end: float | None) -> dict[tuple[str, int], dict[str, list[Span]]]:
    """(host, pid) -> GPU -> runs of the pid in that GPU's process listing, each widened by one
    sampling interval (a process first listed at t arrived after the sample before)."""
    points = UNBOUNDED_LISTING_POINTS if start is None or end is None else None
    out: dict[tuple[str, int], dict[str, list[Span]]] = defaultdict(lambda: defaultdict(list))
    for k in reader.series_labels(GPU_PROCESS_MEMORY):  # a pid listed outside the window still places it
        try:
            out[(k.get("host", ""), int(k.get("pid", "")))][k.get("gpu", "")]
        except ValueError:
            continue
    for d in reader.series_windows(GPU_PROCESS_MEMORY, start=start, end=end, max_points=points):
        try:
            key = (d.labels.get("host", ""), int(d.labels.get("pid", "")))
        except ValueError:
            continue
        if not d.t:
            continue
        dt = statistics.median([b - a for a, b in zip(d.t, d.t[1:], strict=False)]) if len(d.t) > 1 else 1.0
        out[key][d.labels.get("gpu", "")].extend(runs(((t, t) for t in d.t), LISTING_BREAK_INTERVALS * dt, dt))
    return out


def _merge(spans: list[Span]) -> list[Span]:
    return runs(spans, 0.0, 0.0)


def occupants(source: AnalysisReader | Store, start: float | None = None, end: float | None = None,
              roles: tuple[Role, ...] = ("training", "serving")) -> dict[GpuRef, list[Occupant]]:
    """Every training rank and service (of `roles`) with records in [start, end] (or started
    before `end`), by the GPU it ran on, each with its presence there; those gpulens cannot place
    are left out."""
    reader = analysis_reader(source)
    gpus_of_host: dict[str, set[str]] = defaultdict(set)
    for name in (GPU_UP, GPU_UTILIZATION_RATIO):  # the GPUs each host reports
        for k in reader.series_labels(name):
            gpus_of_host[k.get("host", "")].add(k.get("gpu", ""))
    listed = _listings(reader, start, end)
    out: dict[GpuRef, list[Occupant]] = defaultdict(list)
    unlisted: list[Occupant] = []
    for occ in _occupants_by_identity(reader, start, end, roles):
        host = occ.labels.get("host", "")
        by_gpu: dict[str, set[int]] = defaultdict(set)
        for pid in occ.pids:
            for g in listed.get((host, pid), {}):
                by_gpu[g].add(pid)
        if not by_gpu:
            unlisted.append(occ)
            continue
        for g, pids in sorted(by_gpu.items()):
            here = replace(occ, pids=set(pids), identified_by=LISTED)
            mine = record_runs(here, pids)
            hull = (min(a for a, _ in mine), max(b for _, b in mine)) if mine else None
            # A listing run counts where it meets the workload's own records (a pid reused later by
            # another process does not); it covers a hang, when the records stop and the process stays.
            listing = [s for p in pids for s in listed[(host, p)][g] if hull and s[0] <= hull[1] and s[1] >= hull[0]]
            here.spans = _merge(mine + listing)
            out[GpuRef(host, g)].append(here)
    claims: dict[tuple[str, str], set[tuple]] = defaultdict(set)
    for occ in unlisted:
        if occ.cuda_gpu is not None:
            claims[(occ.labels.get("host", ""), occ.cuda_gpu)].add(tuple(sorted(occ.labels.items())))
    for occ in unlisted:
        host = occ.labels.get("host", "")
        gpus = gpus_of_host.get(host, set())
        if len(gpus) == 1:
            g, occ.identified_by = next(iter(gpus)), "the only GPU of its host"
        elif occ.cuda_gpu is not None and len(claims[(host, occ.cuda_gpu)]) == 1 and (not gpus or occ.cuda_gpu in gpus):
            g, occ.identified_by = occ.cuda_gpu, f"its {N.EV_TRAIN_START} event"
        else:
            continue  # e.g. every rank saying cuda:0 under CUDA_VISIBLE_DEVICES, and no process list
        occ.spans = record_runs(occ)
        out[GpuRef(host, g)].append(occ)
    return dict(out)


def occupants_around(reader: AnalysisReader, start: float, end: float) -> dict[GpuRef, list[Occupant]]:
    """`occupants` with the records that can matter for faults in [start, end]: a week-long store
    holds millions of requests, and only those near a fault are read."""
    margin = READ_MARGIN_SECONDS + REFERENCE_SECONDS
    return occupants(reader, start - margin, end + margin)


def present(placed: dict[GpuRef, list[Occupant]], ref: GpuRef, start: float, end: float) -> list[Occupant]:
    """The workloads on `ref` at some moment of [start, end]."""
    return [o for o in placed.get(ref, []) if o.overlaps(start, end)]


def gpu_of(placed: dict[GpuRef, list[Occupant]], labels: dict[str, str], start: float, end: float) -> GpuRef | None:
    """The GPU a workload (its labels: job + rank + host, or service + host) spent most of
    [start, end] on, or None when the join cannot place it."""
    best: tuple[float, GpuRef] | None = None
    for ref, occs in placed.items():
        for o in occs:
            if all(o.labels.get(k) == v for k, v in labels.items()):
                secs = o.presence_seconds(start, end)
                if best is None or secs > best[0]:
                    best = (secs, ref)
    return None if best is None else best[1]


@dataclass(frozen=True)
class MemoryHolder:
    """One process in a GPU's listing over a window, with the most memory it held there."""

    pid: int
    process: str
    max_bytes: float


def memory_holders(reader: AnalysisReader, ref: GpuRef, start: float, end: float) -> list[MemoryHolder]:
    """The processes the GPU listed in [start, end], the largest first."""
    best: dict[tuple[int, str], float] = {}
    for d in reader.series_windows(GPU_PROCESS_MEMORY, {"host": ref.host, "gpu": ref.gpu}, start=start, end=end):
        try:
            key = (int(d.labels.get("pid", "")), d.labels.get("process", ""))
        except ValueError:
            continue
        if d.value_max:
            best[key] = max(best.get(key, 0.0), max(d.value_max))
    return sorted((MemoryHolder(p, n, b) for (p, n), b in best.items()), key=lambda h: (-h.max_bytes, h.pid))


ProcessSeries = dict[tuple[int, str], tuple[list[float], list[float]]]  # (pid, process) -> (t, bytes)


def process_memory(reader: AnalysisReader, host: str, gpu: str, start: float | None, end: float | None) -> ProcessSeries:
    """The memory each listed process held on one GPU over the window."""
    out: ProcessSeries = {}
    for d in reader.series_windows(GPU_PROCESS_MEMORY, {"host": host, "gpu": gpu}, start=start, end=end):
        try:
            out[(int(d.labels.get("pid", "")), d.labels.get("process", ""))] = (d.t, d.value)
        except ValueError:
            continue
    return out


def largest_other_holder(series: ProcessSeries, own_pids: set[int | None], start: float, end: float, min_bytes: float) -> MemoryHolder | None:
    """The process, none of `own_pids`, that held the most (at least `min_bytes`) in [start, end];
    None when the workload's own pids are unknown (the listing cannot tell it apart then)."""
    mine = {p for p in own_pids if p is not None}
    if not mine:
        return None
    best: MemoryHolder | None = None
    for (pid, name), (ts, vs) in series.items():
        held = max((v for t, v in zip(ts, vs, strict=True) if start <= t <= end), default=0.0)
        if pid not in mine and held >= min_bytes and (best is None or held > best.max_bytes):
            best = MemoryHolder(pid, name, held)
    return best


def own_memory_peak(reader: AnalysisReader, occ: Occupant, start: float, end: float) -> float | None:
    """The workload's own allocator peak (or reserved memory) in [start, end], as its monitor
    reports it; None when it reports none."""
    names = (N.TRAIN_MEMORY_PEAK_BYTES, N.TRAIN_MEMORY_RESERVED_BYTES) if occ.role == "training" else (N.INFER_MEMORY_RESERVED_BYTES, N.INFER_MEMORY_ALLOCATED_BYTES)
    vals = [v for name in names for d in reader.series_windows(name, occ.labels, start=start, end=end) for v in d.value_max]
    return max(vals) if vals else None


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
    for occ in present(placed, ref, start, end):
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
