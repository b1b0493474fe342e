"""Serving: weights by format, KV cache, the hf and vllm profiles, TTFT/TPOT by batch."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpulens.plan import ServeSetup, find_gpu, plan_serving, preset
from gpulens.plan.catalog import UnsupportedPrecisionError
from gpulens.plan.serve import serving_memory, serving_speed, weight_bytes
from gpulens.plan.speed import Efficiency

EFF = Efficiency()


def test_kv_cache_bytes_follow_the_formula():
    m = preset("llama-3-8b")  # 32 layers, 8 KV heads, head_dim 128
    assert m.kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2 == 131072
    assert preset("llama-2-7b").kv_bytes_per_token(2) == 2 * 32 * 32 * 128 * 2  # no GQA: 4x more


def test_quantized_weights_keep_embeddings_in_16_bit():
    m = preset("llama-3-8b")
    bf16, int8, int4 = (weight_bytes(m, d) for d in ("bf16", "int8", "int4"))
    assert bf16 == 2 * m.params
    assert int4 < int8 < bf16
    embeddings_and_head = (m.params - m.num_layers * m.layer_params()) * 2
    assert int4 > embeddings_and_head + m.num_layers * m.layer_params() * 0.5


def test_hf_prefill_pays_for_logits_of_every_prompt_position():
    m = preset("llama-3.2-1b")
    est = serving_memory(m, ServeSetup(batch=8, prompt_tokens=4096, new_tokens=32), capacity_bytes=10**12, eff=EFF)
    assert est.peak_at == "prefill logits"
    assert est.breakdown["logits"] >= 8 * 4096 * m.vocab_size * 2


def test_vllm_preallocates_and_reports_concurrency():
    m = preset("llama-3-8b")
    gpu = find_gpu("a100-80gb")
    setup = ServeSetup(batch=16, prompt_tokens=1024, new_tokens=256, runtime="vllm")
    p = plan_serving(m, setup, gpu, EFF)
    assert p.memory.peak_bytes == pytest.approx(0.9 * gpu.memory_bytes - p.memory.cuda_context_bytes, rel=0.01)
    kv_pool = p.memory.breakdown["kv_cache"]
    assert p.max_concurrency == kv_pool // (m.kv_bytes_per_token(2) * 1280)
    fp8_kv = plan_serving(m, replace(setup, kv_dtype="fp8"), find_gpu("h100-sxm"), EFF)
    bf16_kv = plan_serving(m, setup, find_gpu("h100-sxm"), EFF)
    assert fp8_kv.max_concurrency >= 2 * bf16_kv.max_concurrency - 1
    hf = plan_serving(m, replace(setup, runtime="hf"), gpu, EFF)
    assert p.max_concurrency > hf.max_batch_that_fits  # last-position logits and paging


def test_decode_is_memory_bound_and_tpot_grows_with_batch():
    m = preset("llama-3-8b")
    gpu = find_gpu("h100-sxm")
    s1 = serving_speed(m, ServeSetup(batch=1, prompt_tokens=512, new_tokens=128), gpu, EFF)
    s32 = serving_speed(m, ServeSetup(batch=32, prompt_tokens=512, new_tokens=128), gpu, EFF)
    assert s1.bound == "memory"
    # one token per step reads all weights: at least 16 GB / 3.35 TB/s
    assert s1.tpot_seconds >= 2 * m.params / gpu.memory_bandwidth_bytes_per_second
    assert s32.tpot_seconds > s1.tpot_seconds and s32.ttft_seconds > s1.ttft_seconds
    assert s32.output_tokens_per_second > 10 * s1.output_tokens_per_second


def test_largest_batch_meeting_a_tpot_target():
    m = preset("llama-3-8b")
    gpu = find_gpu("h100-sxm")
    setup = ServeSetup(batch=1, prompt_tokens=512, new_tokens=128, runtime="vllm")
    p = plan_serving(m, setup, gpu, EFF, tpot_target_seconds=0.02)
    b = p.max_batch_for_tpot
    assert b and 1 <= b <= p.max_batch_that_fits
    assert serving_speed(m, replace(setup, batch=b), gpu, EFF).tpot_seconds <= 0.02
    if b < p.max_batch_that_fits:
        assert serving_speed(m, replace(setup, batch=b + 1), gpu, EFF).tpot_seconds > 0.02


def test_fp8_weights_on_a_card_without_fp8():
    with pytest.raises(UnsupportedPrecisionError):
        plan_serving(preset("llama-3-8b"), ServeSetup(dtype="fp8"), find_gpu("a100-80gb"), EFF)
    plan_serving(preset("llama-3-8b"), ServeSetup(dtype="fp8"), find_gpu("h100-sxm"), EFF)
