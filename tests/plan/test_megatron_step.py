"""Megatron-LM's step beyond the evenly spread model (plan/megatron_step.py): the output layer on
the last pipeline stage, which sets the 1F1B pace. Hand values and trends."""

from __future__ import annotations

import pytest

from gpulens.plan import PlanRequest, TrainSetup, plan, preset
from gpulens.plan.activations import _loss_bytes
from gpulens.plan.catalog import find_gpu
from gpulens.plan.megatron_step import output_layer_seconds, pipeline_step_seconds
from gpulens.plan.memory import megatron_stage_params

# llama-3-70b (80 layers, V = 128256, h = 8192) on 32 H100s: TP 8 x PP 4, m = 8
PIPE = dict(model="llama-3-70b", gpu="h100-sxm", gpus=32, tensor_parallel=8, pipeline_parallel=4, grad_accum=8,
            batch=1, seq=4096, sequence_parallel=True, zero=1)


def _speed(**kw):
    return plan(PlanRequest(**{**PIPE, **kw})).speed


def test_output_layer_hand_values_full_recompute():
    m = preset("llama-3-70b")
    setup = TrainSetup(micro_batch=1, seq_len=4096, grad_accum=8, num_gpus=32, tensor_parallel=8, pipeline_parallel=4,
                       grad_ckpt=True)
    head = output_layer_seconds(m, setup, "amp_bf16", matmul_flops_per_second=1e15, bandwidth_bytes_per_second=1e12)
    hv_tokens = 8192 * 128256 * 4096
    # the last stage: 6 h V per token over its 8 TP ranks, never recomputed
    assert head.last_stage_compute_seconds == pytest.approx(6 * hv_tokens / 1e15 / 8)
    # what the spread model counted: 6 h V (never recomputed: speed.train_flops_per_token) over all 32 GPUs
    assert head.spread_compute_seconds == pytest.approx(6 * hv_tokens / 1e15 / 32)
    loss = 3 * _loss_bytes(m, "amp_bf16", 4096, "torch")
    assert head.last_stage_memory_seconds == pytest.approx(loss / 1e12 / 8)
    assert head.spread_memory_seconds == pytest.approx(1.5 * loss / 1e12 / 32)


def test_pipeline_step_runs_m_slots_at_the_last_stage_and_the_bubble_at_the_others():
    m = preset("llama-3-70b")
    setup = TrainSetup(micro_batch=1, seq_len=4096, grad_accum=8, num_gpus=32, tensor_parallel=8, pipeline_parallel=4)
    head = output_layer_seconds(m, setup, "amp_bf16", matmul_flops_per_second=1e15, bandwidth_bytes_per_second=1e12)
    per_micro = 0.5
    step, d_compute, d_memory = pipeline_step_seconds(per_micro, head, 8, 3)
    body = per_micro - head.spread_seconds
    assert step == pytest.approx(8 * (body + head.last_stage_seconds) + 3 * body)
    assert step == pytest.approx(11 * per_micro + d_compute + d_memory)
    assert pipeline_step_seconds(per_micro, None, 8, 3) == (11 * per_micro, 0.0, 0.0)


def test_plan_reports_the_last_stage_head_and_a_slower_step_than_the_even_spread():
    s = _speed()
    gpu = find_gpu("h100-sxm")
    assert s["output_layer_last_stage_seconds"] > 0
    # the head alone on the last stage, m micro-batches: at least 6 h V tokens / (t x matmul peak)
    floor = 8 * 6 * 8192 * 128256 * 4096 / 8 / gpu.peak_flops("bf16")
    assert s["output_layer_last_stage_seconds"] > floor
    # deeper pipelines leave the whole head on the last stage
    deeper = _speed(gpus=64, pipeline_parallel=8)
    assert s["output_layer_last_stage_seconds"] == pytest.approx(deeper["output_layer_last_stage_seconds"])


def test_a_larger_vocabulary_slows_a_pipeline_by_its_last_stage_not_by_one_pth():
    # two runs that differ only in p: the head's share of the step is set by the last stage, so
    # going from p = 2 to p = 4 removes about half the layers' time but none of the head's
    two, four = _speed(gpus=16, pipeline_parallel=2), _speed(gpus=32, pipeline_parallel=4)
    assert two["output_layer_last_stage_seconds"] == pytest.approx(four["output_layer_last_stage_seconds"])
    assert four["compute_seconds"] > 0.5 * two["compute_seconds"]


# ---------------------------------------------------------------- gradient accumulation traffic


def test_grad_accumulation_bytes_by_framework():
    from gpulens.plan.grad_accumulation import grad_accumulation
    from gpulens.plan.memory import megatron_stage_params

    m = preset("llama-3-8b")
    # PyTorch AccumulateGrad under autocast: fp32 .grad += new, 3 x 4 bytes, micro-batches 2..4
    acc = grad_accumulation(m, TrainSetup(grad_accum=4))
    assert acc.bytes_per_accumulation == pytest.approx(12 * m.params) and acc.accumulations_per_step == 3
    assert not acc.every_micro_batch
    assert grad_accumulation(m, TrainSetup(grad_accum=1)) is None  # nothing to add into
    # FSDP FULL_SHARD: the fp32 shard, 1/8 of the parameters
    acc = grad_accumulation(m, TrainSetup(grad_accum=4, zero_stage=3, num_gpus=8))
    assert acc.bytes_per_accumulation == pytest.approx(12 * m.params / 8)
    # DeepSpeed's engines: not priced
    assert grad_accumulation(m, TrainSetup(grad_accum=4, zero_stage=2, num_gpus=8, zero_layout="deepspeed")) is None
    # Megatron: 6 bytes per parameter of the stage, every micro-batch (the first too)
    mega = TrainSetup(grad_accum=8, num_gpus=32, tensor_parallel=8, pipeline_parallel=4)
    acc = grad_accumulation(m, mega)
    assert acc.bytes_per_accumulation == pytest.approx(6 * megatron_stage_params(m, mega))
    assert acc.accumulations_per_step == 8 and acc.every_micro_batch


def test_grad_accumulation_adds_its_traffic_to_the_step():
    req = dict(model="llama-3-8b", gpu="h100-sxm", batch=1, seq=2048, grad_ckpt=True)
    one, four = plan(PlanRequest(**req, grad_accum=1)).speed, plan(PlanRequest(**req, grad_accum=4)).speed
    m, gpu = preset("llama-3-8b"), find_gpu("h100-sxm")
    assert one["grad_accumulation_seconds"] == 0
    expected = 3 * 12 * m.params / (gpu.memory_bandwidth_bytes_per_second * 0.35)
    assert four["grad_accumulation_seconds"] == pytest.approx(expected, rel=1e-6)
    assert four["memory_seconds"] > expected  # part of the step's memory time


def test_megatron_accumulation_rides_the_wgrad_gemm_epilogue():
    """After the mainloop on an A100 (its bytes at the datasheet bandwidth); overlapped with the next
    tile's mainloop on an H100, so only what it adds to the GEMM's roofline: nothing at 4k tokens."""
    m = preset("llama-3-70b")
    a100 = _speed(gpu="a100-80gb")
    params = megatron_stage_params(m, TrainSetup(grad_accum=8, num_gpus=32, tensor_parallel=8, pipeline_parallel=4))
    assert a100["grad_accumulation_seconds"] == pytest.approx(8 * 6 * params / find_gpu("a100-80gb").memory_bandwidth_bytes_per_second)
    assert _speed()["grad_accumulation_seconds"] == 0.0  # 2 x 4096 FLOPs per parameter hide 6 bytes on an H100
    tiny = _speed(seq=64, sequence_parallel=False)["grad_accumulation_seconds"]  # 128 FLOPs a parameter do not
    assert tiny > 0


# ---------------------------------------------------------------- scatter/gather pipeline sends


def test_scatter_gather_send_hand_value():
    from gpulens.plan.links import ring_gather_or_scatter
    from gpulens.plan.megatron_step import scatter_gather_p2p_seconds

    gpu = find_gpu("a100-80gb")
    msg = 1 * 2048 * 25600 * 2  # the 1T model's b s h in 16-bit
    setup = TrainSetup(num_gpus=16, tensor_parallel=8, pipeline_parallel=2)
    gather = ring_gather_or_scatter(msg, 8, gpu).seconds
    assert scatter_gather_p2p_seconds(msg, setup, gpu, 24e9) == pytest.approx(msg / 8 / 24e9 + gather)
    # far below the whole tensor over one NIC, which the planner priced before
    assert scatter_gather_p2p_seconds(msg, setup, gpu, 24e9) < msg / 24e9 / 3
    # sequence parallelism: s/t per rank, no gather
    sp = TrainSetup(num_gpus=16, tensor_parallel=8, pipeline_parallel=2, sequence_parallel=True)
    assert scatter_gather_p2p_seconds(msg, sp, gpu, 24e9) == pytest.approx(msg / 8 / 24e9)


def test_plan_pipeline_sends_without_sequence_parallelism_cost_a_gather_more_than_with_it():
    no_sp, sp = _speed(sequence_parallel=False), _speed()
    assert no_sp["pipeline_p2p_seconds"] > sp["pipeline_p2p_seconds"]
    assert no_sp["pipeline_p2p_seconds"] < 3 * sp["pipeline_p2p_seconds"]  # not t = 8 times
