"""Training diagnosis: name the bottleneck of a training job from its step records and the GPU's
telemetry, with the numbers behind it and the fixes in the order that pays.

Everything here works from what a live monitor has: step times and their parts (data wait,
communication wait, checkpoint), the loss, allocator memory, and the GPU series of the same host.
Nothing keys on a recording's phase labels or on absolute timestamps; thresholds are either
physical (a share of the step, GPU utilization) or relative to the job's own steps.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpulens.diagnose import evidence as Q
from gpulens.diagnose import gpu_workloads as W
from gpulens.diagnose.base import DiagnoseScope, Finding, register_analyzer
from gpulens.reader import AnalysisReader
from gpulens.stats import percentile
from gpulens.units import format_bytes
from gpulens.vocab import gpu as G
from gpulens.vocab import gpu_fields as F
from gpulens.vocab import names as N
from gpulens.workload.training.records import StepRecord, record_from_dict

# ---- thresholds (shares are of the step time; why each value is in the docstring of its analyzer)
WARMUP_STEPS = 3  # the first steps of a run compile kernels and fill the allocator
RESTART_GAP_MIN_SECONDS = 30.0
INPUT_WAIT_SHARE = 0.25
COMM_WAIT_SHARE = 0.30
MIN_WAIT_SECONDS = 0.005
MIN_SEGMENT_STEPS = 3
CHECKPOINT_MIN_SECONDS = 0.05
CHECKPOINT_VS_STEP = 2.0
LOW_GPU_UTILIZATION = 0.40
UTIL_SMOOTH_STEPS = 5
UNDERUTILIZED_MIN_STEPS = 5
UNDERUTILIZED_MIN_SECONDS = 1.0
MEMORY_PRESSURE_SHARE = 0.92
STRAGGLER_RATIO = 1.25
STRAGGLER_MIN_SECONDS = 0.002
REGRESSION_RATIO = 1.5
REGRESSION_MIN_STEPS = 8
REGRESSION_WINDOW = 9
THROTTLE_SHARE = 0.5
THROTTLE_MIN_SECONDS = 2.0
THROTTLE_REASONS = {
    "hw_slowdown": "critical",
    "hw_thermal": "critical",
    "hw_power_brake": "critical",
    "sw_thermal": "warning",
    "sw_power_cap": "info",
}

ALWAYS = "Change one thing at a time, then re-measure against the baseline (same job, same batch) before the next change."
ADVICE_INPUT = [
    "Give the data loader more worker processes (DataLoader num_workers), so batches are prepared in parallel.",
    "Turn on pinned memory (pin_memory=True) and copy batches with non_blocking=True.",
    "Prefetch more batches (prefetch_factor, persistent_workers=True) so one slow batch does not stall the GPU.",
    "Move expensive pre-processing (tokenization, decoding, augmentation) offline and read ready-made tensors.",
    ALWAYS,
]
ADVICE_MEMORY = [
    "Use gradient accumulation with a smaller micro-batch: the same effective batch in less memory.",
    "Turn on activation checkpointing (recompute activations in the backward pass).",
    "Train in bf16 mixed precision (or fp16 with loss scaling) instead of fp32.",
    "Shard optimizer states, gradients and weights across GPUs (ZeRO / FSDP) before buying larger cards.",
    ALWAYS,
]
ADVICE_COMM = [
    "Overlap communication with the backward pass and tune the bucket size (DDP bucket_cap_mb).",
    "Accumulate more micro-batches per synchronization (no_sync() for the accumulation steps).",
    "Check the interconnect: NVLink/InfiniBand health and bandwidth (nccl-tests), and that NCCL uses it.",
    "Validate the parallel layout (data / tensor / pipeline parallel sizes) on a small run before scaling out.",
    ALWAYS,
]
ADVICE_MEMORY_OTHER = [
    "Free the memory the other process holds first (see other_process_memory for that GPU): the job itself has room; until then keep its batch as it is.",
    ALWAYS]
ADVICE_CHECKPOINT = [
    "Save checkpoints asynchronously (e.g. torch.distributed.checkpoint async_save) or from a background thread after copying to CPU.",
    "Save less often, or save only what is needed to resume (sharded state dicts on multi-GPU).",
    "Write to fast local disk first and copy to remote storage in the background.",
    ALWAYS,
]
ADVICE_UNDERUTILIZED = [
    "Raise the batch size (per GPU) until memory allows; keep the effective batch with fewer accumulation steps.",
    "If the batch cannot grow, reduce per-step overhead: torch.compile or CUDA graphs, fused optimizers, fewer small kernels.",
    "Check that the model runs in bf16 so the tensor cores are used.",
    ALWAYS,
]
ADVICE_STRAGGLER = [
    "Look at the slow rank's machine first: its GPU clocks and temperature, other processes on that GPU, its data loader.",
    "Make sure every rank gets the same amount of work (equal batch sizes and sequence lengths per rank).",
    "If one node is always slow, drain it and re-run the same job on another node to confirm.",
    ALWAYS,
]
ADVICE_THROTTLED = [
    "Check cooling and airflow (temperature against the slowdown threshold) and the power limit (nvidia-smi -q -d PERFORMANCE,POWER).",
    "If the GPU is at its power cap under a steady load, that is expected; compare the clock against other nodes before acting.",
    "Hardware slowdown or a power brake points at the node: report it to the operators and move the job.",
    ALWAYS,
]
ADVICE_NAN = [
    "Resume from the last good checkpoint.",
    "Lower the learning rate or lengthen the warm-up, and clip gradients (clip_grad_norm_).",
    "Prefer bf16 to fp16; under fp16 keep dynamic loss scaling (GradScaler) on.",
    "Look for a bad batch: log the sample ids of the step where the loss first became NaN.",
]
ADVICE_REGRESSION = [
    "Compare the slow steps with the baseline: what changed (code, data, batch shape, other jobs on the GPU, clocks)?",
    "Profile one slow step (torch.profiler) and one baseline step and compare the top kernels.",
    "If a recent change caused it, roll it back and re-measure.",
    ALWAYS,
]


@dataclass
class Run:
    """The steps of one rank of one job, oldest first."""

    job: str
    rank: str
    host: str
    steps: list[StepRecord]
    warm: list[bool] = field(default_factory=list)  # False for warm-up steps
    gpu: str | None = None  # the GPU (NVML index) the join placed the rank on, when it could

    @property
    def labels(self) -> dict[str, str]:
        return {N.TRAIN_JOB_LABEL: self.job, "rank": self.rank, "host": self.host}


@dataclass
class GpuView:
    """GPU series of one host, aligned for window queries."""

    util_t: list[float] = field(default_factory=list)
    util_v: list[float] = field(default_factory=list)
    tensor_t: list[float] = field(default_factory=list)
    tensor_v: list[float] = field(default_factory=list)
    mem_used_t: list[float] = field(default_factory=list)
    mem_used_v: list[float] = field(default_factory=list)
    mem_total_bytes: float | None = None
    clock: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)
    processes: dict[tuple[int, str], tuple[list[float], list[float]]] = field(default_factory=dict)  # (pid, name): memory held


# ------------------------------------------------------------------ loading
_CACHE: dict[tuple, tuple[list[Run], dict[tuple[str, str | None], GpuView]]] = {}


def _load(reader: AnalysisReader, scope: DiagnoseScope) -> tuple[list[Run], dict[tuple[str, str | None], GpuView]]:
    """Training runs in scope and the GPU view of each of their hosts (memoized per data state)."""
    key = (reader.cache_key(), scope.start, scope.end, scope.job)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    labels = {N.TRAIN_JOB_LABEL: scope.job} if scope.job else None
    groups: dict[tuple[str, str, str], list[StepRecord]] = defaultdict(list)
    for ev in reader.event_rows(N.EV_TRAIN_STEP, start=scope.start, end=scope.end, match=labels):
        rec = record_from_dict(ev.data)
        if rec is None:
            continue
        groups[(ev.labels.get(N.TRAIN_JOB_LABEL, ""), ev.labels.get("rank", "0"), ev.labels.get("host", ""))].append(rec)
    # A rank's GPU from the one join (process listing, unambiguous CUDA index, the host's only GPU).
    placed = W.occupants(reader, scope.start, scope.end, roles=("training",))  # a week of requests is not read
    runs = []
    for run_key, steps in sorted(groups.items()):
        steps.sort(key=lambda r: r.t_start)
        run = Run(*run_key, steps, _warm_flags(steps))
        ref = W.gpu_of(placed, run.labels, steps[0].t_start, steps[-1].t_end)
        run.gpu = ref.gpu if ref is not None and ref.host == run.host else None
        runs.append(run)
    views = {(h, g): _gpu_view(reader, h, g, scope) for h, g in {(r.host, r.gpu) for r in runs} if g is not None}
    _CACHE.clear()
    _CACHE[key] = (runs, views)
    return runs, views


def _warm_flags(steps: Sequence[StepRecord]) -> list[bool]:
    """False for the first steps of the run and of every restart (a long gap between steps)."""
    if not steps:
        return []
    med = statistics.median(s.duration_seconds for s in steps)
    gap_limit = max(RESTART_GAP_MIN_SECONDS, 20 * med)
    flags, since = [], 0
    for i, s in enumerate(steps):
        if i and s.t_start - steps[i - 1].t_end > gap_limit:
            since = 0
        flags.append(since >= WARMUP_STEPS)
        since += 1
    return flags


def _gpu_view(reader: AnalysisReader, host: str, gpu: str, scope: DiagnoseScope) -> GpuView:
    """The GPU series of the rank's GPU (never several GPUs merged: a rank runs on one)."""
    view = GpuView()
    sel = {"host": host, "gpu": gpu}

    def first(name: str, extra: dict[str, str] | None = None) -> tuple[list[float], list[float]]:
        data = reader.series_windows(name, {**sel, **(extra or {})}, start=scope.start, end=scope.end)
        if not data:
            return [], []
        if len(data) == 1:
            return data[0].t, data[0].value
        merged = sorted((t, v) for d in data for t, v in zip(d.t, d.value, strict=True))  # a GPU swapped in the slot: both uuids
        return [t for t, _ in merged], [v for _, v in merged]

    view.util_t, view.util_v = first(G.GPU_UTILIZATION_RATIO)
    view.tensor_t, view.tensor_v = first(G.GPU_TENSOR_ACTIVE_RATIO)
    view.mem_used_t, view.mem_used_v = first(G.GPU_MEMORY_USED_BYTES)
    total = reader.latest_values(G.GPU_MEMORY_TOTAL_BYTES, sel)
    view.mem_total_bytes = max((lv.value for lv in total), default=None)
    view.processes = W.process_memory(reader, host, gpu, scope.start, scope.end)
    for reason in THROTTLE_REASONS:
        t, v = first(G.GPU_CLOCK_EVENT_ACTIVE, {"reason": reason})
        if t:
            view.clock[reason] = (t, v)
    return view


def _window(ts: list[float], vs: list[float], a: float, b: float) -> list[float]:
    """Values in [a, b]; if none, the first sample after b (NVML reports the period just ended)."""
    i, j = bisect.bisect_left(ts, a), bisect.bisect_right(ts, b)
    if j > i:
        return vs[i:j]
    return [vs[j]] if j < len(vs) and ts[j] - b < 1.0 else []


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _segments(flags: Sequence[bool], min_steps: int, max_gap: int = 2) -> list[tuple[int, int]]:
    """Index ranges [i, j] of runs of flagged steps, bridging gaps of up to `max_gap` unflagged steps."""
    out: list[tuple[int, int]] = []
    start = last = None
    for i, f in enumerate(flags):
        if not f:
            continue
        if start is None:
            start = last = i
        elif i - last - 1 <= max_gap:
            last = i
        else:
            out.append((start, last))
            start = last = i
    if start is not None:
        out.append((start, last))
    return [(a, b) for a, b in out if sum(flags[a : b + 1]) >= min_steps]


def _baseline_step(run: Run) -> float:
    """The job's healthy step: median busy time of warm steps (busy = not waiting on data, peers, disk)."""
    busy = [s.busy_seconds for s, w in zip(run.steps, run.warm, strict=True) if w] or [s.busy_seconds for s in run.steps]
    return statistics.median(busy) if busy else 0.0


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def _in_scope(scope: DiagnoseScope) -> bool:
    return scope.service is None or scope.job is not None


def _analyzer(name: str) -> Callable[[Callable[[Run, GpuView, DiagnoseScope], list[Finding]]], Callable]:
    """Register a per-run analyzer: it sees one rank of one job at a time."""

    def deco(fn: Callable[[Run, GpuView, DiagnoseScope], list[Finding]]) -> Callable:
        @register_analyzer(name)
        def run_all(reader: AnalysisReader, scope: DiagnoseScope) -> list[Finding]:
            if not _in_scope(scope):
                return []
            runs, views = _load(reader, scope)
            out: list[Finding] = []
            for run in runs:
                out.extend(fn(run, views.get((run.host, run.gpu), GpuView()), scope))
            return out

        return fn

    return deco


def _finding(kind: str, run: Run, a: int, b: int, severity: str, summary: str, evidence: dict, advice: list[str]) -> Finding:
    return Finding(kind, "training", run.steps[a].t_start, run.steps[b].t_end, severity, summary, evidence, list(advice), run.labels)  # type: ignore[arg-type]


def _util_over(view: GpuView, steps: Sequence[StepRecord]) -> float | None:
    if not view.util_t or not steps:
        return None
    return _mean(_window(view.util_t, view.util_v, steps[0].t_start, steps[-1].t_end))


# ------------------------------------------------------------------ waits: data and communication
def _wait_segments(run: Run, view: GpuView, attr: str, share: float) -> list[tuple[int, int, float, float]]:
    flags = []
    for s, warm in zip(run.steps, run.warm, strict=True):
        w = getattr(s, attr)
        flags.append(warm and w is not None and w >= MIN_WAIT_SECONDS and w / max(s.duration_seconds, 1e-9) >= share)
    out = []
    for a, b in _segments(flags, MIN_SEGMENT_STEPS):
        seg = run.steps[a : b + 1]
        wait = sum(getattr(s, attr) or 0.0 for s in seg)
        total = sum(s.duration_seconds for s in seg)
        out.append((a, b, wait / total if total else 0.0, statistics.median(s.duration_seconds for s in seg)))
    return out


@_analyzer("input_bound")
def input_bound(run: Run, view: GpuView, scope: DiagnoseScope) -> list[Finding]:
    """Steps that spend ≥ 25 % of their time waiting for the next batch: the GPU idles while the
    input pipeline catches up, so a faster GPU would not help."""
    base = _baseline_step(run)
    out = []
    for a, b, share, med in _wait_segments(run, view, "data_wait_s", INPUT_WAIT_SHARE):
        seg = run.steps[a : b + 1]
        util = _util_over(view, seg)
        ev = {
            "steps": len(seg),
            "data_wait_share": Q.ratio(_r(share)),
            "median_step_seconds": Q.seconds(_r(med, 4)),
            "baseline_busy_step_seconds": Q.seconds(_r(base, 4)),
            "step_time_vs_busy_baseline": Q.factor(_r(med / base, 2) if base else None),
            G.GPU_UTILIZATION_RATIO: Q.ratio(_r(util)),
        }
        sev = "critical" if share >= 0.5 else "warning"
        summary = (
            f"Input-bound: for {len(seg)} steps the loop waited for data {share:.0%} of the time "
            f"(median step {med:.3g} s against {base:.3g} s of actual work), so the GPU sat idle."
        )
        out.append(_finding("input_bound", run, a, b, sev, summary, ev, ADVICE_INPUT))
    return out


@_analyzer("comm_bound")
def comm_bound(run: Run, view: GpuView, scope: DiagnoseScope) -> list[Finding]:
    """Steps that spend ≥ 30 % of their time waiting on communication with other ranks."""
    out = []
    for a, b, share, med in _wait_segments(run, view, "comm_wait_s", COMM_WAIT_SHARE):
        seg = run.steps[a : b + 1]
        ev = {"steps": len(seg), "comm_wait_share": Q.ratio(_r(share)), "median_step_seconds": Q.seconds(_r(med, 4)), G.GPU_UTILIZATION_RATIO: Q.ratio(_r(_util_over(view, seg)))}
        summary = f"Communication-bound: for {len(seg)} steps rank {run.rank} waited on the other ranks {share:.0%} of the step time."
        out.append(_finding("comm_bound", run, a, b, "critical" if share >= 0.5 else "warning", summary, ev, ADVICE_COMM))
    return out


# ------------------------------------------------------------------ checkpoints
@_analyzer("checkpoint_stall")
def checkpoint_stall(run: Run, view: GpuView, scope: DiagnoseScope) -> list[Finding]:
    """Each checkpoint that stops the loop for longer than two healthy steps."""
    base = _baseline_step(run)
    threshold = max(CHECKPOINT_MIN_SECONDS, CHECKPOINT_VS_STEP * base)
    idx = [i for i, s in enumerate(run.steps) if (s.checkpoint_s or 0.0) >= threshold]
    if not idx:
        return []
    span = run.steps[-1].t_end - run.steps[0].t_start
    total_ckpt = sum(run.steps[i].checkpoint_s or 0.0 for i in idx)
    out = []
    for n, i in enumerate(idx):
        s = run.steps[i]
        ck = s.checkpoint_s or 0.0
        start = s.t_end - ck
        util = _mean(_window(view.util_t, view.util_v, start, s.t_end)) if view.util_t else None
        ev = {
            "checkpoint_seconds": Q.seconds(_r(ck, 3)),
            "steps_lost": _r(ck / base, 1) if base else None,
            "baseline_busy_step_seconds": Q.seconds(_r(base, 4)),
            "steps_since_previous_checkpoint": (i - idx[n - 1]) if n else None,
            "checkpoint_time_share": Q.ratio(_r(total_ckpt / span) if span > 0 else None),
            G.GPU_UTILIZATION_RATIO: Q.ratio(_r(util)),
        }
        sev = "warning" if ev["checkpoint_time_share"] and ev["checkpoint_time_share"] >= 0.05 else "info"
        summary = f"Checkpoint stall: saving a checkpoint stopped training for {ck:.2f} s (about {ck / base:.0f} steps of work)." if base else f"Checkpoint stall: saving a checkpoint stopped training for {ck:.2f} s."
        out.append(Finding("checkpoint_stall", "training", start, s.t_end, sev, summary, ev, list(ADVICE_CHECKPOINT), run.labels))  # type: ignore[arg-type]
    return out


# ------------------------------------------------------------------ the GPU is not used well
def _plain(s: StepRecord, base: float) -> bool:
    """A step that did not wait on data, peers or a checkpoint."""
    d = max(s.duration_seconds, 1e-9)
    return (
        (s.data_wait_s or 0.0) / d < INPUT_WAIT_SHARE
        and (s.comm_wait_s or 0.0) / d < COMM_WAIT_SHARE
        and (s.checkpoint_s or 0.0) < max(CHECKPOINT_MIN_SECONDS, CHECKPOINT_VS_STEP * base)
    )


@_analyzer("underutilized")
def underutilized(run: Run, view: GpuView, scope: DiagnoseScope) -> list[Finding]:
    """Steps that do not wait for anything and still leave the GPU mostly idle (utilization below
    40 % over the steps): the work per step is too small to fill the chip (small batch, many tiny
    kernels)."""
    if not view.util_t:
        return []
    base = _baseline_step(run)
    util: list[float | None] = []
    for s, warm in zip(run.steps, run.warm, strict=True):
        util.append(_mean(_window(view.util_t, view.util_v, s.t_start, s.t_end)) if warm and _plain(s, base) else None)
    # Smooth within runs of plain steps: NVML's utilization lags a sample behind the work.
    flags = []
    for i, u in enumerate(util):
        if u is None:
            flags.append(False)
            continue
        lo, hi = i, i
        while lo > 0 and util[lo - 1] is not None and i - lo < UTIL_SMOOTH_STEPS // 2:
            lo -= 1
        while hi + 1 < len(util) and util[hi + 1] is not None and hi - i < UTIL_SMOOTH_STEPS // 2:
            hi += 1
        flags.append(statistics.median([x for x in util[lo : hi + 1] if x is not None]) < LOW_GPU_UTILIZATION)
    out = []
    for a, b in _segments(flags, UNDERUTILIZED_MIN_STEPS, max_gap=1):
        seg = run.steps[a : b + 1]
        if seg[-1].t_end - seg[0].t_start < UNDERUTILIZED_MIN_SECONDS:
            continue
        u = _util_over(view, seg)
        tensor = _mean(_window(view.tensor_t, view.tensor_v, seg[0].t_start, seg[-1].t_end)) if view.tensor_t else None
        samples = [s.samples for s in seg if s.samples]
        tps = [s.tokens / s.duration_seconds for s in seg if s.tokens and s.duration_seconds > 0]
        best = [s.tokens / s.duration_seconds for s, w in zip(run.steps, run.warm, strict=True) if w and s.tokens and s.duration_seconds > 0]
        ev = {
            "steps": len(seg),
            G.GPU_UTILIZATION_RATIO: Q.ratio(_r(u)),
            F.TENSOR_ACTIVE_RATIO: Q.ratio(_r(tensor, 4)),
            "batch_size": statistics.median(samples) if samples else None,
            "largest_batch_size_in_run": max((s.samples or 0 for s in run.steps), default=None) or None,
            "tokens_per_second": Q.per_second(_r(statistics.median(tps), 0) if tps else None),
            "best_tokens_per_second_in_run": _r(max(best), 0) if best else None,
        }
        tensor_txt = f", tensor cores active {tensor:.0%} of the time" if tensor is not None else ""
        summary = f"Under-utilized: for {len(seg)} steps the GPU was busy only {u:.0%} of the time{tensor_txt}, and the loop was not waiting for data: each step gives the GPU too little work."
        out.append(_finding("underutilized", run, a, b, "warning", summary, ev, ADVICE_UNDERUTILIZED))
    return out


@_analyzer("throttled")
def throttled(run: Run, view: GpuView, scope: DiagnoseScope) -> list[Finding]:
    """The GPU slowed its clocks (NVML clock-event reasons) for most of a stretch of training."""
    if not view.clock or not run.steps:
        return []
    # Stretches of training: consecutive steps with no long gap.
    out = []
    for reason, (ts, vs) in view.clock.items():
        flags = [(_mean(_window(ts, vs, s.t_start, s.t_end)) or 0.0) >= THROTTLE_SHARE for s in run.steps]
        for a, b in _segments(flags, 1, max_gap=2):
            seg = run.steps[a : b + 1]
            dur = seg[-1].t_end - seg[0].t_start
            if dur < THROTTLE_MIN_SECONDS:
                continue
            share = _mean(_window(ts, vs, seg[0].t_start, seg[-1].t_end)) or 0.0
            ev = {"reason": reason, "active_share": Q.ratio(_r(share)), "seconds": Q.seconds(_r(dur, 1)), "steps": len(seg), "median_step_seconds": Q.seconds(_r(statistics.median(s.duration_seconds for s in seg), 4))}
            summary = f"Throttled: the GPU lowered its clocks ({reason.replace('_', ' ')}) during {share:.0%} of {dur:.0f} s of training."
            out.append(_finding("throttled", run, a, b, THROTTLE_REASONS[reason], summary, ev, ADVICE_THROTTLED))
    return out


# ------------------------------------------------------------------ memory
@_analyzer("memory_pressure")
def memory_pressure(run: Run, view: GpuView, scope: DiagnoseScope) -> list[Finding]:
    """Allocator peak or device memory in use above 92 % of the GPU's memory: one larger batch or
    a longer sequence away from an out-of-memory error."""
    total = view.mem_total_bytes
    if not total:
        return []
    flags = []
    for s in run.steps:
        peak = max(s.mem_peak or 0, s.mem_reserved or 0)
        used = max(_window(view.mem_used_t, view.mem_used_v, s.t_start, s.t_end), default=0.0) if view.mem_used_t else 0.0
        flags.append(max(peak, used) / total >= MEMORY_PRESSURE_SHARE)
    out = []
    for a, b in _segments(flags, 1, max_gap=5):
        seg = run.steps[a : b + 1]
        peak = max(max(s.mem_peak or 0, s.mem_reserved or 0) for s in seg)
        used = max(_window(view.mem_used_t, view.mem_used_v, seg[0].t_start, seg[-1].t_end), default=0.0) if view.mem_used_t else 0.0
        share = max(peak, used) / total
        ev = {"memory_share": Q.ratio(_r(share)), "allocator_peak_bytes": Q.bytes_(peak or None), "device_used_bytes": Q.bytes_(int(used) or None), "device_total_bytes": Q.bytes_(int(total)), "steps": len(seg)}
        other = W.largest_other_holder(view.processes, {s.pid for s in run.steps}, seg[0].t_start, seg[-1].t_end, W.OTHER_PROCESS_SHARE * total)
        if other is not None and peak / total < MEMORY_PRESSURE_SHARE:  # full, but not with the job's memory
            ev.update({"other_pid": other.pid, "other_process": other.process, "other_process_bytes": Q.bytes_(int(other.max_bytes))})
            own = f"the job's own allocator peak was {format_bytes(peak)} ({peak / total:.0%})" if peak else "the job reports no allocator peak"
            summary = f"Memory pressure: {share:.0%} of the GPU's memory was in use, but {own}: pid {other.pid} ({other.process or '?'}), not this job, held {format_bytes(other.max_bytes)} of it."
            out.append(_finding("memory_pressure", run, a, b, "warning", summary, ev, ADVICE_MEMORY_OTHER))
            continue
        summary = f"Memory pressure: the job used {share:.0%} of the GPU's memory; a slightly larger batch or sequence will run out of memory."
        out.append(_finding("memory_pressure", run, a, b, "warning", summary, ev, ADVICE_MEMORY))
    return out


@register_analyzer("oom")
def oom(reader: AnalysisReader, scope: DiagnoseScope) -> list[Finding]:
    """Every out-of-memory error the monitor recorded, with the allocator's numbers."""
    if not _in_scope(scope):
        return []
    labels = {N.TRAIN_JOB_LABEL: scope.job} if scope.job else None
    out = []
    for e in reader.event_rows(N.EV_TRAIN_OOM, start=scope.start, end=scope.end, match=labels):
        d = e.data
        keys = ("requested_bytes", "allocated_bytes", "reserved_bytes", "largest_free_block_bytes", "device_free_bytes", "step", "pid", "message")
        ev = {k: Q.bytes_(d[k]) if k.endswith("_bytes") and isinstance(d[k], int | float) else d[k]
              for k in keys if d.get(k) is not None}
        frag = ""
        if d.get("reserved_bytes") and d.get("allocated_bytes") is not None and d["reserved_bytes"] - d["allocated_bytes"] > 0.2 * d["reserved_bytes"]:
            frag = " Much reserved memory was free but fragmented: try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."
        summary = f"Out of memory at step {d.get('step', '?')}: the job asked for more GPU memory than was free.{frag}"
        out.append(Finding("oom", "training", e.t, e.t, "critical", summary, ev, list(ADVICE_MEMORY), dict(e.labels)))
    return out


# ------------------------------------------------------------------ loss
@register_analyzer("nan_loss")
def nan_loss(reader: AnalysisReader, scope: DiagnoseScope) -> list[Finding]:
    """A NaN or infinite loss: recorded by the monitor as an event, or seen in imported steps."""
    if not _in_scope(scope):
        return []
    labels = {N.TRAIN_JOB_LABEL: scope.job} if scope.job else None
    hits: dict[tuple[str, str, str], list[tuple[float, int | None]]] = defaultdict(list)
    for e in reader.event_rows(N.EV_TRAIN_NAN, start=scope.start, end=scope.end, match=labels):
        hits[(e.labels.get(N.TRAIN_JOB_LABEL, ""), e.labels.get("rank", "0"), e.labels.get("host", ""))].append((e.t, e.data.get("step")))
    runs, _ = _load(reader, scope)
    for run in runs:
        key = (run.job, run.rank, run.host)
        if key in hits:
            continue
        for s in run.steps:
            if s.loss is not None and not math.isfinite(s.loss):
                hits[key].append((s.t_end, s.step))
    out = []
    for (job, rank, host), items in hits.items():
        items.sort(key=lambda x: x[0])
        ev = {"nan_steps": len(items), "first_step": items[0][1], "last_step": items[-1][1]}
        summary = f"The loss became NaN or infinite {len(items)} time(s), first at step {items[0][1]}: training is diverging and the weights may be corrupt."
        out.append(Finding("nan_loss", "training", items[0][0], items[-1][0], "critical", summary, ev, list(ADVICE_NAN), {N.TRAIN_JOB_LABEL: job, "rank": rank, "host": host}))
    return out


# ------------------------------------------------------------------ ranks and regressions
@register_analyzer("straggler")
def straggler(reader: AnalysisReader, scope: DiagnoseScope) -> list[Finding]:
    """One rank computes much slower than the others (median busy step time ≥ 1.25 × the others'),
    so every synchronization waits for it."""
    if not _in_scope(scope):
        return []
    runs, _ = _load(reader, scope)
    by_job: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by_job[r.job].append(r)
    out = []
    for job, rs in by_job.items():
        if len(rs) < 2:
            continue
        busy = {r.rank: statistics.median([s.busy_seconds for s, w in zip(r.steps, r.warm, strict=True) if w] or [s.busy_seconds for s in r.steps]) for r in rs}
        slow = max(busy, key=busy.__getitem__)
        others = statistics.median(v for k, v in busy.items() if k != slow)
        if busy[slow] < STRAGGLER_RATIO * others or busy[slow] - others < STRAGGLER_MIN_SECONDS:
            continue
        waits = {r.rank: _r(statistics.median([s.comm_wait_s or 0.0 for s in r.steps]), 4) for r in rs}
        run = next(r for r in rs if r.rank == slow)
        ev = {"slow_rank": slow, "busy_step_seconds_by_rank": {k: Q.seconds(_r(v, 4)) for k, v in sorted(busy.items())},
              "comm_wait_seconds_by_rank": {k: Q.seconds(v) for k, v in sorted(waits.items())}, "slow_vs_others": Q.factor(_r(busy[slow] / others, 2) if others else None), "host": run.host}
        summary = f"Straggler: rank {slow} (host {run.host}) needs {busy[slow]:.3g} s of work per step against {others:.3g} s on the other ranks, so every rank waits for it."
        out.append(Finding("straggler", "training", min(r.steps[0].t_start for r in rs), max(r.steps[-1].t_end for r in rs), "warning", summary, ev, list(ADVICE_STRAGGLER), {N.TRAIN_JOB_LABEL: job, "rank": slow, "host": run.host}))
    return out


@_analyzer("step_time_regression")
def step_time_regression(run: Run, view: GpuView, scope: DiagnoseScope) -> list[Finding]:
    """A sustained stretch (≥ 8 steps) whose busy step time — not explained by waits or checkpoints
    — is ≥ 1.5 × the job's own baseline for the same batch size (its fast 20th percentile)."""
    by_batch: dict[int | None, list[int]] = defaultdict(list)
    for i, (s, w) in enumerate(zip(run.steps, run.warm, strict=True)):
        if w:
            by_batch[s.samples].append(i)
    out = []
    for batch, idx in by_batch.items():
        if len(idx) < 2 * REGRESSION_MIN_STEPS:
            continue
        busy = [run.steps[i].busy_seconds for i in idx]
        base = (percentile(busy, 20) or 0.0) if len(busy) >= 5 else min(busy)
        if base <= 0:
            continue
        half = REGRESSION_WINDOW // 2
        smooth = [statistics.median(busy[max(0, k - half) : k + half + 1]) for k in range(len(busy))]
        flags = [v >= REGRESSION_RATIO * base for v in smooth]
        for a, b in _segments(flags, REGRESSION_MIN_STEPS, max_gap=1):
            seg = [run.steps[i] for i in idx[a : b + 1]]
            med = statistics.median(s.busy_seconds for s in seg)
            ev = {"steps": len(seg), "busy_step_seconds": Q.seconds(_r(med, 4)), "baseline_busy_step_seconds": Q.seconds(_r(base, 4)), "ratio": Q.factor(_r(med / base, 2)), "batch_size": batch, G.GPU_UTILIZATION_RATIO: Q.ratio(_r(_util_over(view, seg)))}
            summary = f"Step-time regression: {len(seg)} steps took {med / base:.1f}× the job's baseline ({med:.3g} s against {base:.3g} s) with no data, communication or checkpoint wait to explain it."
            out.append(Finding("step_time_regression", "training", seg[0].t_start, seg[-1].t_end, "warning", summary, ev, list(ADVICE_REGRESSION), run.labels))  # type: ignore[arg-type]
    return out
