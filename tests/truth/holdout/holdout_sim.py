"""The held-out set's own simulator: GPU boards sampled at 1 Hz, data-parallel training with jitter,
checkpoints and evaluations, and continuous-batching services with time-varying load.

Written apart from tests/truth/make_cases.py (only the file formats are shared: gpulens's
recording.jsonl, events.jsonl with docs/training.md and docs/inference.md records, truth.json as
tests/truth/README.md defines it), so the held-out set does not inherit the dev set's quirks: steps
and requests carry noise, GPUs are H100s as well as H200s, temperature and power wander.
"""

from __future__ import annotations

import bisect
import json
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

T0 = 1798300000.0  # the held-out recordings start here (unix seconds, December 2026)
GB = 1e9
IDLE, SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = 0x1, 0x4, 0x8, 0x20, 0x40, 0x80


def r4(x: float, nd: int = 4) -> float:
    return round(x, nd)


@dataclass(frozen=True)
class Model:
    """A GPU model's static facts, as a recording's header states them."""

    name: str
    memory_total_bytes: int
    slowdown_c: float
    shutdown_c: float
    sm_max_hz: float
    power_limit_w: float


H100 = Model("NVIDIA H100 80GB HBM3", 85_520_809_984, 87.0, 92.0, 1.98e9, 700.0)
H200 = Model("NVIDIA H200", 150_754_820_096, 89.0, 95.0, 1.98e9, 700.0)


@dataclass
class Board:
    """One GPU's timeline (second -> value); `sample` adds the noise a real board shows."""

    index: int
    model: Model = H100
    util: dict[int, float] = field(default_factory=dict)
    procs: dict[int, list[tuple[int, str, float]]] = field(default_factory=dict)  # (pid, name, bytes)
    mask: dict[int, int] = field(default_factory=dict)
    sm_hz: dict[int, float] = field(default_factory=dict)
    temp_c: dict[int, float] = field(default_factory=dict)
    power_w: dict[int, float] = field(default_factory=dict)
    silent_from: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        self._rng = random.Random(1000 * self.seed + self.index)

    @property
    def uuid(self) -> str:
        return f"GPU-hold-{self.seed:02d}{self.index:02d}"

    def set_condition(self, secs: range, mask: int, sm_hz: float, temp_c: float | None = None, power_w: float | None = None) -> None:
        for s in secs:
            self.mask[s], self.sm_hz[s] = mask, sm_hz
            if temp_c is not None:
                self.temp_c[s] = temp_c
            if power_w is not None:
                self.power_w[s] = power_w

    def sample(self, sec: int, t0: float) -> dict[str, Any] | None:
        noise = self._rng.uniform(-1.0, 1.0)  # drawn for every second, so a silence does not shift the rest
        if self.silent_from is not None and sec >= self.silent_from:
            return None
        util = min(0.99, max(0.0, self.util.get(sec, 0.0) + (0.01 * noise if self.util.get(sec) else 0.0)))
        procs = self.procs.get(sec, [])
        busy = util > 0.05
        m = self.model
        return {
            "type": "sample", "t": t0 + sec, "gpu": self.index, "uuid": self.uuid,
            "utilization_gpu_ratio": round(util, 3), "memory_used_bytes": float(int(0.55 * GB + sum(b for _, _, b in procs))),
            "memory_total_bytes": float(m.memory_total_bytes),
            "temperature_celsius": round(self.temp_c.get(sec, 34.0 + 27.0 * util) + 0.4 * noise, 1),
            "temperature_slowdown_celsius": m.slowdown_c,
            "power_watts": round(self.power_w.get(sec, 75.0 + 580.0 * util) + 6.0 * noise),
            "sm_clock_hz": self.sm_hz.get(sec, m.sm_max_hz if busy else 345e6),
            "clock_event_mask": self.mask.get(sec, 0 if busy or procs else IDLE),
            "processes": [{"pid": p, "name": n, "used_memory_bytes": int(b)} for p, n, b in procs],
        }


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows), encoding="utf-8")


def write_recording(folder: Path, boards: list[Board], seconds: int, *, xids: list[tuple[float, int, int]] = (),
                    host: str | None = None) -> None:
    """recording.jsonl: a header with each GPU's static facts (and the host, when given), then per second
    the XIDs that fell in it and one sample per GPU that still answers."""
    header: dict[str, Any] = {"format": "gpulens-recording", "version": 1, "backend": "truth-holdout", "gpus": [
        {"index": b.index, "uuid": b.uuid, "name": b.model.name, "memory_total_bytes": b.model.memory_total_bytes,
         "temperature_slowdown_celsius": b.model.slowdown_c, "temperature_shutdown_celsius": b.model.shutdown_c,
         "sm_clock_max_hz": b.model.sm_max_hz, "power_limit_watts": b.model.power_limit_w} for b in boards]}
    if host:
        header["host"] = host
    lines: list[dict[str, Any]] = [header]
    pending = sorted(xids)
    by_index = {b.index: b for b in boards}
    for sec in range(seconds + 1):
        while pending and pending[0][0] <= T0 + sec:
            t, gi, code = pending.pop(0)
            lines.append({"type": "xid", "t": t, "gpu": gi, "uuid": by_index[gi].uuid, "xid": code})
        lines.extend(s for b in boards if (s := b.sample(sec, T0)) is not None)
    write_jsonl(folder / "recording.jsonl", lines)


def write_events(folder: Path, events: list[dict[str, Any]]) -> None:
    key = lambda e: float(e.get("t_end", e.get("end", e.get("t", 0.0))))  # noqa: E731
    write_jsonl(folder / "events.jsonl", sorted(events, key=key))


# ------------------------------------------------------------------ training
@dataclass
class Rank:
    job: str
    rank: int
    pid: int
    board: Board | None  # None: the rank's GPU is on a host this recording does not sample
    cuda_index: int  # what train_start says
    host: str | None = None
    mem_peak_bytes: float = 22 * GB
    listed_until: float | None = None  # its process stays in the GPU's process list until then (default: its last step)

    def host_fields(self) -> dict[str, str]:
        return {"host": self.host} if self.host else {}


Work = Callable[[Rank, float], tuple[float, float]]  # (data wait, compute) of a step starting at t
Pause = Callable[[int, float], tuple[str, float] | None]  # after step i ending at t: ("checkpoint" | "eval", seconds)


def ddp(ranks: list[Rank], t0: float, t1: float, work: Work, rng: random.Random, *, comm_s: float = 0.035,
        hang_at: float | None = None, pause: Pause | None = None, tokens: int = 32768) -> list[dict[str, Any]]:
    """A synchronous data-parallel job: each step ends when the slowest rank is done (every other rank
    waits in the all-reduce). A checkpoint is charged to the step before it (as the monitor does);
    an evaluation is its own `train_eval` record between steps. From `hang_at` no step ends."""
    events: list[dict[str, Any]] = []
    for r in ranks:
        events.append({"kind": "train_start", "t": r4(t0 - 1.5), "job": r.job, "rank": r.rank, "world_size": len(ranks), "pid": r.pid,
                       "gpu": r.cuda_index, "gpu_name": (r.board.model.name if r.board else H100.name), **r.host_fields()})
    t, i, last_end = t0, 0, t0
    while t < t1:
        parts = {r.rank: work(r, t) for r in ranks}
        step_s = max(d + c for d, c in parts.values()) + comm_s * rng.uniform(0.8, 1.3)
        if hang_at is not None and t + step_s > hang_at:
            break
        what = pause(i, t + step_s) if pause else None
        ckpt = what[1] if what and what[0] == "checkpoint" else 0.0
        for r in ranks:
            d, c = parts[r.rank]
            end = t + step_s + ckpt
            events.append({"kind": "train_step", "job": r.job, "rank": r.rank, "pid": r.pid, "step": i, "t_start": r4(t), "t_end": r4(end),
                           "step_s": r4(step_s + ckpt), "data_wait_s": r4(d), "compute_s": r4(c), "comm_wait_s": r4(step_s - d - c),
                           "checkpoint_s": r4(ckpt), "batch": 16, "tokens": tokens, "loss": r4(2.9 - 0.0009 * i + rng.uniform(-0.02, 0.02)),
                           "mem_peak": int(r.mem_peak_bytes), **r.host_fields()})
            if r.board is not None:
                for sec in range(int(t - T0), int(t + step_s - T0) + 1):
                    r.board.util[sec] = max(r.board.util.get(sec, 0.0), min(0.97, c / step_s))
                for sec in range(int(t + step_s - T0) + 1, int(end - T0) + 1):
                    r.board.util[sec] = 0.02  # writing the checkpoint: the GPU waits
        t = last_end = t + step_s + ckpt
        if what and what[0] == "eval":
            for r in ranks:
                events.append({"kind": "train_eval", "t": r4(t + what[1]), "t_start": r4(t), "seconds": r4(what[1]), "after_step": i,
                               "job": r.job, "pid": r.pid, "rank": r.rank, **r.host_fields()})
                if r.board is not None:
                    for sec in range(int(t - T0) + 1, int(t + what[1] - T0) + 1):
                        r.board.util[sec] = 0.7
            t += what[1]
        i += 1
    for r in ranks:  # the process holds its memory from its start to its last moment
        if r.board is None:
            continue
        until = r.listed_until if r.listed_until is not None else last_end
        for sec in range(int(t0 - T0) - 2, int(until - T0) + 1):
            r.board.procs.setdefault(sec, []).append((r.pid, "python", r.mem_peak_bytes * 1.08))
    return events


def jittered(rng: random.Random, compute_s: float, data_s: float = 0.012, sigma: float = 0.03,
             factor: Callable[[Rank, float], float] = lambda r, t: 1.0) -> Work:
    """Compute with log-normal noise (sigma), data wait around `data_s`, times `factor(rank, t)`."""
    return lambda r, t: (data_s * rng.uniform(0.5, 1.5), compute_s * factor(r, t) * rng.lognormvariate(0.0, sigma))


# ------------------------------------------------------------------ serving
@dataclass
class Service:
    name: str
    pid: int
    board: Board
    slots: int = 8
    prefill_s: float = 0.08
    tpot_s: float = 0.014
    output_tokens: tuple[int, int] = (40, 160)
    mem_bytes: float = 28 * GB
    process: str = "python"
    model: str = "llama-8b"
    requests: list[dict[str, Any]] = field(default_factory=list)


def serve(svc: Service, t0: float, t1: float, rate: Callable[[float], float], rng: random.Random, *,
          down_at: float | None = None, fail_for_s: float = 0.0) -> list[dict[str, Any]]:
    """Poisson arrivals at `rate(t)` per second into `slots` FIFO servers. From `down_at` (the GPU is
    gone) requests in flight end in an error then, new ones fail at once for `fail_for_s`, then stop."""
    free, starts, out = [t0] * svc.slots, [], []
    busy: dict[int, float] = {}
    t = t0
    while True:
        t += rng.expovariate(rate(t))
        if t >= t1 or (down_at is not None and t >= down_at + fail_for_s):
            break
        prompt, n_out = rng.randint(150, 900), rng.randint(*svc.output_tokens)
        rec: dict[str, Any] = {"kind": "request", "service": svc.name, "model": svc.model, "pid": svc.pid, "arrival": r4(t)}
        if down_at is not None and t >= down_at:
            rec.update(start=r4(t), end=r4(t + rng.uniform(0.002, 0.01)), status="error", prompt_tokens=prompt, output_tokens=0,
                       queue_depth_at_start=0)
            out.append(rec)
            continue
        i = min(range(svc.slots), key=free.__getitem__)
        start = max(t, free[i])
        first = start + svc.prefill_s * rng.uniform(0.8, 1.25)
        tpot = svc.tpot_s * rng.uniform(0.92, 1.08)
        end = first + n_out * tpot
        depth = len(starts) - bisect.bisect_right(starts, t)  # arrived before this one, not yet started
        starts.append(start)
        if down_at is not None and end > down_at:  # in flight when the GPU fell off: the engine errors it out
            end = max(down_at, t) + rng.uniform(0.2, 1.5)
            start = min(start, end)
            rec.update(start=r4(start), end=r4(end), status="error", prompt_tokens=prompt, output_tokens=0, queue_depth_at_start=depth)
            free[i] = end
            out.append(rec)
            continue
        free[i] = end
        rec.update(start=r4(start), first_token=r4(first), end=r4(end), status="ok", prompt_tokens=prompt, output_tokens=n_out,
                   tpot_s=r4(tpot, 5), queue_depth_at_start=depth)
        out.append(rec)
        for sec in range(int(start - T0), int(end - T0) + 1):
            lo, hi = max(start, T0 + sec), min(end, T0 + sec + 1)
            if hi > lo:
                busy[sec] = busy.get(sec, 0.0) + (hi - lo)
    for sec, active in busy.items():  # more sequences in the batch, a busier GPU
        svc.board.util[sec] = max(svc.board.util.get(sec, 0.0), min(0.96, 0.2 + 0.09 * active))
    last = t1 if down_at is None else down_at
    for sec in range(int(t0 - T0) - 4, int(last - T0) + 1):
        svc.board.procs.setdefault(sec, []).append((svc.pid, svc.process, svc.mem_bytes))
    svc.requests.extend(out)
    return out


def engine_stats(svc: Service, t0: float, t1: float, rng: random.Random, *, every_s: float = 5.0, kv0: float = 0.06,
                 kv_per_seq: float = 0.04) -> list[dict[str, Any]]:
    """The engine's own view every `every_s`: sequences running and waiting (from the requests
    served), KV-cache usage growing with the running batch, no preemption."""
    out, t = [], t0 + 0.5
    reqs = [r for r in svc.requests if r["status"] == "ok"]
    while t < t1:
        running = sum(1 for r in reqs if r["start"] <= t < r["end"])
        waiting = sum(1 for r in reqs if r["arrival"] <= t < r["start"])
        kv = min(0.89, kv0 + kv_per_seq * running + rng.uniform(-0.015, 0.015))
        out.append({"kind": "engine_stats", "t": r4(t), "service": svc.name, "engine": "vllm", "pid": svc.pid,
                    "kv_cache_usage_ratio": round(max(0.0, kv), 3), "num_requests_running": running,
                    "num_requests_waiting": waiting, "num_preemptions_total": 0})
        t += every_s
    return out


def latency_p99_by_window(requests: list[dict[str, Any]], window_s: float = 30.0) -> dict[int, float]:
    """p99 latency (arrival to end) of successful requests per window: the generator's own check of a plan."""
    by: dict[int, list[float]] = {}
    for r in requests:
        if r["status"] == "ok":
            by.setdefault(int((r["arrival"] - T0) // window_s), []).append(r["end"] - r["arrival"])
    return {w: sorted(v)[max(0, int(round(0.99 * len(v))) - 1)] for w, v in by.items()}


# ------------------------------------------------------------------ truth
GPU_THERMAL_KINDS = ["gpu_clock_cut", "throttled", "gpu_temperature_high"]
SILENCE_KINDS = ["gpu_lost", "gpu_silent", "gpu_stale", "gpu_absent", "gpu_no_samples"]
RANK_SILENCE_KINDS = ["silent_rank", "rank_silent", "rank_stopped", "workload_silent", "stalled_rank"]
STRAGGLER_SYMPTOMS = ["straggler", "comm_bound", "step_time_regression", "underutilized"]


def incident(id_: str, root_cause: str, cause_kinds: list[str], place: dict[str, str], span: tuple[float, float], workloads: list[str], *,
             symptoms: list[str] = (), jobs: list[str] = (), services: list[str] = (), must_mention: list[str] = (),
             also_reported: list[str] = (), note: str = "") -> dict[str, Any]:
    """One planted incident in tests/truth/README.md's format."""
    return {"id": id_, "root_cause": root_cause, "cause_kinds": list(cause_kinds), "place": place,
            "span": [round(span[0], 3), round(span[1], 3)], "workloads": sorted(workloads), "symptoms": list(symptoms),
            "affects": {"jobs": list(jobs), "services": list(services)}, "must_mention": list(must_mention),
            "also_reported": list(also_reported), "note": note}


def write_truth(folder: Path, *, made: str, incidents: list[dict[str, Any]], replay_args: list[str] = (),
                diagnose_args: list[str] = (), one_incident: bool = False) -> None:
    truth = {"case": folder.name, "made": made, "healthy": not incidents, "one_incident": one_incident,
             "replay_args": list(replay_args), "diagnose_args": list(diagnose_args), "incidents": incidents}
    (folder / "truth.json").write_text(json.dumps(truth, indent=2) + "\n", encoding="utf-8")


def fresh(root: Path, name: str) -> Path:
    folder = root / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder
