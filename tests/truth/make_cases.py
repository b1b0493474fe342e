"""Write the truth suite's recordings (tests/truth/cases/NAME/) and their truth.json.

Each case is planned first (what happens, where, when, to whom), and both the recording and the
truth file are written from that plan, never from what gpulens says about the recording. Output is
deterministic (seeded), committed beside this script: run `python tests/truth/make_cases.py` to
rebuild it after changing a plan, and review the diff of truth.json like code.

Formats are the ones `gpulens replay` reads: the H200 session's (telemetry.jsonl + events.jsonl)
for edited slices of the real recording, gpulens's own recording (recording.jsonl: a header, then
one line per GPU sample or XID) for synthetic multi-GPU cases. Workload records follow
docs/training.md and docs/inference.md (train_start, train_step, request).
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CASES = HERE / "cases"
_SHARED_H200 = HERE.parents[1].parent / "shared" / "data" / "h200-trace"
# the real session: ../shared/data beside the clone, else the copy bundled with gpulens (the same files)
H200 = _SHARED_H200 if _SHARED_H200.is_dir() else HERE.parents[1] / "src" / "gpulens" / "data" / "h200-trace"

T0 = 1796100000.0  # synthetic cases start here (unix seconds, December 2026)
GB = 1e9
MEM_TOTAL_BYTES = 150_754_820_096  # H200, as NVML reports it (the bundled session)
SM_MAX_HZ = 1.98e9
SLOWDOWN_C, SHUTDOWN_C = 89.0, 95.0  # the bundled H200's thresholds
IDLE, HW_THERMAL, HW_POWER_BRAKE = 0x1, 0x40, 0x80


def _r(x: float, nd: int = 4) -> float:
    return round(x, nd)


# ------------------------------------------------------------------ GPUs
@dataclass
class Gpu:
    """One synthetic GPU: a timeline of what it did, sampled at 1 Hz."""

    index: int
    util: dict[int, float] = field(default_factory=dict)  # second -> utilization 0..1
    procs: dict[int, list[tuple[int, str, float]]] = field(default_factory=dict)  # second -> (pid, name, bytes)
    mask: dict[int, int] = field(default_factory=dict)  # second -> clock-event mask
    sm_hz: dict[int, float] = field(default_factory=dict)
    temp_c: dict[int, float] = field(default_factory=dict)
    silent_from: int | None = None  # from this second on, no sample

    @property
    def uuid(self) -> str:
        return f"GPU-truth-{self.index:04d}"

    def sample(self, sec: int) -> dict[str, Any] | None:
        if self.silent_from is not None and sec >= self.silent_from:
            return None
        util = self.util.get(sec, 0.0)
        procs = self.procs.get(sec, [])
        used = 0.6 * GB + sum(b for _, _, b in procs)
        busy = util > 0.05
        mask = self.mask.get(sec, 0 if busy or procs else IDLE)
        return {  # static facts (limits, shutdown temperature, max clock) are in the header only
            "type": "sample", "t": T0 + sec, "gpu": self.index, "uuid": self.uuid,
            "utilization_gpu_ratio": _r(util, 3), "memory_used_bytes": float(int(used)), "memory_total_bytes": float(MEM_TOTAL_BYTES),
            "temperature_celsius": self.temp_c.get(sec, 38.0 + 22.0 * util), "temperature_slowdown_celsius": SLOWDOWN_C,
            "power_watts": round(90.0 + 560.0 * util), "sm_clock_hz": self.sm_hz.get(sec, SM_MAX_HZ if busy else 345e6),
            "clock_event_mask": mask,
            "processes": [{"pid": p, "name": n, "used_memory_bytes": int(b)} for p, n, b in procs],
        }


def write_recording(folder: Path, gpus: list[Gpu], seconds: int, xids: list[tuple[float, int, int]] = (), host: str | None = None) -> None:
    """recording.jsonl in gpulens's format; `host` goes into the header (today's replay ignores it)."""
    header: dict[str, Any] = {"format": "gpulens-recording", "version": 1, "backend": "truth-suite", "gpus": [
        {"index": g.index, "uuid": g.uuid, "name": "NVIDIA H200", "memory_total_bytes": MEM_TOTAL_BYTES,
         "temperature_slowdown_celsius": SLOWDOWN_C, "temperature_shutdown_celsius": SHUTDOWN_C,
         "sm_clock_max_hz": SM_MAX_HZ, "power_limit_watts": 700.0} for g in gpus]}
    if host:
        header["host"] = host
    lines = [header]
    pending = sorted(xids)
    for sec in range(seconds + 1):
        while pending and pending[0][0] <= T0 + sec:
            t, gi, code = pending.pop(0)
            lines.append({"type": "xid", "t": t, "gpu": gi, "uuid": gpus[gi].uuid, "xid": code})
        lines.extend(s for g in gpus if (s := g.sample(sec)) is not None)
    _write_jsonl(folder / "recording.jsonl", lines)


# ------------------------------------------------------------------ workloads
def _event_t(e: dict[str, Any]) -> float:
    return float(e.get("t_end", e.get("end", e.get("t", 0.0))))


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows), encoding="utf-8")


def write_events(folder: Path, events: list[dict[str, Any]]) -> None:
    _write_jsonl(folder / "events.jsonl", sorted(events, key=_event_t))


@dataclass
class Rank:
    job: str
    rank: int
    pid: int
    gpu: Gpu
    cuda_gpu: int | None  # what train_start says (a CUDA index: 0 for every rank under CUDA_VISIBLE_DEVICES)
    host: str | None = None
    stops_at: float | None = None  # its last step ends before this (a crash, a hang)
    mem_bytes: float = 24 * GB


Work = Callable[[Rank, float], tuple[float, float]]  # (data wait, compute) of a step starting at t


def train_job(ranks: list[Rank], t0: float, t1: float, work: Work, *, sync: bool = True, comm_s: float = 0.03) -> list[dict[str, Any]]:
    """Steps of a data-parallel job. With `sync`, a step ends when the slowest rank is done and every
    other rank waits for it in communication (as DDP's all-reduce does); without, ranks step alone.
    Fills each rank's GPU with its utilization and process listing, second by second."""
    events: list[dict[str, Any]] = []
    for r in ranks:
        events.append({"kind": "train_start", "t": t0 - 1.0, "job": r.job, "rank": r.rank, "world_size": len(ranks), "pid": r.pid,
                       "gpu": r.cuda_gpu, "gpu_name": "NVIDIA H200", **({"host": r.host} if r.host else {})})
    clocks = {r.rank: t0 for r in ranks}
    step = 0
    while True:
        alive = [r for r in ranks if r.stops_at is None or clocks[r.rank] < r.stops_at]
        alive = [r for r in alive if clocks[r.rank] < t1]
        if not alive:
            break
        if sync:
            start = max(clocks[r.rank] for r in alive)
            parts = {r.rank: work(r, start) for r in alive}
            step_s = max(d + c for d, c in parts.values()) + comm_s
            plan = [(r, start, parts[r.rank], step_s) for r in alive]
        else:
            plan = []
            for r in alive:
                d, c = work(r, clocks[r.rank])
                plan.append((r, clocks[r.rank], (d, c), d + c + comm_s))
        for r, start, (d, c), step_s in plan:
            if r.stops_at is not None and start + step_s > r.stops_at:
                clocks[r.rank] = r.stops_at
                continue
            end = start + step_s
            events.append({"kind": "train_step", "job": r.job, "rank": r.rank, "pid": r.pid, "step": step,
                           "t_start": _r(start), "t_end": _r(end), "step_s": _r(step_s), "data_wait_s": _r(d), "compute_s": _r(c),
                           "comm_wait_s": _r(step_s - d - c), "checkpoint_s": 0.0, "batch": 8, "tokens": 16384,
                           "loss": _r(2.5 - 0.001 * step), "mem_peak": int(r.mem_bytes),
                           **({"host": r.host} if r.host else {})})
            for sec in range(int(start - T0), int(end - T0) + 1):
                r.gpu.util[sec] = max(r.gpu.util.get(sec, 0.0), min(0.97, c / step_s))
            clocks[r.rank] = end
        step += 1
    for r in ranks:  # the process holds its memory from start to its last moment (a hung one stays listed)
        last = t1 if r.stops_at is None or r.stops_at >= t1 else r.stops_at
        for sec in range(int(t0 - T0) - 1, int(last - T0) + 1):
            r.gpu.procs.setdefault(sec, []).append((r.pid, "python", r.mem_bytes * 1.1))
    return events


@dataclass
class Service:
    name: str
    pid: int
    gpu: Gpu
    slots: int = 8  # concurrent sequences (continuous batching)
    tpot_s: float = 0.012
    prefill_s: float = 0.08
    util_busy: float = 0.6  # GPU utilization while a request is in service
    mem_bytes: float = 30 * GB
    process: str = "python"


def serve(svc: Service, t0: float, t1: float, rate_per_s: float, rng: random.Random, *,
          slow: Callable[[float], float] = lambda t: 1.0, fail_after: float | None = None, stop_at: float | None = None,
          with_service_field: bool = True) -> list[dict[str, Any]]:
    """Poisson arrivals into `slots` servers; `slow(t)` stretches the service time of a request that
    starts at t; requests arriving after `fail_after` fail at once (the GPU is gone), none after `stop_at`."""
    events, free = [], [t0] * svc.slots
    t = t0
    while True:
        t += rng.expovariate(rate_per_s)
        if t >= t1 or (stop_at is not None and t >= stop_at):
            break
        prompt, out = rng.randint(200, 800), rng.randint(40, 160)
        if fail_after is not None and t >= fail_after:
            rec = {"kind": "request", "arrival": _r(t), "start": _r(t), "end": _r(t + 0.004), "status": "error",
                   "prompt_tokens": prompt, "output_tokens": 0, "pid": svc.pid, "queue_depth_at_start": 0}
        else:
            i = min(range(svc.slots), key=free.__getitem__)
            start = max(t, free[i])
            k = slow(start)
            first = start + svc.prefill_s * k
            end = first + out * svc.tpot_s * k
            free[i] = end
            depth = sum(1 for f in free if f > t) - 1
            rec = {"kind": "request", "arrival": _r(t), "start": _r(start), "first_token": _r(first), "end": _r(end), "status": "ok",
                   "prompt_tokens": prompt, "output_tokens": out, "tpot_s": _r(svc.tpot_s * k, 5), "pid": svc.pid,
                   "queue_depth_at_start": max(0, depth)}
            for sec in range(int(start - T0), int(end - T0) + 1):
                svc.gpu.util[sec] = min(0.97, svc.util_busy * (1.0 if k <= 1 else min(1.5, k)))
        if with_service_field:
            rec["service"] = svc.name
        rec["model"] = "llama-8b"
        events.append(rec)
    last = t1 if stop_at is None else stop_at
    for sec in range(int(t0 - T0) - 5, int(last - T0) + 1):
        svc.gpu.procs.setdefault(sec, []).append((svc.pid, svc.process, svc.mem_bytes))
    return events


def steady(data_s: float = 0.01, compute_s: float = 0.8) -> Work:
    return lambda r, t: (data_s, compute_s)


# ------------------------------------------------------------------ truth
def incident(id_: str, root_cause: str, cause_kinds: list[str], place: dict[str, str], span: tuple[float, float],
             workloads: list[str], *, symptoms: list[str] = (), affects: dict[str, list[str]] | None = None,
             must_mention: list[str] = (), also_reported: list[str] = (), note: str = "") -> dict[str, Any]:
    return {"id": id_, "root_cause": root_cause, "cause_kinds": list(cause_kinds), "place": place,
            "span": [_r(span[0], 3), _r(span[1], 3)], "workloads": sorted(workloads), "symptoms": list(symptoms),
            "affects": affects or {"jobs": [], "services": []}, "must_mention": list(must_mention),
            "also_reported": list(also_reported), "note": note}


GPU_THERMAL_KINDS = ["gpu_clock_cut", "throttled", "gpu_temperature_high"]
SILENCE_KINDS = ["gpu_lost", "gpu_silent", "gpu_stale", "gpu_absent", "gpu_no_samples"]


def write_truth(folder: Path, *, made: str, incidents: list[dict[str, Any]], replay_args: list[str] = (),
                diagnose_args: list[str] = (), one_incident: bool = False) -> None:
    truth = {"case": folder.name, "made": made, "healthy": not incidents, "one_incident": one_incident,
             "replay_args": list(replay_args), "diagnose_args": list(diagnose_args), "incidents": incidents}
    (folder / "truth.json").write_text(json.dumps(truth, indent=2) + "\n", encoding="utf-8")


def fresh(name: str) -> Path:
    folder = CASES / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


# ------------------------------------------------------------------ cases from the H200 session
def _h200_slice(phase: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    tel = [json.loads(x) for x in (H200 / "telemetry.jsonl").read_text().splitlines() if x.strip()]
    ev = [json.loads(x) for x in (H200 / "events.jsonl").read_text().splitlines() if x.strip()]
    return [t for t in tel if t.get("phase") == phase], [e for e in ev if e.get("phase") == phase and e["kind"] == "train_step"]


def _copy_h200(folder: Path, tel: list[dict[str, Any]], ev: list[dict[str, Any]]) -> None:
    _write_jsonl(folder / "telemetry.jsonl", tel)
    _write_jsonl(folder / "events.jsonl", ev)
    shutil.copy(H200 / "nvml_probe.json", folder / "nvml_probe.json")


def healthy_training() -> None:
    folder = fresh("healthy_training")
    tel, ev = _h200_slice("train_normal")
    _copy_h200(folder, tel, ev)
    write_truth(folder, made="The H200 session's train_normal phase, unchanged (batch 8 x 1024, ~0.10 s a step, "
                "GPU ~98 % busy): the session's README calls it the healthy baseline.", incidents=[],
                replay_args=["--job", "h200-demo"])


def stale_process_memory() -> None:
    folder = fresh("stale_process_memory")
    tel, ev = _h200_slice("train_normal")
    job_pid, stale_pid, stale_bytes = 51234, 4242, 119.5 * GB
    for t in tel:  # a process left over from an earlier run holds 119.5 GB beside the job
        job_bytes = t["mem_used"] - 0.6 * GB
        t["procs"] = [{"pid": job_pid, "name": "python", "used_memory_bytes": int(job_bytes)},
                      {"pid": stale_pid, "name": "python", "used_memory_bytes": int(stale_bytes)}]
        t["mem_used"] = int(t["mem_used"] + stale_bytes)
    for e in ev:
        e["pid"] = job_pid
    _copy_h200(folder, tel, ev)
    span = (ev[0]["t_start"], ev[-1]["t_end"])
    write_truth(folder, made="The H200 session's train_normal phase (allocator peak 23.3 GB), with a second process (pid 4242) "
                "holding 119.5 GB of the GPU added to every sample's process list and to memory used.", one_incident=True,
                incidents=[incident("stale-4242", "stale_process_memory", ["stale_process_memory", "other_process_memory", "foreign_process_memory", "gpu_memory_full"],
                                    {"gpu": "0", "train_job": "h200-demo", "rank": "0"}, span, ["job h200-demo rank 0"],
                                    symptoms=["memory_pressure"], affects={"jobs": ["h200-demo"], "services": []}, must_mention=[str(stale_pid)],
                                    note="The job's own peak is 23.3 GB of 150.8 GB: the memory is pid 4242's, and the report must name it.")],
                replay_args=["--job", "h200-demo"])


# ------------------------------------------------------------------ synthetic training cases
def straggler_thermal_gpu() -> None:
    folder = fresh("straggler_thermal_gpu")
    gpus = [Gpu(i) for i in range(4)]
    ranks = [Rank("llama-ft", i, 7000 + i, gpus[i], i) for i in range(4)]
    hot_from, end = 30, 120
    for sec in range(hot_from, end + 1):  # GPU 2 overheats: hardware thermal slowdown, SM clock 1.1 GHz
        gpus[2].mask[sec], gpus[2].sm_hz[sec], gpus[2].temp_c[sec] = HW_THERMAL, 1.1e9, 91.0
    ev = train_job(ranks, T0 + 2, T0 + end, lambda r, t: (0.01, 0.8 * (1.62 if r.rank == 2 and t >= T0 + hot_from else 1.0)))
    write_recording(folder, gpus, end + 2)
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: 4-rank DDP job, rank i on GPU i (pids in the process list, train_start names each rank's GPU). "
                "From +30 s GPU 2 runs under hardware thermal slowdown (mask 0x40, 91 C, SM 1.1 GHz), so rank 2's compute takes 1.62x "
                "and ranks 0, 1, 3 wait for it in the all-reduce.", one_incident=True,
                incidents=[incident("thermal-gpu2", "gpu_thermal", GPU_THERMAL_KINDS, {"gpu": "2", "train_job": "llama-ft", "rank": "2"},
                                    (T0 + hot_from, T0 + end), ["job llama-ft rank 2"], symptoms=["straggler", "comm_bound", "step_time_regression"],
                                    affects={"jobs": ["llama-ft"], "services": []},
                                    note="Ranks 0, 1, 3 only wait for rank 2: their comm wait is a symptom, not a communication problem.")],
                replay_args=["--job", "llama-ft"])


def straggler_dataloader() -> None:
    folder = fresh("straggler_dataloader")
    gpus = [Gpu(i) for i in range(4)]
    ranks = [Rank("llama-ft", i, 7100 + i, gpus[i], i) for i in range(4)]
    slow_from, end = 20, 100
    ev = train_job(ranks, T0 + 2, T0 + end, lambda r, t: (0.45 if r.rank == 1 and t >= T0 + slow_from else 0.01, 0.8))
    write_recording(folder, gpus, end + 2)
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: 4-rank DDP job, healthy GPUs. From +20 s rank 1's data loader needs 0.45 s a batch "
                "(data_wait_s), its compute is unchanged; the other ranks wait for it in the all-reduce.",
                incidents=[incident("input-rank1", "input_bound_rank", ["input_bound"], {"train_job": "llama-ft", "rank": "1"},
                                    (T0 + slow_from, T0 + end), ["job llama-ft rank 1"], symptoms=["straggler", "comm_bound", "step_time_regression", "underutilized"],
                                    affects={"jobs": ["llama-ft"], "services": []},
                                    note="No GPU cause: the cause is rank 1's input pipeline; the others' comm wait is its symptom.")],
                replay_args=["--job", "llama-ft"])


def silent_rank() -> None:
    folder = fresh("silent_rank")
    gpus = [Gpu(i) for i in range(4)]
    ranks = [Rank("sweep", i, 7200 + i, gpus[i], i) for i in range(4)]
    hang, end = 60, 120
    ranks[3].stops_at = T0 + hang
    ev = train_job(ranks, T0 + 2, T0 + end, steady(), sync=False)
    for sec in range(hang, end + 1):  # the hung process keeps its memory and its place in the process list
        gpus[3].procs.setdefault(sec, []).append((ranks[3].pid, "python", ranks[3].mem_bytes * 1.1))
    write_recording(folder, gpus, end + 2)
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: 4 independent workers of job 'sweep' (no collective), one per GPU. Rank 3 hangs at +60 s: "
                "no step after it while its process stays in GPU 3's process list and the other ranks go on.",
                incidents=[incident("silent-rank3", "silent_rank", ["silent_rank", "rank_silent", "rank_stopped", "workload_silent", "stalled_rank"],
                                    {"gpu": "3", "train_job": "sweep", "rank": "3"}, (T0 + hang, T0 + end), ["job sweep rank 3"],
                                    affects={"jobs": ["sweep"], "services": []})],
                replay_args=["--job", "sweep"])


def faults_one_of_eight() -> None:
    folder = fresh("faults_one_of_eight")
    gpus = [Gpu(i) for i in range(8)]
    # every rank sees its GPU as cuda:0 (CUDA_VISIBLE_DEVICES per rank): only the process list places it
    ranks = [Rank("pretrain", i, 7300 + i, gpus[i], 0) for i in range(8)]
    hot, cool, crash, end = 20, 50, 80, 100
    for sec in range(hot, cool):
        gpus[5].mask[sec], gpus[5].sm_hz[sec], gpus[5].temp_c[sec] = HW_THERMAL, 1.2e9, 90.0
    for r in ranks:  # the double-bit ECC error kills rank 5; the job dies with it
        r.stops_at = T0 + crash
    ev = train_job(ranks, T0 + 2, T0 + end, lambda r, t: (0.01, 0.8 * (1.5 if r.rank == 5 and T0 + hot <= t < T0 + cool else 1.0)))
    write_recording(folder, gpus, end, xids=[(T0 + crash + 0.2, 5, 48)])
    write_events(folder, ev)
    job = {"jobs": ["pretrain"], "services": []}
    write_truth(folder, made="Synthetic: 8-rank DDP job 'pretrain', rank i on GPU i, every train_start saying cuda:0 (as under "
                "CUDA_VISIBLE_DEVICES); the process list places the ranks. GPU 5 runs under hardware thermal slowdown from +20 s to "
                "+50 s (rank 5 1.5x slower, the others wait); at +80.2 s XID 48 (double-bit ECC) on GPU 5, the job's last steps end before it.",
                incidents=[
                    incident("thermal-gpu5", "gpu_thermal", GPU_THERMAL_KINDS, {"gpu": "5", "train_job": "pretrain", "rank": "5"}, (T0 + hot, T0 + cool),
                             ["job pretrain rank 5"], symptoms=["straggler", "comm_bound", "step_time_regression"], affects=job),
                    incident("xid48-gpu5", "gpu_xid", ["gpu_xid", "gpu_ecc_uncorrectable"], {"gpu": "5"}, (T0 + crash, T0 + end),
                             ["job pretrain rank 5"], affects=job,
                             note="Only rank 5 ran on GPU 5; the other seven GPUs are healthy."),
                ], replay_args=["--job", "pretrain"])


def xid79_gpu_silent() -> None:
    folder = fresh("xid79_gpu_silent")
    gpus = [Gpu(0), Gpu(1)]
    fall, end = 60, 120
    rank = Rank("ft", 0, 7400, gpus[1], 1, stops_at=T0 + fall)
    ev = train_job([rank], T0 + 2, T0 + end, steady())
    gpus[1].silent_from = fall + 1  # fallen off the bus: NVML answers nothing for it any more
    write_recording(folder, gpus, end, xids=[(T0 + fall + 0.3, 1, 79)])
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: 2 GPUs; job 'ft' (one rank) on GPU 1, GPU 0 idle. XID 79 on GPU 1 at +60.3 s; "
                "from +61 s GPU 1 sends no sample at all (no gpu_up = 0 either) while GPU 0 goes on; the job's steps stop.",
                incidents=[incident("xid79-gpu1", "gpu_lost", ["gpu_xid", *SILENCE_KINDS], {"gpu": "1"}, (T0 + fall, T0 + end), ["job ft rank 0"],
                                    affects={"jobs": ["ft"], "services": []}, also_reported=SILENCE_KINDS,
                                    note="The silence after the XID must be reported too (a finding of a silence kind on GPU 1).")],
                replay_args=["--job", "ft"])


def xid_idle_between_jobs() -> None:
    folder = fresh("xid_idle_between_jobs")
    gpu = Gpu(0)
    a_end, xid_t, b_start, end = 60, 75.0, 90, 150
    ev = train_job([Rank("job-a", 0, 7500, gpu, 0)], T0 + 2, T0 + a_end, steady())
    ev += train_job([Rank("job-b", 0, 7501, gpu, 0)], T0 + b_start, T0 + end, steady())
    write_recording(folder, [gpu], end, xids=[(T0 + xid_t, 0, 94)])
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: one GPU; job-a runs +2..+60 s and exits, job-b starts at +89 s (train_start) and steps "
                "from +90 s. XID 94 (contained ECC error) at +75 s, while no process was on the GPU (empty process list).",
                incidents=[incident("xid94-idle", "gpu_xid", ["gpu_xid"], {"gpu": "0"}, (T0 + xid_t, T0 + xid_t), [],
                                    note="No workload was on the GPU: the report must name neither job.")])


def events_with_host() -> None:
    folder = fresh("events_with_host")
    gpu = Gpu(0)
    hot, end = 40, 120
    for sec in range(hot, end + 1):
        gpu.mask[sec], gpu.sm_hz[sec], gpu.temp_c[sec] = HW_THERMAL, 1.1e9, 91.0
    ev = train_job([Rank("ft", 0, 7600, gpu, 0, host="node-a")], T0 + 2, T0 + end, lambda r, t: (0.01, 0.8 * (1.6 if t >= T0 + hot else 1.0)))
    write_recording(folder, [gpu], end + 2, host="node-a")
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: one GPU on host node-a (the recording's header says so); job 'ft' whose records carry "
                "host node-a, as docs/training.md allows. From +40 s hardware thermal slowdown: its steps take 1.6x.",
                incidents=[incident("thermal-node-a", "gpu_thermal", GPU_THERMAL_KINDS, {"host": "node-a", "gpu": "0", "train_job": "ft", "rank": "0"},
                                    (T0 + hot, T0 + end), ["job ft rank 0"], symptoms=["step_time_regression"], affects={"jobs": ["ft"], "services": []},
                                    note="The slower steps are explained by the GPU: no 'roll it back' advice.")],
                replay_args=["--job", "ft"])


# ------------------------------------------------------------------ synthetic serving cases
def power_brake_serving() -> None:
    folder = fresh("power_brake_serving")
    gpu = Gpu(0)
    rng = random.Random(23)
    brake_from, brake_to, end = 60, 110, 150
    for sec in range(brake_from, brake_to):
        gpu.mask[sec], gpu.sm_hz[sec] = HW_POWER_BRAKE, 0.99e9
    svc = Service("chat", 8100, gpu)
    ev = serve(svc, T0 + 2, T0 + end, 3.0, rng, slow=lambda t: 1.7 if T0 + brake_from <= t < T0 + brake_to else 1.0)
    write_recording(folder, [gpu], end + 2)
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: service 'chat' (pid 8100, 8 slots) at 3 requests/s on one GPU, ~60 % busy while serving. "
                "From +60 s to +110 s the board asserts the power brake (mask 0x80, SM 990 MHz) and every request started then takes 1.7x.",
                one_incident=True,
                incidents=[incident("brake-gpu0", "gpu_power_brake", ["gpu_clock_cut"], {"gpu": "0", "service": "chat"}, (T0 + brake_from, T0 + brake_to),
                                    ["service chat"], symptoms=["slo_violation", "queueing", "latency_bound_low_utilization", "timeouts"],
                                    affects={"jobs": [], "services": ["chat"]},
                                    note="The higher p99 is the brake's: latency advice must not say 'not the GPU' or 'fewer replicas'.")],
                replay_args=["--service", "chat"], diagnose_args=["--slo", "p99_latency<=2.5s"])


def two_services_one_gpu_dies() -> None:
    folder = fresh("two_services_one_gpu_dies")
    gpus = [Gpu(0), Gpu(1)]
    rng = random.Random(7)
    fall, end = 70, 130
    chat, embed = Service("chat", 8200, gpus[0]), Service("embed", 8201, gpus[1], tpot_s=0.004)
    ev = serve(chat, T0 + 2, T0 + end, 3.0, rng) + serve(embed, T0 + 2, T0 + end, 3.0, rng, fail_after=T0 + fall, stop_at=T0 + fall + 30)
    gpus[1].silent_from = fall + 1
    write_recording(folder, gpus, end, xids=[(T0 + fall + 0.2, 1, 79)])
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: service 'chat' on GPU 0 and 'embed' on GPU 1, each request record carrying its service and "
                "pid. XID 79 on GPU 1 at +70.2 s, then no sample from it; embed's requests fail at once for 30 s, then stop; chat is untouched.",
                incidents=[incident("xid79-gpu1", "gpu_lost", ["gpu_xid", *SILENCE_KINDS], {"gpu": "1", "service": "embed"}, (T0 + fall, T0 + end),
                                    ["service embed"], symptoms=["error_rate", "timeouts"], affects={"jobs": [], "services": ["embed"]},
                                    also_reported=SILENCE_KINDS, note="Only embed was hit; chat's requests must not be counted with embed's.")])


def engine_preallocates() -> None:
    folder = fresh("engine_preallocates")
    gpu = Gpu(0)
    rng = random.Random(11)
    end = 150
    svc = Service("chat", 8300, gpu, slots=32, util_busy=0.55, mem_bytes=0.92 * MEM_TOTAL_BYTES - 0.6 * GB, process="vllm")
    ev = serve(svc, T0 + 2, T0 + end, 1.0, rng)
    for sec in range(0, end, 5):  # the engine's own view: the KV cache is a quarter used, nothing waits or is preempted
        ev.append({"kind": "engine_stats", "t": T0 + sec + 0.5, "service": "chat", "engine": "vllm", "pid": svc.pid,
                   "kv_cache_usage_ratio": _r(0.18 + 0.1 * rng.random(), 3), "num_requests_running": rng.randint(1, 4),
                   "num_requests_waiting": 0, "num_preemptions_total": 0})
    write_recording(folder, [gpu], end + 2)
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: a vLLM-style engine (process 'vllm', pid 8300) that pre-allocates 92 % of the GPU at start, "
                "serving 1 request/s (a quarter of its capacity) with healthy latency; its engine_stats records say the KV cache is "
                "18-28 % used, nothing waits, nothing is preempted.", incidents=[], replay_args=["--service", "chat"])


def healthy_serving() -> None:
    folder = fresh("healthy_serving")
    gpu = Gpu(0)
    svc = Service("chat", 8400, gpu)
    ev = serve(svc, T0 + 2, T0 + 150, 3.0, random.Random(5))
    write_recording(folder, [gpu], 152)
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: service 'chat' at 3 requests/s into 8 slots (no queue), GPU ~60 % busy while serving, "
                "memory 30 GB, no clock event, no error.", incidents=[], replay_args=["--service", "chat"])


def _training_and_serving(folder: Path, *, burst: bool) -> list[dict[str, Any]]:
    gpus = [Gpu(0), Gpu(1)]
    ev = train_job([Rank("trainer", 0, 8500, gpus[0], 0)], T0 + 2, T0 + 150, steady())
    svc = Service("chat", 8501, gpus[1])
    rng = random.Random(3)
    ev += serve(svc, T0 + 2, T0 + 150, 3.0, rng)
    if burst:  # an overload burst: arrivals at 4x what 8 slots complete
        ev += serve(Service("chat", 8501, gpus[1], slots=1), T0 + 60, T0 + 90, 12.0, rng)
    write_recording(folder, gpus, 152)
    write_events(folder, ev)
    return ev


def healthy_training_and_serving() -> None:
    folder = fresh("healthy_training_and_serving")
    _training_and_serving(folder, burst=False)
    write_truth(folder, made="Synthetic: job 'trainer' (one rank) on GPU 0 and service 'chat' on GPU 1, on one host; both healthy "
                "(steady 0.84 s steps, no queue).", incidents=[], replay_args=["--job", "trainer", "--service", "chat"])


def job_scope_excludes_service() -> None:
    folder = fresh("job_scope_excludes_service")
    _training_and_serving(folder, burst=True)
    write_truth(folder, made="The healthy training-and-serving recording with an overload burst on service 'chat' (GPU 1) from "
                "+60 s to +90 s. Diagnosed with --job trainer: the job is healthy and the service's queueing did not touch it, "
                "so the report for the job must be empty.", incidents=[], replay_args=["--job", "trainer", "--service", "chat"],
                diagnose_args=["--job", "trainer"])


ALL = (healthy_training, stale_process_memory, straggler_thermal_gpu, straggler_dataloader, silent_rank, faults_one_of_eight,
       xid79_gpu_silent, xid_idle_between_jobs, events_with_host, power_brake_serving, two_services_one_gpu_dies,
       engine_preallocates, healthy_serving, healthy_training_and_serving, job_scope_excludes_service)


def main() -> None:
    for make in ALL:
        make()
    size = sum(p.stat().st_size for p in CASES.rglob("*") if p.is_file())
    print(f"wrote {len(ALL)} cases under {CASES} ({size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
