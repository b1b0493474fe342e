"""TTFT and TPOT under load for a serving engine that batches continuously with chunked prefill.

An engine (vLLM, SGLang, TGI) does not prefill a whole batch at once: each step it runs one token
for every sequence already decoding and fills the rest of a per-step token budget with prompt
tokens (a long prompt is cut into chunks over several steps). vLLM's scheduler with chunked
prefill schedules the running decodes first, then prefill chunks within `max_num_batched_tokens`
(vLLM docs, "Optimization and Tuning" / chunked prefill). Mixing decodes into a prefill chunk is
Sarathi-Serve's stall-free batching (Agrawal et al., OSDI 2024, "Taming Throughput-Latency
Tradeoff in LLM Inference with Sarathi-Serve"): decodes never wait behind a whole prompt.

The model here, per replica, with Poisson arrivals at rate lambda, prompts of P tokens, K new
tokens, a per-step budget of C tokens:

- step cost: a decode step of the running batch (`decode_step_seconds`, memory-bound: it reads
  the weights once whatever rides along) plus the prefill tokens in the step at the engine's
  prefill cost per token (compute-bound). Additive: the chunk's compute is not assumed to hide
  the decode's weight read, so this leans slow. A step with no decode costs the forward's fixed
  launch cost (`step_fixed_seconds`).
- steady state: prefill tokens per step x = lambda P T; decoding sequences N = lambda (K - 1) T
  (Little's law; the first token comes from the last prefill step). A decoding request shares its
  step with itself and the others running (Poisson with mean N: the running set is an
  M/G/infinity system, and by PASTA what an arrival sees is the time average), so its mixed step
  T = base(1 + N) + x c, solved as a fixed point T = base(1 + lambda (K - 1) T) / (1 - lambda P c).
  TPOT under load = T; at zero load it is the batch-1 decode step.
- queue: the prefill lane as an M/D/1 server (Poisson arrivals, every prompt the same length, so
  deterministic service, first come first served as vLLM's default policy). It serves prompt
  tokens at C - N per full step (decodes take their tokens of the budget first), a full step
  costing base(N) + (C - N) c: service S = P / (C - N) x that step, utilization rho = lambda S,
  wait Wq = rho S / (2 (1 - rho)) (Pollaczek-Khinchine with zero service variance). At rho >= 1
  the queue grows without bound: the result is marked unstable.
- TTFT under load = the rest of the step in progress when the request arrives (half a step when the
  engine is busy, with probability 1 - exp(-concurrency): the running set as an M/G/infinity
  system) + Wq + its own ceil(P / (C - N)) prefill steps, each the mixed step plus its chunk's
  compute (at most a full step). At zero load this is ceil(P / C) fixed costs + P c: the chunked
  prefill of one request alone.

With prefix caching (`ServeSetup.prefix_hit_ratio`, plan/serve_engines.py) P is the prompt tokens
the engine computes, (1 - R) x the prompt: they take the budget and the prefill cost (whose
attention still reads the whole context, in `serving_speed`); the cached blocks' memory is not
shared across requests here.

It is a mean-value model: no tail percentiles, no preemption when the KV pool runs out (the caller
keeps the concurrency within the pool), identical requests.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from gpulens.plan.catalog import GpuSpec
from gpulens.plan.models import ModelSpec
from gpulens.plan.serve import ServeSetup, serving_speed
from gpulens.plan.speed import Efficiency

QUEUE_MODEL = "M/D/1"
_RUNAWAY_SEQUENCES = 1 << 20  # a fixed point this large means decode throughput cannot keep up


@dataclass(frozen=True)
class StepCosts:
    """What one engine step costs on one replica (from `serve.serving_speed`)."""

    decode_step_seconds: Callable[[int], float]  # a decode step at a running batch >= 1
    prefill_seconds_per_token: float  # a prompt token's compute at the engine's prefill efficiency
    step_fixed_seconds: float  # a step with no decode: the forward's launch cost

    def base_seconds(self, decoding: float) -> float:
        """The step without its prefill tokens at a mean of `decoding` running sequences:
        linear between the integer batches, batch 0 being the fixed cost alone."""
        if decoding <= 0:
            return self.step_fixed_seconds
        lo = math.floor(decoding)
        hi_t = self.decode_step_seconds(lo + 1)
        lo_t = self.decode_step_seconds(lo) if lo >= 1 else self.step_fixed_seconds
        return lo_t + (hi_t - lo_t) * (decoding - lo)


def engine_step_costs(m: ModelSpec, setup: ServeSetup, gpu: GpuSpec, eff: Efficiency) -> StepCosts:
    """The step costs of an engine replica from the same speed model as its plan: decode steps at
    each batch (memoized: the fixed point asks for a few batches many times), and the prompt's
    cost per token, its batch-1 prefill less the forward's fixed launch cost, which a mixed step
    pays once for all its tokens."""
    rt = eff.runtime(setup.runtime)
    fixed = rt.prefill_overhead_seconds + m.num_layers * rt.decode_layer_overhead_seconds
    prefill = serving_speed(m, replace(setup, batch=1), gpu, eff).prefill_seconds
    steps: dict[int, float] = {}

    def decode_step(batch: int) -> float:
        if batch not in steps:
            steps[batch] = serving_speed(m, replace(setup, batch=batch), gpu, eff).tpot_seconds
        return steps[batch]

    return StepCosts(decode_step, max(0.0, prefill - fixed) / setup.prefill_tokens, fixed)  # per computed prompt token


@dataclass(frozen=True)
class LoadResult:
    """One replica at one arrival rate; `stable` False means the queue grows without bound
    (latencies are then infinite and `unstable_reason` says which resource ran out)."""

    arrival_rate_per_second: float
    prompt_tokens: int
    new_tokens: int
    step_budget_tokens: int  # the per-step token budget (decodes and prefill chunks together)
    stable: bool
    utilization_ratio: float  # rho of the prefill lane (M/D/1)
    decoding_sequences: float  # mean running decodes per step (Little's law)
    concurrent_requests: float  # mean requests holding KV cache (prefilling or decoding)
    prefill_tokens_per_step: float
    prefill_budget_tokens: float  # what the decodes leave of the budget
    mixed_step_seconds: float  # = TPOT under load
    queue_wait_seconds: float  # M/D/1 wait for the prefill lane
    step_alignment_seconds: float  # the rest of the step in progress at arrival
    prefill_steps: int  # steps the request's own prompt takes
    prefill_seconds: float  # its own chunked prefill
    ttft_seconds: float
    tpot_seconds: float
    request_seconds: float  # TTFT + (K - 1) TPOT
    unstable_reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """The model in words, for a replica plan."""
        return (f"continuous batching, chunked prefill budget {self.step_budget_tokens:,} tokens, {QUEUE_MODEL} queue, "
                f"utilization {self.utilization_ratio * 100:.0f} %")


def _unstable(rate: float, p: int, k: int, budget: int, rho: float, why: str) -> LoadResult:
    inf = math.inf
    return LoadResult(rate, p, k, budget, False, rho, inf, inf, inf, 0.0, inf, inf, inf, 0, inf, inf, inf, inf, why)


def under_load(costs: StepCosts, *, prompt_tokens: int, new_tokens: int, arrival_rate_per_second: float,
               step_budget_tokens: int) -> LoadResult:
    """Steady state of one replica at `arrival_rate_per_second` (the module docstring's model)."""
    lam, p, k, budget = arrival_rate_per_second, prompt_tokens, new_tokens, step_budget_tokens
    if lam < 0 or p < 1 or k < 1 or budget < 1:
        raise ValueError("rate >= 0, prompt, new tokens and budget >= 1")
    c = costs.prefill_seconds_per_token
    compute_share = lam * p * c  # of every second, what prompt compute alone takes
    if compute_share >= 1:
        return _unstable(lam, p, k, budget, compute_share, "prompt compute alone needs the whole GPU")
    # a decoding request shares each step with the others running (Poisson with mean N by PASTA, the
    # running set being M/G/infinity) and itself: it sees base(1 + N); an arriving prompt sees base(N)
    step = costs.base_seconds(1) / (1 - compute_share)
    # the decode batch grows the step, which grows the batch: iterate from below to the smallest fixed point
    decoding = 0.0
    for _ in range(500):
        decoding = lam * (k - 1) * step
        if decoding > _RUNAWAY_SEQUENCES:
            break
        nxt = costs.base_seconds(1 + decoding) / (1 - compute_share)
        if abs(nxt - step) <= 1e-12 + 1e-10 * step:
            step = nxt
            break
        step = nxt
    else:
        decoding = _RUNAWAY_SEQUENCES + 1.0
    if decoding > _RUNAWAY_SEQUENCES:
        return _unstable(lam, p, k, budget, 1.0, "decode steps cannot keep up with the arrivals")
    decoding = lam * (k - 1) * step
    base = costs.base_seconds(decoding)
    arrival_step = base / (1 - compute_share)  # the steps a new prompt's chunks run in
    prefill_budget = budget - decoding  # decodes are scheduled first (vLLM); prompts get what is left
    if prefill_budget < 1:
        return _unstable(lam, p, k, budget, 1.0, "running decodes fill the per-step token budget")
    full_step = base + prefill_budget * c
    service = p / prefill_budget * full_step
    rho = lam * service
    if rho >= 1:
        return _unstable(lam, p, k, budget, rho, "prompts arrive faster than the per-step budget prefills them")
    wait = rho * service / (2 * (1 - rho))
    chunk = max(1, math.floor(prefill_budget))
    full_chunks, rest = divmod(p, chunk)
    own = (full_chunks * min(arrival_step + chunk * c, full_step)
           + (min(arrival_step + rest * c, full_step) if rest else 0.0))
    steps = full_chunks + (1 if rest else 0)
    concurrent = lam * (own + (k - 1) * step)
    alignment = (1 - math.exp(-concurrent)) * arrival_step / 2
    ttft = alignment + wait + own
    return LoadResult(lam, p, k, budget, True, rho, decoding, concurrent, lam * p * step, prefill_budget, step, wait,
                      alignment, steps, own, ttft, step, ttft + (k - 1) * step)


@dataclass(frozen=True)
class Capacity:
    """The largest arrival rate one replica serves within the targets, and what stops more."""

    requests_per_second: float  # 0 when even a lone request misses a target
    bound_by: str  # "TTFT", "TPOT", "TTFT+TPOT", "memory" (KV pool) or "utilization" (rho -> 1)
    at_capacity: LoadResult  # the replica at that rate (at a near-zero rate when it is 0)


def _misses(r: LoadResult, ttft_slo_s: float | None, tpot_slo_s: float | None, max_concurrent: float) -> str:
    if not r.stable:
        return "utilization"
    miss = [n for n, got, slo in (("TTFT", r.ttft_seconds, ttft_slo_s), ("TPOT", r.tpot_seconds, tpot_slo_s))
            if slo and got > slo]
    if miss:
        return "+".join(miss)
    return "memory" if r.concurrent_requests > max_concurrent else ""


def replica_capacity(costs: StepCosts, *, prompt_tokens: int, new_tokens: int, step_budget_tokens: int,
                     ttft_slo_s: float | None, tpot_slo_s: float | None, max_concurrent: float) -> Capacity:
    """Bisection on the rate: every figure grows with it, so the targets hold below one rate."""
    def at(rate: float) -> LoadResult:
        return under_load(costs, prompt_tokens=prompt_tokens, new_tokens=new_tokens, arrival_rate_per_second=rate,
                          step_budget_tokens=step_budget_tokens)

    # prompt compute alone bounds the rate: lambda P c < 1
    hi = 1 / (prompt_tokens * costs.prefill_seconds_per_token) if costs.prefill_seconds_per_token > 0 else 1e6
    lo = hi * 1e-9
    lone = at(lo)
    why = _misses(lone, ttft_slo_s, tpot_slo_s, max_concurrent)
    if why:
        return Capacity(0.0, why, lone)
    why_hi = _misses(at(hi), ttft_slo_s, tpot_slo_s, max_concurrent) or "utilization"
    for _ in range(60):
        mid = math.sqrt(lo * hi) if hi / lo > 4 else (lo + hi) / 2
        why = _misses(at(mid), ttft_slo_s, tpot_slo_s, max_concurrent)
        if why:
            hi, why_hi = mid, why
        else:
            lo = mid
        if hi - lo <= 1e-6 * hi:
            break
    return Capacity(lo, why_hi, at(lo))
