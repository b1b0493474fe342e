"""Co-location guard: a training job and an inference service on one GPU without isolation.

Who is who comes from the workloads' own records (the training monitor's `train_start` and
`train_step` events, the inference monitor's `infer_start`, `request` and `cold_start` events all
carry a pid), and, for processes gpulens does not monitor, from well-known serving process names.
Where each process runs comes from the GPU process listing (`gpu_process_memory_bytes{pid,gpu}`).

Interference is the serving process's service time (end - start, so queueing behind a backlog is
not counted) while training steps ran, against the time no training process existed. Kept apart:
the service's cold start (its first request and the backlog behind it) and the training job's
start-up, when it already competes for CPU but has not reached the GPU listing yet.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from gpulens.diagnose.base import DiagnoseScope, Finding, register_analyzer
from gpulens.reader import AnalysisReader, EventRow, analysis_reader
from gpulens.stats import percentile
from gpulens.store import Store
from gpulens.vocab import gpu_fields as F
from gpulens.vocab import names as N
from gpulens.vocab.gpu import GPU_MIG_MODE, GPU_PROCESS_MEMORY
from gpulens.workload.inference.records import request_from_event

TRAINING_EVENT_KINDS = (N.EV_TRAIN_START, N.EV_TRAIN_STEP)
SERVING_EVENT_KINDS = (N.EV_INFER_START, N.EV_REQUEST, N.EV_COLD_START)
# Serving processes recognised by name when no gpulens monitor runs inside them.
SERVING_PROCESS_NAMES = ("vllm", "tritonserver", "text-generation", "sglang", "trtllm", "lmdeploy", "ollama")
MPS_SERVER_NAME = "nvidia-cuda-mps-server"
# GPU_MIG_MODE is 1 when the GPU is in MIG mode (nvmlDeviceGetMigMode). The process listing does not
# say which MIG instance a process runs in, so with MIG on the pair may well be isolated: reported as info.
# A training job holds the CPU (imports, model build, data loader workers) for tens of seconds
# before its first CUDA allocation puts it in the GPU listing. Without a `train_start` event to say
# when it launched, serving requests in this window before it appeared are left out of "alone".
STARTUP_GUARD_SECONDS = 20.0
MIN_REQUESTS = 5  # per window, for a percentile worth reporting

# For alerts: 1 while a training and a serving process share a GPU, 0 once they no longer do.
# Labels: gpu, uuid, host, training_pid, serving_pid. `colocation_marks` says what to write; the
# pipeline's co-location watch (gpulens.pipeline.sinks) writes it.
COLOCATION_SERIES = "gpu_training_serving_colocated"
ALERT_RULE_YAML = """\
pack: colocation
metrics: [gpu_training_serving_colocated]
rules:
  - name: GpuTrainingServingColocated
    expr: gpu_training_serving_colocated > 0
    for: 1m
    severity: warning
    summary: "GPU {{ $labels.gpu }} on {{ $labels.host }}: training pid {{ $labels.training_pid }} and serving pid {{ $labels.serving_pid }} share it without isolation"
    advice: "Separate GPUs or pools; else MIG instances, or MPS with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for training. `gpulens diagnose` quantifies the interference."
"""


@dataclass
class LatencyStats:
    requests: int
    p50_seconds: float | None
    p95_seconds: float | None
    p99_seconds: float | None


@dataclass
class Interference:
    """Serving service time (end - start) by what the training job was doing."""

    alone: LatencyStats  # no training process on the GPU, start-up and cold start excluded
    with_training: LatencyStats  # requests that ran entirely inside training steps
    training_startup: LatencyStats  # the start-up window, reported but compared with nothing
    cold_start: LatencyStats
    cold_start_latency: LatencyStats  # end - intended send time: the backlog shows here
    cold_start_load_seconds: float | None  # the model load the service reported, if any
    p50_change_ratio: float | None
    p95_change_ratio: float | None
    p99_change_ratio: float | None


@dataclass
class ProcessInfo:
    pid: int
    name: str
    role: str  # training | serving
    how: str  # what told gpulens the role
    labels: dict[str, str] = field(default_factory=dict)  # job / service from the monitor


@dataclass
class Colocation:
    gpu: str
    host: str
    uuid: str
    training: ProcessInfo
    serving: ProcessInfo
    together_start: float
    together_end: float
    samples_together: int
    mps_server: bool
    mig_mode: bool

    @property
    def maybe_isolated(self) -> bool:
        return self.mps_server or self.mig_mode
    interference: Interference | None


def event_pid(e: EventRow) -> int | None:
    """The process id an event names (in its data or labels), if any."""
    v = e.data.get("pid", e.labels.get("pid"))
    try:
        return int(v) if v is not None and v != "" else None
    except (TypeError, ValueError):
        return None


def latency_stats(values: list[float]) -> LatencyStats:
    return LatencyStats(len(values), percentile(values, 50), percentile(values, 95), percentile(values, 99))


def _roles(reader: AnalysisReader, scope: DiagnoseScope) -> tuple[dict[int, ProcessInfo], dict[int, list[EventRow]], dict[int, list[EventRow]]]:
    """pid -> role from monitor events; also each pid's training steps and serving requests."""
    roles: dict[int, ProcessInfo] = {}
    steps: dict[int, list[EventRow]] = defaultdict(list)
    requests: dict[int, list[EventRow]] = defaultdict(list)
    for role, kinds, sel in (("training", TRAINING_EVENT_KINDS, scope.job), ("serving", SERVING_EVENT_KINDS, scope.service)):
        key = N.TRAIN_JOB_LABEL if role == "training" else "service"
        for kind in kinds:
            # A job that started before the window still runs in it: start events are read from
            # the beginning (they are few); steps and requests only inside the window.
            since = None if kind in (N.EV_TRAIN_START, N.EV_INFER_START) else scope.start
            for e in reader.event_rows(kind, start=since, end=scope.end):
                pid = event_pid(e)
                if pid is None or (sel and e.labels.get(key, sel) != sel):
                    continue
                if pid not in roles:
                    lab = {key: e.labels[key]} if key in e.labels else {}
                    roles[pid] = ProcessInfo(pid, str(e.data.get("process", "")), role, f"{kind} events", lab)
                if kind == N.EV_TRAIN_STEP:
                    steps[pid].append(e)
                elif kind == N.EV_REQUEST:
                    requests[pid].append(e)
    return roles, steps, requests


def _presence(reader: AnalysisReader, scope: DiagnoseScope) -> dict[tuple[str, str, str], dict[int, tuple[str, list[float]]]]:
    """(host, gpu, uuid) -> pid -> (process name, sample times) from the GPU process listing."""
    out: dict[tuple[str, str, str], dict[int, tuple[str, list[float]]]] = defaultdict(dict)
    for sd in reader.series_windows(GPU_PROCESS_MEMORY, start=scope.start, end=scope.end):
        lab = sd.labels
        try:
            pid = int(lab.get("pid", ""))
        except ValueError:
            continue
        if sd.t:
            out[(lab.get("host", ""), lab.get("gpu", ""), lab.get("uuid", ""))][pid] = (lab.get("process", ""), sd.t)
    return out


def _span(e: EventRow) -> tuple[float, float] | None:
    d = e.data
    end = d.get("t_end", d.get("end", e.t))
    start = d.get("t_start", d.get("start"))
    if start is None:
        dur = d.get("step_s", d.get("seconds"))
        start = end - dur if isinstance(dur, int | float) else None
    if not isinstance(start, int | float) or not isinstance(end, int | float) or end < start:
        return None
    return float(start), float(end)


def _cold_start_ids(reqs: list[tuple[float, float, float | None, int]]) -> set[int]:
    """The service's first request and the backlog behind it: requests up to the first one that
    waited less than a typical service time (needs intended/arrival times; else the first only)."""
    if not reqs:
        return set()
    ordered = sorted(reqs)
    cold = {ordered[0][3]}
    services = sorted(e - s for s, e, _, _ in ordered[1:])
    typical = services[len(services) // 2] if services else 0.0
    for s, _e, intended, i in ordered[1:]:
        if intended is None or s - intended <= typical:
            break
        cold.add(i)
    return cold


def interference(
    steps: list[EventRow], requests: list[EventRow], training_seen: tuple[float, float], launch_t: float | None, cold_events: list[EventRow]
) -> Interference | None:
    spans = [s for s in (_span(e) for e in steps) if s]
    reqs = []
    for i, e in enumerate(requests):
        r = request_from_event(e)
        if r is None or r.end_t < r.start_t:
            continue
        reqs.append((r.start_t, r.end_t, r.intended_t, i))
    if not reqs:
        return None
    spans.sort()
    train_lo = min([training_seen[0]] + [s for s, _ in spans])
    # After its last step the process only tears down; with no steps, its last listing counts.
    train_hi = spans[-1][1] if spans else training_seen[1]
    startup_lo = launch_t if launch_t is not None else train_lo - STARTUP_GUARD_SECONDS
    first_step = spans[0][0] if spans else train_lo
    cold = _cold_start_ids(reqs)

    def inside_steps(s: float, e: float) -> bool:
        # Inside the stretch of back-to-back steps: from the first step's start to the last's end.
        return bool(spans) and s >= spans[0][0] and e <= spans[-1][1]

    buckets: dict[str, list[float]] = defaultdict(list)
    for s, e, intended, i in reqs:
        svc = e - s
        if i in cold:
            buckets["cold"].append(svc)
            buckets["cold_latency"].append(e - (intended if intended is not None else s))
        elif inside_steps(s, e):
            buckets["with"].append(svc)
        elif e <= startup_lo or s >= train_hi:
            buckets["alone"].append(svc)
        elif e > startup_lo and s < first_step:
            buckets["startup"].append(svc)
        # else: partly overlapping the training window: neither clean "with" nor "alone"
    alone, with_ = latency_stats(buckets["alone"]), latency_stats(buckets["with"])

    def change(a: float | None, b: float | None) -> float | None:
        if a is None or b is None or a <= 0 or alone.requests < MIN_REQUESTS or with_.requests < MIN_REQUESTS:
            return None
        return b / a - 1.0

    load = next((float(c.data["seconds"]) for c in cold_events if isinstance(c.data.get("seconds"), int | float)), None)
    return Interference(
        alone=alone,
        with_training=with_,
        training_startup=latency_stats(buckets["startup"]),
        cold_start=latency_stats(buckets["cold"]),
        cold_start_latency=latency_stats(buckets["cold_latency"]),
        cold_start_load_seconds=load,
        p50_change_ratio=change(alone.p50_seconds, with_.p50_seconds),
        p95_change_ratio=change(alone.p95_seconds, with_.p95_seconds),
        p99_change_ratio=change(alone.p99_seconds, with_.p99_seconds),
    )


def find_colocations(source: AnalysisReader | Store, scope: DiagnoseScope | None = None) -> list[Colocation]:
    """Every (training, serving) process pair seen together on one GPU."""
    reader = analysis_reader(source)
    scope = scope or DiagnoseScope()
    roles, steps, requests = _roles(reader, scope)
    out: list[Colocation] = []
    for (host, gpu, uuid), procs in sorted(_presence(reader, scope).items()):
        mps = any(MPS_SERVER_NAME in name for name, _ in procs.values())
        mig = any(lv.value == 1 for lv in reader.latest_values(GPU_MIG_MODE, {"gpu": gpu, "host": host}))
        found: dict[str, list[ProcessInfo]] = {"training": [], "serving": []}
        for pid, (name, _t) in sorted(procs.items()):
            info = roles.get(pid)
            if info is None and any(n in name.lower() for n in SERVING_PROCESS_NAMES):
                info = ProcessInfo(pid, name, "serving", "its process name")
            if info is None:
                continue
            info = ProcessInfo(info.pid, info.name or name, info.role, info.how, dict(info.labels))
            found[info.role].append(info)
        for tr in found["training"]:
            for sv in found["serving"]:
                t_tr, t_sv = procs[tr.pid][1], procs[sv.pid][1]
                lo, hi = max(t_tr[0], t_sv[0]), min(t_tr[-1], t_sv[-1])
                if hi < lo:
                    continue  # on this GPU one after the other, never together
                together = len({round(t, 1) for t in t_tr} & {round(t, 1) for t in t_sv})
                launch = [e.t for e in reader.event_rows(N.EV_TRAIN_START, start=scope.start, end=scope.end) if event_pid(e) == tr.pid]
                cold = [e for e in reader.event_rows(N.EV_COLD_START, start=scope.start, end=scope.end) if event_pid(e) == sv.pid]
                inter = interference(steps.get(tr.pid, []), requests.get(sv.pid, []), (t_tr[0], t_tr[-1]), min(launch) if launch else None, cold)
                out.append(Colocation(gpu, host, uuid, tr, sv, lo, hi, together, mps, mig, inter))
    return out


def _who(p: ProcessInfo) -> str:
    name = f"{p.name} " if p.name else ""
    tag = p.labels.get(N.TRAIN_JOB_LABEL) or p.labels.get("service")
    return f"{p.role} process {name}(pid {p.pid}{', ' + tag if tag else ''})"


def _fmt(stats: LatencyStats) -> str:
    if not stats.requests:
        return "no requests"
    return f"p50 {stats.p50_seconds:.3f} s / p95 {stats.p95_seconds:.3f} s over {stats.requests} requests"


ADVICE = [
    "Give training and serving separate GPUs (separate node pools, or CUDA_VISIBLE_DEVICES per process), so that "
    "the training job's long kernels cannot queue in front of the service's requests.",
    "If they must share a GPU, split it with MIG (e.g. on an H100/H200 a 3g.71gb instance for serving and a "
    "4g.71gb one for training): each instance has its own SMs and memory, so neither can starve the other.",
    "Without MIG, run both under MPS with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (e.g. 30 for training) and "
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT so the service keeps SMs and memory headroom.",
    "Without MPS the GPU time-slices between the two processes: a shorter time slice "
    "(`nvidia-smi compute-policy --set-timeslice 1`) bounds how long a request waits behind training work; and lower "
    "the training job's CPU priority (nice, cgroup CPU limits), since it competes for CPU while it starts and loads data.",
    "Schedule training off-peak, and watch the service's p95/p99 against its SLO while both run.",
]


@register_analyzer("colocation")
def analyze(reader: AnalysisReader, scope: DiagnoseScope) -> list[Finding]:
    findings = []
    for c in find_colocations(reader, scope):
        where = f"GPU {c.gpu}" + (f" on {c.host}" if c.host else "")
        summary = f"A {_who(c.training)} and a {_who(c.serving)} share {where} without isolation"
        if c.mig_mode:
            summary = summary.replace("without isolation", "in MIG mode") + " (if they run in different MIG instances they are isolated; check `nvidia-smi`)."
        elif c.mps_server:
            summary += " (MPS is running: check its active-thread and memory limits)."
        else:
            summary += " (no MIG instance, no MPS)."
        i = c.interference
        if i is not None and i.p95_change_ratio is not None:
            summary += (
                f" While training ran, the service's p95 was {i.with_training.p95_seconds:.3f} s against "
                f"{i.alone.p95_seconds:.3f} s alone ({i.p95_change_ratio:+.0%}); p50 {i.p50_change_ratio:+.0%}."
            )
        if i is not None and i.cold_start.requests:
            summary += (
                f" The service's cold start ({i.cold_start.requests} requests, latency p50 "
                f"{i.cold_start_latency.p50_seconds:.2f} s) is kept apart from this."
            )
        evidence: dict[str, Any] = {
            "gpu": c.gpu,
            "uuid": c.uuid,
            "training_pid": c.training.pid,
            "training_process": c.training.name or "(name not recorded)",
            "training_identified_by": c.training.how,
            "serving_pid": c.serving.pid,
            "serving_process": c.serving.name or "(name not recorded)",
            "serving_identified_by": c.serving.how,
            "seconds_together": round(c.together_end - c.together_start, 1),
            "listing_samples_together": c.samples_together,
            "mps_server_running": c.mps_server,
            F.MIG_MODE: c.mig_mode,
        }
        if i is not None:
            evidence["service_time_alone"] = _fmt(i.alone)
            evidence["service_time_with_training"] = _fmt(i.with_training)
            evidence["service_time_training_startup"] = _fmt(i.training_startup)
            evidence["service_time_cold_start"] = _fmt(i.cold_start)
            evidence["latency_cold_start"] = _fmt(i.cold_start_latency)
            evidence["interference"] = asdict(i)
        severity = "info" if c.maybe_isolated else "warning"
        if i is not None and (i.p95_change_ratio or 0) >= 0.5:
            severity = "critical"
        labels = {"gpu": c.gpu, "host": c.host, **c.training.labels, **c.serving.labels}
        findings.append(
            Finding(
                kind="colocation",
                workload="gpu",
                start=c.together_start,
                end=c.together_end,
                severity=severity,  # type: ignore[arg-type]
                summary=summary,
                evidence=evidence,
                advice=list(ADVICE),
                labels=labels,
            )
        )
    return findings


@dataclass(frozen=True)
class ColocationMark:
    """One sample of COLOCATION_SERIES to write at `now`."""

    labels: dict[str, str]
    value: float  # 1 while the pair shares the GPU, 0 for a pair that was 1 and no longer does


def colocation_marks(source: AnalysisReader | Store, now: float, window_seconds: float = 60.0) -> list[ColocationMark]:
    """For a live agent, every few seconds: over the last `window_seconds`, 1 for each pair sharing a
    GPU without isolation and 0 for a pair marked 1 before that no longer shares it (so the alert
    resolves). Only reads: the caller writes the marks."""
    reader = analysis_reader(source)
    found = [
        c for c in find_colocations(reader, DiagnoseScope(start=now - window_seconds, end=now))
        if c.together_end >= now - window_seconds and not c.maybe_isolated
    ]
    marks = [
        ColocationMark({"gpu": c.gpu, "uuid": c.uuid, "host": c.host, "training_pid": str(c.training.pid), "serving_pid": str(c.serving.pid)}, 1.0)
        for c in found
    ]
    current = {tuple(sorted(m.labels.items())) for m in marks}
    for lv in reader.latest_values(COLOCATION_SERIES):
        if lv.value > 0 and tuple(sorted(lv.labels.items())) not in current:
            marks.append(ColocationMark(dict(lv.labels), 0.0))
    return marks
