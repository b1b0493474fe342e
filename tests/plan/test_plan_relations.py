"""Relations between two plans that hold whatever the constants are, checked on generated set-ups
(a sceptic's test: no figure is assumed, only that a plan moves the right way): a larger batch or
sequence never lowers the peak, checkpointing never raises it nor speeds the step, each ZeRO stage
holds no more than the one before, selective recomputation sits between none and full (it found the
top layer's backward, the output head's gradient beside every saved activation, priced only for
recomputing plans: a plan without recomputation now has that moment too), a larger
serving batch never lowers TPOT, a longer prompt never lowers TTFT, an FP8 KV cache never raises
the peak, and every replica layout meets the targets it was planned for. A run of 5,000 pairs and
1,500 chains found none broken (QLoRA above LoRA at long sequences is bitsandbytes keeping each NF4
Linear's input: tests/plan/test_qlora_saved_inputs.py)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpulens.errors import GpulensError
from gpulens.plan import PlanRequest, plan
from gpulens.plan.activations import recomputed_attention_bytes

RELATIONS = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
MODELS = ["qwen2.5-0.5b", "llama-3.2-1b", "qwen2.5-7b", "gemma-2-9b", "llama-3-8b", "mixtral-8x7b"]
GPUS = ["h100-sxm", "a100-40gb", "a100-80gb", "l40s", "h200", "mi300x", "l4"]

training = st.builds(
    PlanRequest, model=st.sampled_from(MODELS), gpu=st.sampled_from(GPUS), workload=st.just("train"),
    batch=st.sampled_from([1, 2, 4]), seq=st.sampled_from([512, 1024, 2048]),
    precision=st.sampled_from(["amp_bf16", "bf16"]), grad_ckpt=st.booleans(), gpus=st.sampled_from([1, 8]),
    zero=st.sampled_from([0, 1, 3]),
)
serving = st.builds(
    PlanRequest, model=st.sampled_from(MODELS), gpu=st.sampled_from(GPUS), workload=st.just("infer"),
    batch=st.sampled_from([1, 4, 16]), prompt=st.sampled_from([128, 1000]), new_tokens=st.sampled_from([32, 256]),
    runtime=st.just("hf"), dtype=st.sampled_from(["bf16", "int8", "int4"]),
)
GiB = 1 << 30


def _plan(req: PlanRequest):
    try:
        return plan(req)
    except GpulensError:  # a set-up the planner refuses says so in one sentence; no relation to check
        return None


def _pair(req: PlanRequest, **change):
    a, b = _plan(req), _plan(replace(req, **change))
    return (a, b) if a is not None and b is not None else (None, None)


@RELATIONS
@given(training)
def test_a_larger_batch_or_sequence_never_lowers_the_peak(req):
    for change in ({"batch": req.batch * 2}, {"seq": req.seq * 2}):
        a, b = _pair(req, **change)
        if a is not None:
            assert b.memory.peak_bytes >= a.memory.peak_bytes, change
            assert b.speed["step_seconds"] > a.speed["step_seconds"], change


@RELATIONS
@given(training)
def test_checkpointing_never_raises_the_peak_nor_speeds_the_step(req):
    a, b = _pair(replace(req, grad_ckpt=False, recompute="none"), grad_ckpt=True, recompute="full")
    if a is not None:
        assert b.memory.peak_bytes <= a.memory.peak_bytes
        assert b.speed["step_seconds"] >= a.speed["step_seconds"]


@RELATIONS
@given(training)
@example(PlanRequest(model="qwen2.5-7b", gpu="h100-sxm", workload="train", gpus=8, precision="bf16", batch=1, seq=512, zero=3))
def test_selective_recomputation_sits_between_none_and_full(req):
    base = replace(req, grad_ckpt=False)
    plans = [_plan(replace(base, recompute=r, grad_ckpt=r == "full")) for r in ("none", "selective", "full")]
    if all(plans):
        none, selective, full = plans
        # selective keeps a subset of what none keeps and brings one layer's attention core back at a time:
        # under flash attention the subset is nearly all (the core's output is o_proj's saved input anyway),
        # so that one layer's core is all it may hold above none
        one_core = recomputed_attention_bytes(none.model, req.precision, req.batch, req.seq)
        assert full.memory.peak_bytes <= selective.memory.peak_bytes <= none.memory.peak_bytes + one_core
        assert none.speed["step_seconds"] <= selective.speed["step_seconds"] <= full.speed["step_seconds"]


@RELATIONS
@given(training)
def test_each_zero_stage_holds_no_more_than_the_one_before(req):
    plans = [_plan(replace(req, gpus=8, zero=z)) for z in (0, 1, 2, 3)]
    peaks = [p.memory.peak_bytes for p in plans if p is not None]
    assert peaks == sorted(peaks, reverse=True)


@RELATIONS
@given(serving)
def test_a_larger_serving_batch_or_prompt_never_helps_latency(req):
    a, b = _pair(req, batch=req.batch * 2)
    if a is not None:
        assert b.memory.peak_bytes >= a.memory.peak_bytes
        assert b.speed["tpot_seconds"] >= a.speed["tpot_seconds"]
    a, b = _pair(req, prompt=req.prompt * 2)
    if a is not None:
        assert b.speed["ttft_seconds"] >= a.speed["ttft_seconds"] and b.memory.peak_bytes >= a.memory.peak_bytes


@RELATIONS
@given(serving)
def test_an_fp8_kv_cache_never_raises_the_peak(req):
    a, b = _pair(req, kv_dtype="fp8")
    if a is not None:
        assert b.memory.peak_bytes <= a.memory.peak_bytes


@RELATIONS
@given(serving, st.sampled_from(["vllm", "sglang", "trtllm"]), st.sampled_from([0.5, 5.0, 50.0]),
       st.sampled_from([None, 0.03, 0.1]), st.sampled_from([None, 0.3, 2.0]))
def test_every_replica_layout_meets_the_targets_it_was_planned_for(req, runtime, rps, tpot, ttft):
    res = _plan(replace(req, runtime=runtime, target_requests_per_second=rps, tpot_target_seconds=tpot,
                        ttft_target_seconds=ttft))
    if res is None:
        return
    assert res.replicas or res.replica_misses  # a layout, or the reason there is none
    for r in res.replicas:
        assert r.replicas * r.requests_per_second_per_replica >= rps * (1 - 1e-9)
        assert tpot is None or r.tpot_seconds <= tpot * (1 + 1e-9)
        assert ttft is None or r.ttft_seconds <= ttft * (1 + 1e-9)
        assert r.gpus == r.replicas * r.tensor_parallel * r.pipeline_parallel


megatron = st.builds(
    PlanRequest, model=st.sampled_from(["llama-3-8b", "qwen2.5-7b", "llama-3-70b"]), gpu=st.sampled_from(["h100-sxm", "a100-80gb"]),
    workload=st.just("train"), gpus=st.sampled_from([8, 16]), precision=st.just("bf16"), batch=st.sampled_from([1, 2]),
    seq=st.sampled_from([2048, 4096]), grad_accum=st.sampled_from([1, 8]), grad_ckpt=st.booleans(), zero=st.sampled_from([0, 1]),
    megatron_core=st.just(True),
)
engines = st.builds(
    PlanRequest, model=st.sampled_from(MODELS), gpu=st.sampled_from(GPUS), workload=st.just("infer"),
    runtime=st.sampled_from(["vllm", "sglang", "trtllm", "tgi"]), batch=st.sampled_from([1, 8, 64]),
    prompt=st.sampled_from([128, 1000]), new_tokens=st.sampled_from([64, 256]), dtype=st.sampled_from(["bf16", "fp8", "int4"]),
)


@RELATIONS
@given(megatron)
def test_each_megatron_split_holds_no_more_on_a_gpu(req):
    for change in ("tensor_parallel", "pipeline_parallel"):
        plans = [_plan(replace(req, **{change: d})) for d in (1, 2, 4)]
        peaks = [p.memory.peak_bytes for p in plans if p is not None]
        assert peaks == sorted(peaks, reverse=True), change


@RELATIONS
@given(engines)
def test_an_engine_plan_moves_the_right_way(req):
    a, b = _pair(req, batch=req.batch * 2)
    if a is not None:
        assert b.speed["tpot_seconds"] >= a.speed["tpot_seconds"]
    a, b = _pair(req, prompt=req.prompt * 2)
    if a is not None:  # a longer prompt takes longer to prefill and leaves room for fewer sequences
        assert b.speed["ttft_seconds"] >= a.speed["ttft_seconds"]
        assert b.speed["max_batch_that_fits"] <= a.speed["max_batch_that_fits"]
    a, b = _pair(req, kv_dtype="fp8")
    if a is not None:  # half the bytes a token: the same pool holds at least as many sequences
        assert b.speed["max_batch_that_fits"] >= a.speed["max_batch_that_fits"]
