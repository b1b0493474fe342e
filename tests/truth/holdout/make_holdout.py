"""Write the held-out truth set (tests/truth/holdout/cases/NAME/): recordings and their truth.json.

A second truth set, made apart from the implementation and never tuned on (issue 23, item 7): the
dev set (tests/truth/cases) fixes GPU counts, positions, magnitudes and timings; this one varies
them and adds healthy runs of kinds the dev set did not try. Each case is planned first (what
happens, where, when, to whom); the recording and the truth are both written from that plan,
never from what gpulens says. Deterministic (seeded): `python tests/truth/holdout/make_holdout.py`.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parents[1]) not in sys.path:  # run as a script: make `truth.holdout` importable as pytest does
    sys.path.insert(0, str(HERE.parents[1]))

from truth.holdout.holdout_sim import (  # noqa: E402
    GB,
    GPU_THERMAL_KINDS,
    H100,
    H200,
    HW_POWER_BRAKE,
    HW_THERMAL,
    RANK_SILENCE_KINDS,
    SILENCE_KINDS,
    STRAGGLER_SYMPTOMS,
    SW_THERMAL,
    T0,
    Board,
    Rank,
    Service,
    ddp,
    engine_stats,
    fresh,
    incident,
    jittered,
    latency_p99_by_window,
    serve,
    write_events,
    write_recording,
    write_truth,
)

CASES = HERE / "cases"
POWER_KINDS = ["gpu_clock_cut", "throttled", "gpu_power_brake"]
STALE_KINDS = ["stale_process_memory", "other_process_memory", "foreign_process_memory", "gpu_memory_full"]
SATURATION_KINDS = ["queueing", "saturation", "overload", "overloaded", "capacity_exceeded"]


def _case(name: str) -> Path:
    return fresh(CASES, name)


def _within_slo(requests: list[dict], slo_s: float) -> None:
    """A healthy serving plan must meet its SLO in every 30 s window, with margin: checked, not assumed."""
    worst = max(latency_p99_by_window(requests).values())
    assert worst < 0.85 * slo_s, f"the plan misses its own SLO: p99 {worst:.2f} s against {slo_s} s"


# ------------------------------------------------------------------ training, GPU causes
def straggler_power_brake_gpu6_of_8() -> None:
    folder, seed = _case("straggler_power_brake_gpu6_of_8"), 1
    rng = random.Random(seed)
    boards = [Board(i, H100, seed=seed) for i in range(8)]
    ranks = [Rank("moe-pt", i, 9100 + i, boards[i], i) for i in range(8)]
    brake_from, brake_to, end = 20, 62, 76
    boards[6].set_condition(range(brake_from, brake_to), HW_POWER_BRAKE, 1.05e9, power_w=260.0)
    slow = lambda r, t: 1.45 if r.rank == 6 and T0 + brake_from <= t < T0 + brake_to else 1.0  # noqa: E731
    ev = ddp(ranks, T0 + 3, T0 + end, jittered(rng, 1.25, factor=slow), rng)
    write_recording(folder, boards, end + 1)
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: 8 H100s, 8-rank DDP job 'moe-pt', rank i on GPU i (train_start says i). From +20 s to +62 s the "
                "board of GPU 6 asserts the hardware power brake (mask 0x80, SM 1.05 GHz, ~260 W): rank 6's compute takes 1.45x, the other "
                "seven ranks wait for it in the all-reduce; compute noise 3 % on every rank.", one_incident=True,
                incidents=[incident("brake-gpu6", "gpu_power_brake", POWER_KINDS, {"gpu": "6", "train_job": "moe-pt", "rank": "6"},
                                    (T0 + brake_from, T0 + brake_to), ["job moe-pt rank 6"], symptoms=STRAGGLER_SYMPTOMS, jobs=["moe-pt"],
                                    note="A power brake, not heat; the seven waiting ranks are symptoms.")])


def straggler_thermal_two_hosts() -> None:
    folder, seed = _case("straggler_thermal_two_hosts"), 2
    rng = random.Random(seed)
    boards = [Board(i, H100, seed=seed) for i in range(2)]  # node-b's two GPUs: this recording is node-b's agent
    ranks = [Rank("multinode", 0, 4100, None, 0, host="node-a"), Rank("multinode", 1, 4101, None, 1, host="node-a"),
             Rank("multinode", 2, 4100 + 77, boards[0], 0, host="node-b"), Rank("multinode", 3, 4101 + 77, boards[1], 1, host="node-b")]
    hot, end = 35, 110
    boards[1].set_condition(range(hot, end + 1), HW_THERMAL, 1.15e9, temp_c=88.5)
    slow = lambda r, t: 1.55 if r.host == "node-b" and r.rank == 3 and t >= T0 + hot else 1.0  # noqa: E731
    ev = ddp(ranks, T0 + 3, T0 + end, jittered(rng, 1.1, factor=slow), rng, comm_s=0.06)
    write_recording(folder, boards, end + 1, host="node-b")
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: a 4-rank job 'multinode' over two hosts, ranks 0-1 on node-a GPUs 0-1, ranks 2-3 on node-b "
                "GPUs 0-1; every record carries its host, the recording (header host node-b) samples node-b's GPUs only. From +35 s "
                "node-b GPU 1 runs under hardware thermal slowdown (88.5 C, SM 1.15 GHz): rank 3 takes 1.55x, ranks 0-2 wait. Rank 1 "
                "also says GPU 1, on node-a, and is not hit.", one_incident=True,
                incidents=[incident("thermal-node-b-gpu1", "gpu_thermal", GPU_THERMAL_KINDS,
                                    {"host": "node-b", "gpu": "1", "train_job": "multinode", "rank": "3"}, (T0 + hot, T0 + end),
                                    ["job multinode rank 3"], symptoms=STRAGGLER_SYMPTOMS, jobs=["multinode"],
                                    note="GPU 1 of node-b, not of node-a: rank 1 (node-a, GPU 1) must not be named.")])


def thermal_short_cut() -> None:
    folder, seed = _case("thermal_short_cut"), 3
    rng = random.Random(seed)
    boards = [Board(0, H200, seed=seed), Board(1, H200, seed=seed)]
    hot, cool, end = 70, 98, 150
    boards[1].set_condition(range(hot, cool), HW_THERMAL, 1.25e9, temp_c=90.5)
    slow = lambda r, t: 1.45 if T0 + hot <= t < T0 + cool else 1.0  # noqa: E731
    ev = ddp([Rank("vit", 0, 6001, boards[1], 1, mem_peak_bytes=41 * GB)], T0 + 2, T0 + end, jittered(rng, 0.55, factor=slow), rng, comm_s=0.0)
    write_recording(folder, boards, end + 1)
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: 2 H200s, GPU 0 idle, job 'vit' (one rank, 0.57 s steps) on GPU 1. A short hardware thermal "
                "slowdown on GPU 1, 28 s (+70..+98 s, 90.5 C, SM 1.25 GHz): steps 1.45x then, back to normal after.",
                incidents=[incident("thermal-gpu1-short", "gpu_thermal", GPU_THERMAL_KINDS, {"gpu": "1", "train_job": "vit", "rank": "0"},
                                    (T0 + hot, T0 + cool), ["job vit rank 0"], symptoms=["step_time_regression"], jobs=["vit"],
                                    note="Under a minute; the slower steps are the GPU's, no rollback advice.")])


def thermal_long_sw() -> None:
    folder, seed = _case("thermal_long_sw"), 4
    rng = random.Random(seed)
    board = Board(0, H100, seed=seed)
    hot, cool, end = 40, 370, 400
    board.set_condition(range(hot, cool), SW_THERMAL, 1.5e9, temp_c=86.0)
    slow = lambda r, t: 1.25 if T0 + hot <= t < T0 + cool else 1.0  # noqa: E731
    ev = ddp([Rank("asr", 0, 6100, board, 0)], T0 + 2, T0 + end, jittered(rng, 2.4, factor=slow), rng, comm_s=0.0)
    write_recording(folder, [board], end + 1)
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: one H100 (slowdown at 87 C), job 'asr' with 2.41 s steps. 5.5 minutes (+40..+370 s) of "
                "software thermal slowdown (mask 0x20, 86 C, SM 1.5 GHz): steps 1.25x, under a 1.5x regression threshold.",
                incidents=[incident("thermal-gpu0-long", "gpu_thermal", GPU_THERMAL_KINDS, {"gpu": "0", "train_job": "asr", "rank": "0"},
                                    (T0 + hot, T0 + cool), ["job asr rank 0"], symptoms=["step_time_regression"], jobs=["asr"])])


def two_jobs_one_hit() -> None:
    folder, seed = _case("two_jobs_one_hit"), 5
    rng = random.Random(seed)
    boards = [Board(i, H100, seed=seed) for i in range(4)]
    vision = [Rank("vision", i, 5200 + i, boards[i], i) for i in range(2)]
    speech = [Rank("speech", i, 5300 + i, boards[2 + i], 2 + i) for i in range(2)]
    hot, end = 35, 85
    boards[3].set_condition(range(hot, end + 1), HW_THERMAL, 1.1e9, temp_c=89.0)
    slow = lambda r, t: 1.5 if r.rank == 1 and t >= T0 + hot else 1.0  # noqa: E731
    ev = ddp(vision, T0 + 2, T0 + end, jittered(rng, 0.95), rng) + ddp(speech, T0 + 4, T0 + end, jittered(rng, 1.2, factor=slow), rng)
    write_recording(folder, boards, end + 1)
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: 4 H100s; job 'vision' (2 ranks) on GPUs 0-1, job 'speech' (2 ranks) on GPUs 2-3. From +35 s "
                "GPU 3 (speech rank 1) runs under hardware thermal slowdown (89 C, 1.1 GHz): its compute 1.5x, speech rank 0 waits. "
                "vision is untouched.", one_incident=True,
                incidents=[incident("thermal-gpu3", "gpu_thermal", GPU_THERMAL_KINDS, {"gpu": "3", "train_job": "speech", "rank": "1"},
                                    (T0 + hot, T0 + end), ["job speech rank 1"], symptoms=STRAGGLER_SYMPTOMS, jobs=["speech"],
                                    note="Only speech is hit; nothing about vision.")])


def stale_process_gpu3_of_4() -> None:
    folder, seed = _case("stale_process_gpu3_of_4"), 6
    rng = random.Random(seed)
    boards = [Board(i, H100, seed=seed) for i in range(4)]
    ranks = [Rank("bert-l", i, 7700 + i, boards[i], i, mem_peak_bytes=22 * GB) for i in range(4)]
    end, stale_pid, stale_bytes = 75, 31337, 58 * GB
    ev = ddp(ranks, T0 + 2, T0 + end, jittered(rng, 0.9), rng)
    for sec in range(0, end + 2):  # left over from an earlier run, idle, holding 58 GB of GPU 3 from the start
        boards[3].procs.setdefault(sec, []).append((stale_pid, "python3", stale_bytes))
    write_recording(folder, boards, end + 1)
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: 4 H100s (80 GB), 4-rank DDP job 'bert-l', each rank's allocator peak 22 GB. On GPU 3 an idle "
                "process (pid 31337, 'python3') from an earlier run holds 58 GB from the start: GPU 3 is ~97 % full, the others ~30 %.",
                one_incident=True,
                incidents=[incident("stale-31337", "stale_process_memory", STALE_KINDS, {"gpu": "3", "train_job": "bert-l", "rank": "3"},
                                    (T0 + 2, T0 + end), ["job bert-l rank 3"], symptoms=["memory_pressure"], jobs=["bert-l"],
                                    must_mention=["31337"], note="The memory is pid 31337's; rank 3 itself uses 24 GB.")])


# ------------------------------------------------------------------ faults and silence
def xid48_then_ranks_stop() -> None:
    folder, seed = _case("xid48_then_ranks_stop"), 7
    rng = random.Random(seed)
    boards = [Board(i, H200, seed=seed) for i in range(4)]
    ranks = [Rank("pretrain-b", i, 8800 + i, boards[i], i) for i in range(4)]
    xid_t, end = T0 + 60.4, 100
    ranks[1].listed_until = xid_t + 0.6  # the process on the faulted GPU dies; the others hang in the all-reduce, still listed
    for r in (ranks[0], ranks[2], ranks[3]):
        r.listed_until = T0 + end
    ev = ddp(ranks, T0 + 2, T0 + end, jittered(rng, 1.0), rng, hang_at=xid_t)
    write_recording(folder, boards, end, xids=[(xid_t, 1, 48)])
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: 4 H200s, 4-rank DDP job 'pretrain-b', rank i on GPU i. XID 48 (double-bit ECC) on GPU 1 at "
                "+60.4 s during a step: that step never ends on any rank; rank 1's process exits, ranks 0, 2, 3 hang in the all-reduce "
                "(still listed on their GPUs) until the recording ends at +100 s. GPU 1 keeps answering.",
                incidents=[incident("xid48-gpu1", "gpu_xid", ["gpu_xid", "gpu_ecc_uncorrectable"], {"gpu": "1"}, (xid_t, T0 + end),
                                    ["job pretrain-b rank 1"], symptoms=[*RANK_SILENCE_KINDS, "comm_bound"], jobs=["pretrain-b"],
                                    note="The fault explains the stopped steps after it; only rank 1 ran on GPU 1.")])


def gpu_silent_without_xid() -> None:
    folder, seed = _case("gpu_silent_without_xid"), 8
    rng = random.Random(seed)
    boards = [Board(i, H100, seed=seed) for i in range(4)]
    pair = [Rank("detr", i, 3300 + i, boards[i], i) for i in range(2)]
    lone = Rank("distill", 0, 3400, boards[2], 2)
    fall, end = 50, 100
    boards[2].silent_from = fall
    ev = ddp(pair, T0 + 2, T0 + end, jittered(rng, 0.8), rng) + ddp([lone], T0 + 3, T0 + end, jittered(rng, 0.7), rng, comm_s=0.0,
                                                                       hang_at=T0 + fall - 0.5)
    write_recording(folder, boards, end)
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: 4 H100s; job 'detr' (2 ranks) on GPUs 0-1, job 'distill' (1 rank) on GPU 2, GPU 3 idle. From "
                "+50 s GPU 2 sends no sample at all, with no XID and no gpu_up = 0 before it; distill's steps stop with it; the other "
                "GPUs and detr go on.",
                incidents=[incident("silent-gpu2", "gpu_lost", SILENCE_KINDS, {"gpu": "2"}, (T0 + fall, T0 + end), ["job distill rank 0"],
                                    symptoms=RANK_SILENCE_KINDS, jobs=["distill"],
                                    note="No XID: the silence itself is the finding; detr is not hit.")])


def xid79_gpu0_two_services() -> None:
    folder, seed = _case("xid79_gpu0_two_services"), 9
    rng = random.Random(seed)
    boards = [Board(0, H200, seed=seed), Board(1, H200, seed=seed)]
    fall, end = 45.6, 95
    rerank = Service("rerank", 8700, boards[0], slots=12, prefill_s=0.05, tpot_s=0.006, output_tokens=(8, 40), mem_bytes=18 * GB)
    assist = Service("assist", 8701, boards[1], slots=8, tpot_s=0.016)
    ev = serve(rerank, T0 + 2, T0 + end, lambda t: 2.2, rng, down_at=T0 + fall, fail_for_s=25.0) + serve(assist, T0 + 2, T0 + end, lambda t: 1.6, rng)
    boards[0].silent_from = int(fall) + 1
    write_recording(folder, boards, end, xids=[(T0 + fall, 0, 79)])
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: 2 H200s; service 'rerank' (pid 8700) on GPU 0, service 'assist' (pid 8701) on GPU 1, each "
                "request record carrying its service and pid. XID 79 on GPU 0 at +45.6 s, then no sample from it; rerank's requests in "
                "flight end in errors, new ones fail at once for 25 s, then none; assist is untouched.",
                incidents=[incident("xid79-gpu0", "gpu_lost", ["gpu_xid", *SILENCE_KINDS], {"gpu": "0", "service": "rerank"},
                                    (T0 + fall, T0 + end), ["service rerank"], symptoms=["error_rate", "timeouts", "service_silent"],
                                    services=["rerank"], also_reported=SILENCE_KINDS,
                                    note="GPU 0 this time; assist's requests are not rerank's.")])


# ------------------------------------------------------------------ training, workload causes
def code_regression_every_rank() -> None:
    folder, seed = _case("code_regression_every_rank"), 10
    rng = random.Random(seed)
    boards = [Board(i, H200, seed=seed) for i in range(2)]
    first = [Rank("sft", i, 2600 + i, boards[i], i) for i in range(2)]
    second = [Rank("sft", i, 2700 + i, boards[i], i) for i in range(2)]
    restart, end = 66, 130
    ev = ddp(first, T0 + 2, T0 + 60, jittered(rng, 0.8), rng)
    ev += ddp(second, T0 + restart, T0 + end, jittered(rng, 0.8 * 1.6), rng)
    write_recording(folder, boards, end + 1)
    write_events(folder, ev)
    span = (T0 + restart, T0 + end)
    write_truth(folder, made="Synthetic: 2 H200s, 2-rank DDP job 'sft'. It runs +2..+60 s at 0.84 s a step, then is relaunched at +66 s "
                "(new pids, same job, same batch) with a change that makes every rank's compute 1.6x; the GPUs stay healthy (full clocks, "
                "no clock event, ~95 % busy). A real code regression: rollback advice is right. One planted incident per rank, because "
                "the scorer locates a cause by rank.",
                incidents=[incident(f"regression-rank{r}", "code_regression", ["step_time_regression"], {"gpu": str(r), "train_job": "sft", "rank": str(r)},
                                    span, [f"job sft rank {r}"], jobs=["sft"], note="No GPU cause: the finding stands, with its rollback advice.")
                           for r in range(2)])


def checkpoint_stall_low_util() -> None:
    folder, seed = _case("checkpoint_stall_low_util"), 11
    rng = random.Random(seed)
    board = Board(0, H100, seed=seed)
    rank = Rank("ckpt", 0, 6600, board, 0)
    end, saves = 170, {70: 7.5, 150: 9.0, 230: 6.5}  # after step N, seconds the save stops the loop
    planned: list[tuple[float, float]] = []

    def pause(i: int, t: float):
        if i in saves:
            planned.append((t, t + saves[i]))
            return ("checkpoint", saves[i])
        return None

    ev = ddp([rank], T0 + 2, T0 + end, jittered(rng, 0.5), rng, comm_s=0.0, pause=pause)
    write_recording(folder, [board], end + 1)
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: one H100, job 'ckpt' with 0.52 s steps. Three synchronous checkpoints (7.5 s, 9 s, 6.5 s, "
                "after steps 70, 150, 230) stop the loop; each is charged to the step before it (checkpoint_s) as the monitor does, and "
                "the GPU is ~2 % busy while it is written.",
                incidents=[incident(f"checkpoint-{n}", "checkpoint_stall", ["checkpoint_stall"], {"gpu": "0", "train_job": "ckpt", "rank": "0"},
                                    span, ["job ckpt rank 0"], symptoms=["underutilized", "gpu_idle", "low_utilization"], jobs=["ckpt"])
                           for n, span in enumerate(planned, 1)])


# ------------------------------------------------------------------ serving
def saturation_overload_burst() -> None:
    folder, seed = _case("saturation_overload_burst"), 12
    rng = random.Random(seed)
    board = Board(0, H200, seed=seed)
    svc = Service("support", 9400, board, slots=8, prefill_s=0.1, tpot_s=0.02, output_tokens=(80, 220), mem_bytes=0.92 * H200.memory_total_bytes - 0.55 * GB,
                  process="vllm")
    burst_from, burst_to, end = 50, 80, 140
    rate = lambda t: 4.5 if T0 + burst_from <= t < T0 + burst_to else 1.2  # noqa: E731  capacity ~2.7 requests/s
    ev = serve(svc, T0 + 2, T0 + end, rate, rng)
    ev += engine_stats(svc, T0, T0 + end, rng, kv0=0.08, kv_per_seq=0.09)
    queued_until = max(r["start"] for r in ev if r["kind"] == "request" and r["start"] - r["arrival"] > 0.5)
    assert queued_until < T0 + end - 10, "the plan's queue must drain inside the recording"
    write_recording(folder, [board], end + 1)
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: a vLLM-style engine 'support' (8 sequences, ~3 s a request, capacity ~2.7 requests/s, 92 % of "
                "the GPU pre-allocated) at 1.2 requests/s, with a burst of 4.5 requests/s from +50 s to +80 s; the queue grows and drains "
                f"by +{queued_until - T0:.0f} s. The GPU is healthy (full clocks, no event); engine_stats shows requests waiting, KV cache "
                "below 90 %, no preemption. Diagnosed with --slo p99_latency<=8s.", one_incident=True,
                incidents=[incident("saturation-support", "saturation", SATURATION_KINDS, {"gpu": "0", "service": "support"},
                                    (T0 + burst_from, queued_until), ["service support"],
                                    symptoms=["slo_violation", "timeouts", "error_rate"], services=["support"],
                                    note="A real saturation: queueing is the cause, more replicas is right advice.")],
                replay_args=["--service", "support"], diagnose_args=["--slo", "p99_latency<=8s"])


def healthy_busy_serving() -> None:
    folder, seed = _case("healthy_busy_serving"), 13
    rng = random.Random(seed)
    board = Board(0, H200, seed=seed)
    svc = Service("qa", 9500, board, slots=16, prefill_s=0.1, tpot_s=0.02, output_tokens=(100, 280), mem_bytes=46 * GB)
    ev = serve(svc, T0 + 2, T0 + 100, lambda t: 3.0, rng)  # capacity ~4.2 requests/s: 72 % load
    _within_slo(ev, 8.0)
    write_recording(folder, [board], 101)
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: service 'qa', 16 sequences, ~3.9 s a request (capacity ~4.2 requests/s), at 3 requests/s: "
                "busy (GPU ~90 %) but under capacity; short waits now and then; every 30 s window's p99 is checked below 0.85 x the SLO "
                "of 8 s given to diagnose.", incidents=[], replay_args=["--service", "qa"], diagnose_args=["--slo", "p99_latency<=8s"])


def engine_preallocates_high_load() -> None:
    folder, seed = _case("engine_preallocates_high_load"), 14
    rng = random.Random(seed)
    board = Board(0, H100, seed=seed)
    svc = Service("gen", 9600, board, slots=24, prefill_s=0.09, tpot_s=0.015, output_tokens=(100, 300),
                  mem_bytes=0.93 * H100.memory_total_bytes - 0.55 * GB, process="vllm")
    ev = serve(svc, T0 + 2, T0 + 110, lambda t: 4.0, rng)  # capacity ~7.7 requests/s: 52 % load
    stats = engine_stats(svc, T0, T0 + 110, rng, kv0=0.1, kv_per_seq=0.03)
    kv, waiting = [x["kv_cache_usage_ratio"] for x in stats], max(x["num_requests_waiting"] for x in stats)
    assert max(kv) < 0.9 and waiting <= 1, "the plan's engine must stay healthy by its own signals"
    ev += stats
    write_recording(folder, [board], 111)
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: a vLLM-style engine 'gen' (process 'vllm', pid 9600) that pre-allocates 93 % of an H100 from "
                f"the start, at 4 requests/s (~52 % of its 24-sequence capacity, GPU ~90 % busy); "
                f"engine_stats: KV cache {min(kv):.0%}-{max(kv):.0%} used, at most {waiting} request waiting, no preemption.", incidents=[], replay_args=["--service", "gen"])


def healthy_bursty_serving() -> None:
    folder, seed = _case("healthy_bursty_serving"), 15
    rng = random.Random(seed)
    board = Board(0, H100, seed=seed)
    svc = Service("search-api", 9700, board, slots=12, prefill_s=0.06, tpot_s=0.012, output_tokens=(40, 140))
    rate = lambda t: 6.0 if (t - T0) % 30.0 < 8.0 else 0.6  # noqa: E731  bursts of 8 s every 30 s; capacity ~10 requests/s
    ev = serve(svc, T0 + 2, T0 + 152, rate, rng)
    _within_slo(ev, 3.0)
    write_recording(folder, [board], 153)
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: service 'search-api', 12 sequences (~1.1 s a request, capacity ~10 requests/s); traffic in "
                "bursts of 6 requests/s for 8 s every 30 s, 0.6 requests/s between; GPU busy 25-70 %, idle gaps. Every window's p99 is "
                "checked below 0.85 x the SLO of 3 s given to diagnose.", incidents=[], replay_args=["--service", "search-api"],
                diagnose_args=["--slo", "p99_latency<=3s"])


# ------------------------------------------------------------------ healthy training
def healthy_ddp_jitter() -> None:
    folder, seed = _case("healthy_ddp_jitter"), 16
    rng = random.Random(seed)
    boards = [Board(i, H100, seed=seed) for i in range(4)]
    ranks = [Rank("gpt-s", i, 1500 + i, boards[i], i) for i in range(4)]
    hiccup = lambda r, t: 1.2 if rng.random() < 0.02 else 1.0  # noqa: E731  a rare slower step (GC, a page fault) on any rank
    ev = ddp(ranks, T0 + 2, T0 + 80, jittered(rng, 1.0, data_s=0.015, sigma=0.05, factor=hiccup), rng, comm_s=0.05)
    write_recording(folder, boards, 81)
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: 4 H100s, 4-rank DDP job 'gpt-s', ~1.07 s steps with normal jitter: compute log-normal 5 % on "
                "every rank, 2 % of rank-steps 1.2x, data wait 8-23 ms, all-reduce 40-65 ms plus the wait for the slowest rank of each "
                "step. No rank is slow for long.", incidents=[])


def healthy_periodic_eval() -> None:
    folder, seed = _case("healthy_periodic_eval"), 17
    rng = random.Random(seed)
    board = Board(0, H200, seed=seed)
    ev = ddp([Rank("lm", 0, 1900, board, 0, mem_peak_bytes=60 * GB)], T0 + 2, T0 + 160, jittered(rng, 0.7), rng, comm_s=0.0,
             pause=lambda i, t: ("eval", 9.0) if i % 60 == 59 else None)
    write_recording(folder, [board], 161)
    write_events(folder, ev)
    write_truth(folder, made="Synthetic: one H200, job 'lm' with 0.71 s steps and an evaluation of 9 s after every 60 steps (train_eval "
                "records, as mon.evaluation() writes them; no step runs meanwhile, the GPU ~70 % busy evaluating). Healthy: the gaps "
                "between steps are evaluations, not stalls or silence.", incidents=[])


ALL = (straggler_power_brake_gpu6_of_8, straggler_thermal_two_hosts, thermal_short_cut, thermal_long_sw, two_jobs_one_hit,
       stale_process_gpu3_of_4, xid48_then_ranks_stop, gpu_silent_without_xid, xid79_gpu0_two_services, code_regression_every_rank,
       checkpoint_stall_low_util, saturation_overload_burst, healthy_busy_serving, engine_preallocates_high_load, healthy_bursty_serving,
       healthy_ddp_jitter, healthy_periodic_eval)


def main() -> None:
    for make in ALL:
        make()
    size = sum(p.stat().st_size for p in CASES.rglob("*") if p.is_file())
    print(f"wrote {len(ALL)} cases under {CASES} ({size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
