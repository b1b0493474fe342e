"""Recommendations: the fixes that make a plan fit, in the order that costs least, each with the
memory it reaches; and for serving, how many replicas x tensor-parallel GPUs meet a target rate."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from gpulens.errors import BadInputError
from gpulens.plan.catalog import GpuSpec
from gpulens.plan.cost import serving_cost
from gpulens.plan.memory import TrainSetup, fits_in, training_memory
from gpulens.plan.models import ModelSpec
from gpulens.plan.scheduling import engine_step_costs, replica_capacity, under_load
from gpulens.plan.serve import (
    ServeSetup,
    ServeSpeed,
    max_batch_that_fits,
    serving_memory,
    serving_speed,
    tensor_parallel_problem,
    weight_bytes,
)
from gpulens.plan.speed import Efficiency, training_speed
from gpulens.units import format_bytes, format_seconds


@dataclass
class Fix:
    action: str  # what to change, in words a beginner can follow
    why: str
    peak_bytes: int  # the memory this step reaches (with every earlier fix applied)
    fits: bool
    change: dict[str, Any]  # the option values that express it (e.g. {"grad_ckpt": true})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _train_mem(m: ModelSpec, s: TrainSetup, gpu: GpuSpec, eff: Efficiency, ctx: int) -> int:
    return training_memory(m, s, capacity_bytes=gpu.memory_bytes, workspace_bytes=eff.workspace_bytes,
                           cuda_context_bytes=ctx, activation_scale=eff.activation_scale).peak_bytes


def training_fixes(m: ModelSpec, setup: TrainSetup, gpu: GpuSpec, eff: Efficiency, ctx: int) -> list[Fix]:
    """Cumulative fixes until the step fits (empty when it already fits)."""
    cap = gpu.memory_bytes
    cur = setup
    fixes: list[Fix] = []

    def ok(s: TrainSetup) -> tuple[int, bool]:
        peak = _train_mem(m, s, gpu, eff, ctx)
        return peak, fits_in(peak, ctx, cap)

    peak, fits = ok(cur)
    if fits:
        return []
    def attempt(trial: TrainSetup, action: str, why: str, change: dict[str, Any]) -> None:
        # keep a fix only if it lowers the peak: when the optimizer step is the peak, activation
        # savings buy nothing
        nonlocal cur, peak, fits
        try:
            p, f = ok(trial)
        except BadInputError:  # a set-up this engine does not run (LitGPT's LoRA: no checkpointing on one GPU)
            return
        if p < peak * 0.99:
            cur, peak, fits = trial, p, f
            fixes.append(Fix(action, why, p, f, change))

    if cur.recompute == "none":
        attempt(replace(cur, selective_recompute=True), "recompute only the attention core (--recompute selective)",
                "drops what attention keeps inside (its S x S scores where the kernel materializes them); costs the "
                "attention core's forward again", {"recompute": "selective"})
    if not cur.grad_ckpt:
        attempt(replace(cur, grad_ckpt=True, selective_recompute=False), "turn on activation checkpointing (--grad-ckpt)",
                "keeps one tensor per layer instead of every activation; costs ~1/3 more compute", {"grad_ckpt": True})
    if not fits and cur.micro_batch > 1:
        global_batch = cur.micro_batch * cur.grad_accum
        trial = cur
        while trial.micro_batch > 1:
            mb = trial.micro_batch // 2
            trial = replace(trial, micro_batch=mb, grad_accum=max(1, global_batch // mb))
            if ok(trial)[1]:
                break
        attempt(trial, f"use micro-batch {trial.micro_batch} with gradient accumulation x{trial.grad_accum}",
                "the same global batch in smaller pieces: activations and logits shrink with the micro-batch",
                {"batch": trial.micro_batch, "grad_accum": trial.grad_accum})
    if not fits and cur.precision in ("fp32", "amp_bf16", "amp_fp16") and gpu.supports("bf16"):
        attempt(replace(cur, precision="bf16"), "keep weights and optimizer states in bf16 (--precision bf16)",
                "halves weights, gradients and states; watch for stalled updates (use Kahan summation or "
                "stochastic rounding for long runs)", {"precision": "bf16"})
    if not fits and cur.optimizer == "adamw":
        attempt(replace(cur, optimizer="adamw8bit"), "use 8-bit AdamW (bitsandbytes)",
                "stores both Adam moments in 1 byte each", {"optimizer": "adamw8bit"})
    if not fits:
        for n in (2, 4, 8, 16, 32, 64, 128, 256):
            if n <= cur.num_gpus or n % cur.model_parallel:
                continue
            trial = replace(cur, num_gpus=n, zero_stage=3)
            try:
                peak, fits = ok(trial)
            except BadInputError:
                break
            if fits:
                cur = trial
                fixes.append(Fix(f"shard weights, gradients and states across {n} GPUs (ZeRO-3 / FSDP)",
                                 "each GPU keeps 1/N of the model state and gathers one layer at a time",
                                 peak, True, {"gpus": n, "zero": 3}))
                break
    weights_one_card = weight_bytes(m, "bf16")
    if not fits and not fits_in(weights_one_card, ctx, cap):
        tp = 2 ** math.ceil(math.log2(max(2, weights_one_card / (cap * 0.5))))
        fixes.append(Fix(f"tensor parallelism across {tp} GPUs (with pipeline or FSDP beyond)",
                         "even the 16-bit weights alone do not fit on one card",
                         int(peak), False, {"tensor_parallel": tp}))
    return fixes


def training_tips(m: ModelSpec, setup: TrainSetup, gpu: GpuSpec, eff: Efficiency, ctx: int, peak: int) -> list[str]:
    """Advice for a plan that fits: room to grow, or costs to drop."""
    tips: list[str] = []
    cap = gpu.memory_bytes
    headroom = cap - ctx - peak
    if headroom < 0.05 * cap:
        tips.append(f"Tight: only {format_bytes(headroom)} left. Fragmentation can still cause an OOM; "
                    "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True or lower the micro-batch.")
    else:
        lo, hi = setup.micro_batch, setup.micro_batch * 2
        while hi <= 4096 and fits_in(_train_mem(m, replace(setup, micro_batch=hi), gpu, eff, ctx), ctx, cap):
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            ok = fits_in(_train_mem(m, replace(setup, micro_batch=mid), gpu, eff, ctx), ctx, cap)
            lo, hi = (mid, hi) if ok else (lo, mid)
        if lo > setup.micro_batch:
            tips.append(f"Memory allows a micro-batch up to {lo} (bigger matmuls usually mean more tokens/s).")
    if setup.grad_ckpt:
        no_ck = replace(setup, grad_ckpt=False)
        if fits_in(_train_mem(m, no_ck, gpu, eff, ctx), ctx, cap):
            t0 = training_speed(m, setup, gpu, eff).step_seconds
            t1 = training_speed(m, no_ck, gpu, eff).step_seconds
            tips.append(f"It also fits without activation checkpointing, which would save ~{(1 - t1 / t0) * 100:.0f} % of the step time.")
    if setup.precision == "fp32" and gpu.supports("bf16"):
        amp = replace(setup, precision="amp_bf16")
        t0 = training_speed(m, setup, gpu, eff).step_seconds
        t1 = training_speed(m, amp, gpu, eff).step_seconds
        tips.append(f"fp32 runs on the slow non-tensor path: bf16 autocast (--precision amp_bf16) would be ~{t0 / t1:.1f}x faster.")
    return tips


def serving_fixes(m: ModelSpec, setup: ServeSetup, gpu: GpuSpec, eff: Efficiency, ctx: int) -> list[Fix]:
    cap = gpu.memory_bytes
    cur = setup
    fixes: list[Fix] = []

    def ok(s: ServeSetup) -> tuple[int, bool]:
        est = serving_memory(m, s, capacity_bytes=cap, eff=eff, cuda_context_bytes=ctx)
        return est.peak_bytes, est.fits

    peak, fits = ok(cur)
    if fits:
        return []
    order = ["fp8", "int8", "int4"] if gpu.supports("fp8") else ["int8", "int4"]
    if cur.dtype in ("fp32", "bf16", "fp16"):
        for q in order:
            trial = replace(cur, dtype=q)
            if fits_in(weight_bytes(m, q), ctx, cap * 0.9) or q == order[-1]:
                cur = trial
                peak, fits = ok(cur)
                fixes.append(Fix(f"quantize the weights to {q} (--dtype {q})",
                                 f"{q} weights take {format_bytes(weight_bytes(m, q))} instead of "
                                 f"{format_bytes(weight_bytes(m, setup.dtype))}", peak, fits, {"dtype": q}))
                break
    if not fits and cur.batch > 1:
        best = max_batch_that_fits(m, replace(cur, batch=1), cap, eff)
        if best >= 1:
            cur = replace(cur, batch=best)
            peak, fits = ok(cur)
            fixes.append(Fix(f"serve at most {best} sequences at once (--batch {best})",
                             "the KV cache and prefill logits grow with every concurrent sequence", peak, fits, {"batch": best}))
    if not fits and not fits_in(weight_bytes(m, cur.dtype), ctx, cap * 0.9):
        for tp in (2, 4, 8):
            if tensor_parallel_problem(m, tp):
                continue
            trial = replace(cur, tensor_parallel=tp)
            peak, fits = ok(trial)
            if fits:
                cur = trial
                fixes.append(Fix(f"tensor parallelism across {tp} GPUs (--tp {tp})",
                                 "the weights do not fit on one card: split every layer across GPUs", peak, True,
                                 {"tensor_parallel": tp}))
                break
    return fixes


def cross_node_tensor_parallel_tip(m: ModelSpec, setup: ServeSetup, gpu: GpuSpec, eff: Efficiency, ctx: int,
                                   wide: ServeSpeed) -> str | None:
    """A TP group wider than a node runs every layer's all-reduces over the network: price the
    same batch at one node's TP degree (when the model fits there) so the plan shows the trade.
    `wide` is the plan's own speed at `setup`."""
    node = setup.gpus_per_node
    tp = setup.tensor_parallel
    if tp <= node or setup.pipeline_parallel > 1 or tp % node or tensor_parallel_problem(m, node):
        return None
    inside = replace(setup, tensor_parallel=node)
    if not serving_memory(m, inside, capacity_bytes=gpu.memory_bytes, eff=eff, cuda_context_bytes=ctx).fits:
        return None
    narrow = serving_speed(m, inside, gpu, eff)
    text = (f"TP {tp} spans {tp // node} nodes: its all-reduces take {format_seconds(wide.tensor_parallel_seconds)} "
            f"of each {format_seconds(wide.tpot_seconds)} token over the network. TP {node} inside one node decodes "
            f"batch {setup.batch} at {format_seconds(narrow.tpot_seconds)} per token")
    if narrow.tpot_seconds < wide.tpot_seconds:
        return text + f", and {tp // node} replicas of it on the same GPUs serve {tp // node}x the requests."
    return text + "."


REPLICA_TENSOR_PARALLEL = (1, 2, 4, 8)  # the degrees a replica plan tries for each GPU


def replica_degrees(m: ModelSpec) -> list[int]:
    """The tensor-parallel degrees a replica plan tries for `m`: those its heads divide."""
    return [tp for tp in REPLICA_TENSOR_PARALLEL if not tensor_parallel_problem(m, tp)]

BATCH_PREFILL = "static batches: the whole batch prefilled together, no queueing"


@dataclass
class ReplicaOption:
    gpu: str
    tensor_parallel: int
    batch: int  # concurrent sequences per replica that meet the SLO
    replicas: int
    gpus: int
    requests_per_second_per_replica: float
    ttft_seconds: float
    tpot_seconds: float
    hourly_total: float | None
    per_million_tokens: float | None
    per_thousand_requests: float | None
    break_even_months: float | None
    currency: str | None
    # what stopped the batch from growing: "TPOT" / "TTFT" (the next batch tried, twice this one,
    # misses that target; "TTFT+TPOT" when both) or "memory" (the largest batch whose KV cache fits).
    # An engine's replica (continuous batching): what stops a higher rate per replica, the same
    # words, or "utilization" (its queue grows without bound first)
    bound_by: str = "memory"
    scheduling: str = BATCH_PREFILL  # the model the latencies come from, in words
    utilization_ratio: float | None = None  # engine: the prefill queue's rho at the planned rate
    queue_wait_seconds: float | None = None  # engine: of the TTFT, the wait for the prefill queue
    pipeline_parallel: int = 1  # stages per replica: GPUs per replica = tensor_parallel x pipeline_parallel

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ReplicaMiss:
    """Why a GPU has no replica layout: at its best tensor-parallel degree, batch 1 misses a target."""

    gpu: str
    tensor_parallel: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _missed(sp: Any, tpot_slo_s: float | None, ttft_slo_s: float | None) -> str:
    """"TTFT", "TPOT" or "TTFT+TPOT": the targets this speed misses ("" if none)."""
    miss = [name for name, got, slo in (("TTFT", sp.ttft_seconds, ttft_slo_s), ("TPOT", sp.tpot_seconds, tpot_slo_s))
            if slo and got > slo]
    return "+".join(miss)


def replica_options(m: ModelSpec, setup: ServeSetup, gpus: list[GpuSpec], effs: dict[str, Efficiency], *,
                    target_rps: float | None, tpot_slo_s: float | None, ttft_slo_s: float | None,
                    currency: str = "USD", ctx: int = 512 << 20,
                    misses: list[ReplicaMiss] | None = None) -> list[ReplicaOption]:
    """For each GPU and tensor-parallel degree: a replica's capacity within the SLO (and what bound
    it), the replicas needed for `target_rps` (one without a rate: a replica's capacity), and the
    cost; sorted cheapest (or fewest GPUs) first. hf prefills whole batches: the largest batch
    meeting the SLO sets the capacity. An engine batches continuously: its capacity is the largest
    request rate whose latencies under load meet the SLO (`_engine_replica`, plan/scheduling.py). A GPU with no layout gets a `ReplicaMiss` in
    `misses`, with the figure that misses at batch 1 on its largest degree that fits."""
    out: list[ReplicaOption] = []
    for gpu in gpus:
        eff = effs.get(gpu.name) or Efficiency()
        miss: ReplicaMiss | None = None
        found = False
        for tp in replica_degrees(m):
            s = replace(setup, tensor_parallel=tp, batch=1)
            try:
                s.validate(gpu)
            except Exception:
                break
            max_fit = max_batch_that_fits(m, s, gpu.memory_bytes, eff)
            if max_fit < 1:
                miss = ReplicaMiss(gpu.name, tp, f"one sequence does not fit at TP {tp}")
                continue
            if s.runtime != "hf":  # an engine batches continuously: latencies under load
                got = _engine_replica(m, s, gpu, eff, max_fit, target_rps=target_rps, tpot_slo_s=tpot_slo_s,
                                      ttft_slo_s=ttft_slo_s, currency=currency)
                if isinstance(got, ReplicaMiss):
                    miss = got
                else:
                    found = True
                    out.append(got)
                continue
            best = None
            bound = "memory"
            b = 1
            while b <= max_fit:
                sp = serving_speed(m, replace(s, batch=b), gpu, eff)
                missed = _missed(sp, tpot_slo_s, ttft_slo_s)
                if missed:
                    bound = missed
                    if best is None:
                        got = [f"{n} {format_seconds(v)} > {format_seconds(t)}" for n, v, t in
                               (("TTFT", sp.ttft_seconds, ttft_slo_s), ("TPOT", sp.tpot_seconds, tpot_slo_s))
                               if t and v > t]
                        miss = ReplicaMiss(gpu.name, tp, f"at TP {tp} even batch 1 misses: {', '.join(got)}")
                    break
                best = sp
                b = b * 2 if b * 2 <= max_fit or b == max_fit else max_fit
            if best is None:
                continue
            found = True
            replicas = max(1, math.ceil(target_rps / best.requests_per_second)) if target_rps else 1
            total = replicas * tp * s.pipeline_parallel
            cost = serving_cost(gpu.hourly_price, total, best.output_tokens_per_second * replicas,
                                best.requests_per_second * replicas, currency=currency, purchase_per_gpu=gpu.purchase_price)
            out.append(ReplicaOption(
                gpu=gpu.name, tensor_parallel=tp, batch=best.batch, replicas=replicas, gpus=total,
                requests_per_second_per_replica=best.requests_per_second, ttft_seconds=best.ttft_seconds,
                tpot_seconds=best.tpot_seconds, hourly_total=cost.hourly_total if cost else None,
                per_million_tokens=cost.per_million_tokens if cost else None,
                per_thousand_requests=cost.per_thousand_requests if cost else None,
                break_even_months=cost.break_even_months if cost else None, currency=currency if cost else None,
                bound_by=bound, pipeline_parallel=s.pipeline_parallel))
        if not found and misses is not None:
            misses.append(miss or ReplicaMiss(gpu.name, 0, "no tensor-parallel degree runs this model on it"))
    out.sort(key=lambda o: (o.hourly_total is None, o.hourly_total or 0.0, o.gpus))
    return out


def _engine_replica(m: ModelSpec, s: ServeSetup, gpu: GpuSpec, eff: Efficiency, max_fit: int, *,
                    target_rps: float | None, tpot_slo_s: float | None, ttft_slo_s: float | None,
                    currency: str) -> ReplicaOption | ReplicaMiss:
    """An engine replica at one TP degree: the largest request rate it serves within the targets
    with continuous batching and chunked prefill (plan/scheduling.py), the replicas for
    `target_rps`, and its latencies at the rate each replica then gets (at capacity without one)."""
    tp = s.tensor_parallel
    costs = engine_step_costs(m, s, gpu, eff)
    budget = s.step_budget_tokens
    cap = replica_capacity(costs, prompt_tokens=s.prefill_tokens, new_tokens=s.new_tokens, step_budget_tokens=budget,
                           ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s, max_concurrent=max_fit)
    if cap.requests_per_second <= 0:
        lone = cap.at_capacity
        got = [f"{n} {format_seconds(v)} > {format_seconds(t)}" for n, v, t in
               (("TTFT", lone.ttft_seconds, ttft_slo_s), ("TPOT", lone.tpot_seconds, tpot_slo_s)) if t and v > t]
        return ReplicaMiss(gpu.name, tp, f"at TP {tp} even one request alone misses: {', '.join(got) or cap.bound_by}")
    rate = cap.requests_per_second
    replicas = max(1, math.ceil(target_rps / rate)) if target_rps else 1
    # each replica then gets target_rps / replicas, within its capacity (every figure grows with the rate)
    load = under_load(costs, prompt_tokens=s.prefill_tokens, new_tokens=s.new_tokens, step_budget_tokens=budget,
                      arrival_rate_per_second=target_rps / replicas) if target_rps else cap.at_capacity
    total = replicas * tp * s.pipeline_parallel
    cost = serving_cost(gpu.hourly_price, total, rate * s.new_tokens * replicas, rate * replicas,
                        currency=currency, purchase_per_gpu=gpu.purchase_price)
    return ReplicaOption(
        gpu=gpu.name, tensor_parallel=tp, batch=max(1, math.ceil(load.concurrent_requests)), replicas=replicas,
        gpus=total, requests_per_second_per_replica=rate, ttft_seconds=load.ttft_seconds, tpot_seconds=load.tpot_seconds,
        hourly_total=cost.hourly_total if cost else None, per_million_tokens=cost.per_million_tokens if cost else None,
        per_thousand_requests=cost.per_thousand_requests if cost else None,
        break_even_months=cost.break_even_months if cost else None, currency=currency if cost else None,
        bound_by=cap.bound_by, scheduling=load.describe(), utilization_ratio=load.utilization_ratio,
        queue_wait_seconds=load.queue_wait_seconds, pipeline_parallel=s.pipeline_parallel)
