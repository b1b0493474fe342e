"""Silence is a signal: a GPU, a rank or a service that stops reporting while the others go on.

A GPU that falls off the bus (XID 79) does not send `gpu_up == 0`: it sends nothing. A hung rank
sends no step while its process stays on its GPU. Neither leaves a bad sample behind, so each
analyzer that reads samples sees only a shorter series. Here the absence itself is the finding,
joined to the last thing seen on the silent place (the XID just before, the last step, the last
request), with the labels (host, gpu, job, rank, service) an incident groups it by.

What counts as silent, and why each rule is conservative:
- a GPU: no sample for longer than its threshold (below) while the node's other GPUs go on
  sampling. When every GPU of the node stops at once it is the sampler that stopped (a recording
  that ends, an agent that exits), even if workload records go on: then a GPU counts as silent
  only when an XID on it came just before and the recording went on. A GPU whose last sample said
  lost (`gpu_up == 0`) is already reported as `gpu_lost`.
- a rank: no step (or eval) for longer than its threshold while the job's other ranks step on, or
  while its process is still in its GPU's process list. A job that ends on all ranks stops them
  together and its processes leave the list: not silent.
- a service: no request for longer than its threshold after steady traffic (at least
  MIN_STEADY_REQUESTS in the window before), while another service's requests go on. Traffic that
  ends for every service is a load that ended, and a lone service whose clients stop cannot be told
  from one that died: neither is reported.

Each threshold is relative to the rhythm observed before the silence: more than
SILENCE_INTERVALS median intervals (samples, steps, arrivals), more than LONGEST_GAP_FACTOR times
the longest gap seen before (a rank that once paused 40 s for a checkpoint may do so again), and
never under MIN_SILENCE_SECONDS.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from gpulens.diagnose import evidence as Q
from gpulens.diagnose.base import DEFAULT_ORDER, DiagnoseScope, Finding, register_analyzer
from gpulens.diagnose.gpu_workloads import GpuRef, Occupant, occupants
from gpulens.diagnose.health import (
    ADVICE_HARDWARE,
    FAULT_ORDER,
    XID_EVENT,
    HealthEvent,
    time_of_day,
    to_findings,
)
from gpulens.reader import AnalysisReader, EventRow
from gpulens.vocab import names as N
from gpulens.vocab.gpu import GPU_PROCESS_MEMORY, GPU_UP
from gpulens.vocab.xid import xid_info

# Ten intervals in a row: a sampler under load misses one or two (a slow NVML call, a GC pause), a
# rank's step or a request's arrival varies by a few; ten missed in a row is no longer jitter.
SILENCE_INTERVALS = 10
# A gap twice the longest one seen before: what the place has done before, it may do again.
LONGEST_GAP_FACTOR = 2.0
# Never silent in less than this: an agent restart, a config reload or a checkpoint save pauses a
# place for seconds, and a finding must not flicker on such pauses at a fast sampling interval.
MIN_SILENCE_SECONDS = 30.0
# The rhythm (median and longest interval) is read over this long before the silence began.
RHYTHM_SECONDS = 120.0
MIN_INTERVALS = 3  # fewer intervals than this give no rhythm to compare a silence with
# A service had steady traffic when at least this many requests arrived in the rhythm window: at
# fewer, a pause as long as the threshold is ordinary for it.
MIN_STEADY_REQUESTS = 20
# An XID this long before the last sample (or during the silence's threshold after it) is the last
# thing seen on the GPU: XID 79 is logged as the GPU falls off, within a sampling interval of its
# last answer; a minute covers a driver's retries before it gives up on the GPU.
XID_BEFORE_SILENCE_SECONDS = 60.0
SILENCE_ORDER = FAULT_ORDER  # a silent GPU is a fault: listed with them, before what it explains

ADVICE_GPU_SILENT = [
    "Check whether the GPU still answers (nvidia-smi -L); one missing from the list fell off the bus: look for XID 79 in the kernel log (dmesg).",
    *ADVICE_HARDWARE,
]
ADVICE_RANK_SILENT = [
    "Look at the rank's own log and stack (py-spy dump --pid PID): a rank that makes no step while its process lives is hung, most often in a collective or in data loading.",
    "If its GPU also went silent or reported an XID, deal with the GPU first (see that finding) and restart the job from its last checkpoint on other GPUs.",
    "Set a collective timeout (e.g. NCCL_TIMEOUT / torch.distributed timeout) so that a hung rank fails the job instead of holding its GPUs.",
]
ADVICE_SERVICE_SILENT = [
    "Check that the service still runs and answers its health check; its last requests (in the evidence) show how it stopped.",
    "If its GPU also went silent or reported an XID, move the service to another GPU and deal with that GPU first.",
]


@dataclass(frozen=True)
class Rhythm:
    """The intervals a place reported at before it went silent, and the silence they allow."""

    median_seconds: float
    longest_seconds: float

    @property
    def threshold_seconds(self) -> float:
        return max(SILENCE_INTERVALS * self.median_seconds, LONGEST_GAP_FACTOR * self.longest_seconds, MIN_SILENCE_SECONDS)


def rhythm(times: list[float]) -> Rhythm | None:
    """The rhythm of the times (oldest first) in the RHYTHM_SECONDS before the last; None when too few."""
    if not times:
        return None
    recent = [t for t in times if t >= times[-1] - RHYTHM_SECONDS]
    gaps = [b - a for a, b in zip(recent, recent[1:], strict=False) if b > a]
    if len(gaps) < MIN_INTERVALS:
        return None
    return Rhythm(statistics.median(gaps), max(gaps))


def _bounded(t: float, end: float | None) -> float:
    return t if end is None else min(t, end)


# ------------------------------------------------------------------ GPUs
@dataclass
class GpuSilence:
    ref: GpuRef
    uuid: str
    last_t: float  # the last sample
    until_t: float  # what went on went on until then
    went_on: str  # what went on, for the sentence
    rhythm: Rhythm
    last_xid: EventRow | None
    pids_listed: list[int]


def _last_sample(reader: AnalysisReader, labels: dict[str, str], newest_t: float, end: float | None) -> tuple[float, float] | None:
    """(time, value) of the series' last sample at or before `end`."""
    if end is None or newest_t <= end:
        got = reader.series_windows(GPU_UP, labels, start=newest_t, end=newest_t)
    else:
        got = reader.series_windows(GPU_UP, labels, start=end - RHYTHM_SECONDS, end=end)
    got = [d for d in got if d.labels == labels and d.t]
    return (got[0].t[-1], got[0].value[-1]) if got else None


def gpu_silences(reader: AnalysisReader, scope: DiagnoseScope) -> list[GpuSilence]:
    """Every GPU whose `gpu_up` samples stopped while its node (or the recording) went on."""
    last: dict[GpuRef, tuple[dict[str, str], float, float]] = {}
    for lv in reader.latest_values(GPU_UP):
        got = _last_sample(reader, lv.labels, lv.t, scope.end)
        if got is not None:
            last[GpuRef(lv.labels.get("host", ""), lv.labels.get("gpu", ""))] = (lv.labels, *got)
    hosts = {ref.host for ref in last}
    everything = reader.time_range()
    out = []
    for ref, (labels, last_t, up) in last.items():
        if up < 0.5 or (scope.start is not None and last_t < scope.start - RHYTHM_SECONDS):
            continue  # lost: gpu_lost says so; or silent since long before the window
        others = [(t, o) for o, (_, t, _) in last.items() if o.host == ref.host and o != ref]
        until, went_on = max(others, key=lambda x: x[0]) if others else (float("-inf"), None)
        times = reader.series_windows(GPU_UP, labels, start=last_t - RHYTHM_SECONDS, end=last_t)
        r = rhythm([t for d in times if d.labels == labels for t in d.t])
        if r is None:
            continue
        xids = reader.event_rows(XID_EVENT, start=last_t - XID_BEFORE_SILENCE_SECONDS, end=last_t + r.threshold_seconds,
                                 match={"host": ref.host, "gpu": ref.gpu})
        went_on_text = f"{went_on} went on sampling" if went_on else ""
        if until - last_t <= r.threshold_seconds:
            # No other GPU of the node went on: the sampler itself may have stopped. Only an XID on
            # this GPU just before says the GPU, not the sampler, went away.
            rec_end = _bounded(everything[1], scope.end) if everything is not None and len(hosts) == 1 else float("-inf")
            if not xids or rec_end - last_t <= r.threshold_seconds:
                continue
            until, went_on_text = rec_end, "the recording went on"
        procs = reader.series_windows(GPU_PROCESS_MEMORY, {"host": ref.host, "gpu": ref.gpu}, start=last_t - r.median_seconds, end=last_t)
        pids = sorted({int(d.labels["pid"]) for d in procs if d.t and d.labels.get("pid", "").isdigit()})
        out.append(GpuSilence(ref, labels.get("uuid", ""), last_t, until, went_on_text, r, xids[-1] if xids else None, pids))
    return sorted(out, key=lambda s: s.last_t)


def _gpu_event(s: GpuSilence) -> HealthEvent:
    silent = s.until_t - s.last_t
    if s.last_xid is not None:
        code = s.last_xid.data.get("xid", s.last_xid.labels.get("xid"))
        try:
            meaning = xid_info(int(code)).meaning
        except (TypeError, ValueError):
            meaning = "an XID outside the catalog"
        last = f"XID {code} at {time_of_day(s.last_xid.t)} ({meaning})"
        last_ev = {"last_xid": code, "last_xid_t": s.last_xid.t, "last_xid_meaning": meaning}
    else:
        last = f"a sample at {time_of_day(s.last_t)} saying it was up"
        last_ev = {}
    listed = f"; processes {', '.join(map(str, s.pids_listed))} were on it at its last sample" if s.pids_listed else ""
    summary = (f"{s.ref} has sent no sample since {time_of_day(s.last_t)} ({silent:.0f} s, over its silence threshold of "
               f"{s.rhythm.threshold_seconds:.0f} s at a {s.rhythm.median_seconds:.3g} s sampling interval) while {s.went_on}; "
               f"the last thing seen on it was {last}{listed}.")
    evidence = {"last_sample_t": s.last_t, "silent_seconds": Q.seconds(round(silent, 1)),
                "sample_interval_seconds": Q.seconds(round(s.rhythm.median_seconds, 3)),
                "silence_threshold_seconds": Q.seconds(round(s.rhythm.threshold_seconds, 1)),
                "went_on": s.went_on, "went_on_until_t": s.until_t, **last_ev, "pids_listed_last": s.pids_listed}
    return HealthEvent("gpu_silent", s.ref, s.uuid, s.last_t, s.until_t, "critical", True, summary,
                       f"{s.ref} went silent", evidence, list(ADVICE_GPU_SILENT))


@register_analyzer("gpu_silence", order=SILENCE_ORDER)
def gpu_silence(reader: AnalysisReader, scope: DiagnoseScope) -> list[Finding]:
    """GPUs that stopped sending samples while the others went on: critical, as a lost GPU."""
    return to_findings(reader, scope, [_gpu_event(s) for s in gpu_silences(reader, scope)])


# ------------------------------------------------------------------ ranks and services
def _gpus_of(placed: dict[GpuRef, list[Occupant]]) -> dict[str, list[GpuRef]]:
    out: dict[str, list[GpuRef]] = defaultdict(list)
    for ref, occs in placed.items():
        for o in occs:
            out[o.name].append(ref)
    return out


def _listed_until(reader: AnalysisReader, host: str, pids: set[int], end: float | None) -> tuple[float, int | None]:
    """The last time one of `pids` was in a GPU process list of `host` (bounded by `end`)."""
    best, who = float("-inf"), None
    for pid in pids:
        for lv in reader.latest_values(GPU_PROCESS_MEMORY, {"host": host, "pid": str(pid)}):
            t = _bounded(lv.t, end)
            if t > best:
                best, who = t, pid
    return best, who


@dataclass
class _Track:
    labels: dict[str, str]
    events: list[EventRow]


def _tracks(reader: AnalysisReader, scope: DiagnoseScope, kinds: tuple[str, ...], key: tuple[str, ...]) -> dict[tuple[str, ...], _Track]:
    out: dict[tuple[str, ...], _Track] = {}
    for kind in kinds:
        for e in reader.event_rows(kind, start=scope.start, end=scope.end):
            labels = {k: e.labels.get(k, "0" if k == "rank" else "") for k in key}
            if kind != N.EV_REQUEST and "rank" in key and "rank" not in e.labels and e.data.get("rank") is not None:
                labels["rank"] = str(e.data["rank"])
            out.setdefault(tuple(labels[k] for k in key), _Track(labels, [])).events.append(e)
    for tr in out.values():
        tr.events.sort(key=lambda e: e.t)
    return out


def _severity(refs: list[GpuRef], silent_gpus: set[GpuRef]) -> str:
    return "critical" if any(r in silent_gpus for r in refs) else "warning"


def rank_silences(reader: AnalysisReader, scope: DiagnoseScope, placed: dict[GpuRef, list[Occupant]], silent_gpus: set[GpuRef]) -> list[Finding]:
    """Ranks whose steps stopped while the job's other ranks stepped on or its process stayed listed."""
    job, rank = N.TRAIN_JOB_LABEL, "rank"
    tracks = _tracks(reader, scope, (N.EV_TRAIN_STEP, N.EV_TRAIN_EVAL), (job, rank, "host"))
    gpus_of = _gpus_of(placed)
    occ_of = {o.name: o for occs in placed.values() for o in occs}
    out = []
    for tr in tracks.values():
        steps = [e for e in tr.events if e.kind == N.EV_TRAIN_STEP]
        r = rhythm([e.t for e in steps])
        if r is None:
            continue
        last = tr.events[-1]
        others = [o.events[-1].t for o in tracks.values() if o is not tr and o.labels[job] == tr.labels[job]]
        others_until = max(others, default=float("-inf"))
        name = f"job {tr.labels[job]} rank {tr.labels[rank]}"
        occ = occ_of.get(name)
        pids = set(occ.pids) if occ else set()
        listed_until, pid = _listed_until(reader, tr.labels["host"], pids, scope.end)
        until = max(others_until, listed_until)
        if until - last.t <= r.threshold_seconds:
            continue
        refs = gpus_of.get(name, [])
        gpu = refs[0].gpu if refs else ""
        on = f" on GPU {gpu}" if gpu else ""
        why = []
        if others_until - last.t > r.threshold_seconds:
            why.append(f"the job's other ranks stepped on until {time_of_day(others_until)}")
        if listed_until - last.t > r.threshold_seconds:
            why.append(f"its process {pid} was still in the process list of GPU {gpu} until {time_of_day(listed_until)}")
        step = last.data.get("step")
        what = f"step {step}" if last.kind == N.EV_TRAIN_STEP and step is not None else last.kind
        step_s = last.data.get("step_s")
        silent = until - last.t
        sev = _severity(refs, silent_gpus)
        summary = (f"Rank {tr.labels[rank]} of job {tr.labels[job]}{on} made no step after {what} ended at {time_of_day(last.t)}"
                   + (f" (it took {float(step_s):.3g} s)" if isinstance(step_s, int | float) else "")
                   + f": silent for {silent:.0f} s, over its threshold of {r.threshold_seconds:.0f} s at a {r.median_seconds:.3g} s step rhythm, "
                   f"while {' and '.join(why)}" + ("; its GPU went silent too." if sev == "critical" else "."))
        evidence = {"last_step": step, "last_step_t": last.t, "last_record": last.kind, "last_step_seconds": Q.seconds(step_s if isinstance(step_s, int | float) else None),
                    "silent_seconds": Q.seconds(round(silent, 1)), "step_interval_seconds": Q.seconds(round(r.median_seconds, 3)),
                    "silence_threshold_seconds": Q.seconds(round(r.threshold_seconds, 1)),
                    "other_ranks_until_t": others_until if others else None, "process_listed_until_t": listed_until if pid is not None else None,
                    "pid": pid, "gpu_silent": sev == "critical"}
        labels = {job: tr.labels[job], rank: tr.labels[rank], "host": tr.labels["host"], **({"gpu": gpu} if gpu else {})}
        out.append(Finding("rank_silent", "training", last.t, until, sev, summary,  # type: ignore[arg-type]
                           {k: v for k, v in evidence.items() if v is not None}, list(ADVICE_RANK_SILENT), labels))
    return out


def service_silences(reader: AnalysisReader, scope: DiagnoseScope, placed: dict[GpuRef, list[Occupant]], silent_gpus: set[GpuRef]) -> list[Finding]:
    """Services whose steady requests stopped while another service's went on."""
    tracks = _tracks(reader, scope, (N.EV_REQUEST,), ("service", "host"))
    gpus_of = _gpus_of(placed)
    out = []
    for tr in tracks.values():
        reqs = tr.events
        last = reqs[-1]
        r = rhythm([e.t for e in reqs])
        steady = sum(1 for e in reqs if e.t >= last.t - RHYTHM_SECONDS) >= MIN_STEADY_REQUESTS
        others = [o.events[-1].t for o in tracks.values() if o is not tr and o.labels["service"] != tr.labels["service"]]
        if r is None or not steady or not others:
            continue
        until = max(others)
        if until - last.t <= r.threshold_seconds:
            continue
        service = tr.labels["service"]
        refs = gpus_of.get(f"service {service}", [])
        sev = _severity(refs, silent_gpus)
        status = str(last.data.get("status", "ok"))
        recent = [e for e in reqs if e.t >= last.t - RHYTHM_SECONDS]
        failed = sum(1 for e in recent if e.data.get("status", "ok") != "ok")
        silent = until - last.t
        gpu = refs[0].gpu if refs else ""
        summary = (f"Service {service}" + (f" on GPU {gpu}" if gpu else "") + f" served no request after {time_of_day(last.t)} "
                   f"(its last one: {status}; {failed} of its last {len(recent)} failed): silent for {silent:.0f} s, over its threshold of "
                   f"{r.threshold_seconds:.0f} s at {len(recent) / max(RHYTHM_SECONDS, 1e-9):.2g} req/s before, while other services served until {time_of_day(until)}"
                   + ("; its GPU went silent too." if sev == "critical" else "."))
        evidence = {"last_request_t": last.t, "last_request_status": status, "requests_before": len(recent), "failed_before": failed,
                    "silent_seconds": Q.seconds(round(silent, 1)), "arrival_interval_seconds": Q.seconds(round(r.median_seconds, 3)),
                    "silence_threshold_seconds": Q.seconds(round(r.threshold_seconds, 1)), "others_until_t": until, "gpu_silent": sev == "critical"}
        labels = {"service": service, "host": tr.labels["host"], **({"gpu": gpu} if gpu else {})}
        out.append(Finding("service_silent", "inference", last.t, until, sev, summary, evidence, list(ADVICE_SERVICE_SILENT), labels))  # type: ignore[arg-type]
    return out


@register_analyzer("workload_silence", order=DEFAULT_ORDER)
def workload_silence(reader: AnalysisReader, scope: DiagnoseScope) -> list[Finding]:
    """Ranks and services that stopped reporting while the others went on."""
    silent_gpus = {s.ref for s in gpu_silences(reader, scope)}
    placed = occupants(reader, scope.start, scope.end)
    out = []
    if not scope.service:
        out += [f for f in rank_silences(reader, scope, placed, silent_gpus) if not scope.job or f.labels.get(N.TRAIN_JOB_LABEL) == scope.job]
    if not scope.job:
        out += [f for f in service_silences(reader, scope, placed, silent_gpus) if not scope.service or f.labels.get("service") == scope.service]
    return out
