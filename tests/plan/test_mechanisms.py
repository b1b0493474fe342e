"""The memory and speed models follow the mechanisms, so their derivatives are exact and checkable
on configurations that were never measured."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpulens.plan import TrainSetup, find_gpu, preset, training_memory, training_speed
from gpulens.plan.memory import attention_kernel, layer_activation_bytes
from gpulens.plan.speed import Efficiency, train_flops_per_token

CAP = 10**15  # a huge card: these tests look at bytes, not at fitting


def peak(m, **kw):
    return training_memory(m, TrainSetup(**kw), capacity_bytes=CAP)


def test_activation_and_loss_memory_are_linear_in_tokens():
    m = preset("llama-3.2-1b")
    a = peak(m, precision="bf16", micro_batch=2, seq_len=1024)
    b = peak(m, precision="bf16", micro_batch=4, seq_len=1024)
    c = peak(m, precision="bf16", micro_batch=6, seq_len=1024)
    assert a.peak_at == b.peak_at == c.peak_at == "backward start"
    assert b.peak_bytes - a.peak_bytes == c.peak_bytes - b.peak_bytes
    # the loss alone: fp32 log-softmax output, its gradient and the logits' gradient
    assert b.breakdown["logits_and_loss"] - a.breakdown["logits_and_loss"] == 12 * 2 * 1024 * m.vocab_size


def test_autocast_saves_one_cast_per_linear_and_keeps_weight_copies():
    m = preset("llama-3-8b")
    amp = layer_activation_bytes(m, "amp_bf16", 1, 1)
    half = layer_activation_bytes(m, "bf16", 1, 1)
    h = m.hidden_size
    # q, k, v and gate, up each save their own bf16 copy (2 bytes) of the fp32 norm output, where
    # pure bf16 shares one: 26 h bytes per token of norms against 16 h
    assert amp["norms"] == 26 * h and half["norms"] == 16 * h
    assert amp["mlp"] == half["mlp"] == 4 * 2 * m.intermediate_size
    assert amp["attention"] == half["attention"]
    amp_peak = peak(m, precision="amp_bf16", micro_batch=4, seq_len=2048)
    assert amp_peak.breakdown["autocast_weight_copies"] == 2 * m.linear_params


def test_checkpointing_keeps_one_tensor_per_layer():
    m = preset("llama-3-8b")
    full = peak(m, precision="bf16", micro_batch=8, seq_len=8192)
    ck = peak(m, precision="bf16", micro_batch=8, seq_len=8192, grad_ckpt=True)
    assert ck.peak_at == full.peak_at == "backward start"
    assert ck.breakdown["activations"] < full.breakdown["activations"] / 10
    layer_inputs = m.num_layers * 8 * 8192 * m.hidden_size * 2
    assert layer_inputs <= ck.breakdown["activations"] < layer_inputs * 1.2


def test_zero_stages_shard_what_they_promise():
    m = preset("llama-3-8b")
    base = dict(precision="amp_bf16", micro_batch=1, seq_len=512, num_gpus=8)
    z1, z2, z3 = (peak(m, **base, zero_stage=s) for s in (1, 2, 3))
    assert z1.candidates["optimizer step"] > z2.candidates["optimizer step"] > z3.candidates["optimizer step"]
    one = peak(m, precision="amp_bf16", micro_batch=1, seq_len=512)
    assert z3.breakdown["optimizer_states"] == pytest.approx(one.breakdown["optimizer_states"] / 8, rel=1e-6)


def test_gradient_accumulation_keeps_gradients_alive_in_the_forward():
    m = preset("llama-3.2-1b")
    one = peak(m, precision="bf16", micro_batch=2, seq_len=1024)
    acc = peak(m, precision="bf16", micro_batch=2, seq_len=1024, grad_accum=4)
    assert acc.breakdown.get("gradients", 0) == m.params * 2
    assert acc.peak_bytes - one.peak_bytes == m.params * 2


def test_optimizers_states():
    m = preset("llama-3.2-1b")
    states = {o: peak(m, precision="amp_bf16", optimizer=o, micro_batch=1, seq_len=64).candidates["optimizer step"]
              for o in ("adamw", "sgd", "sgd-momentum", "adamw8bit", "adafactor")}
    assert states["adamw"] > states["sgd-momentum"] > states["adamw8bit"] > states["sgd"]
    assert states["adafactor"] < states["sgd-momentum"]


def test_fp32_gqa_falls_back_to_the_math_kernel():
    gqa, mha = preset("llama-3.2-1b"), preset("llama-2-7b")
    assert attention_kernel(gqa, "fp32") == "math" and attention_kernel(gqa, "amp_bf16") == "flash"
    assert attention_kernel(mha, "fp32") == "efficient"
    short = layer_activation_bytes(gqa, "fp32", 1, 1024)["attention"]
    long = layer_activation_bytes(gqa, "fp32", 1, 2048)["attention"]
    assert long > 2.5 * short  # quadratic term


def test_flops_per_token_is_6n_plus_attention():
    m = preset("llama-3-8b")
    f = train_flops_per_token(m, 4096)
    assert f == 6 * m.matmul_params + 12 * m.num_layers * m.num_heads * m.head_dim * 4096
    assert train_flops_per_token(m, 4096, recompute=True) > f


def test_speed_scales_with_the_card():
    m = preset("llama-3-8b")
    s = TrainSetup(precision="bf16", micro_batch=1, seq_len=2048, grad_ckpt=True)
    eff = Efficiency()
    h100 = training_speed(m, s, find_gpu("h100-sxm"), eff)
    a100 = training_speed(m, s, find_gpu("a100-80gb"), eff)
    assert 2.0 < a100.step_seconds / h100.step_seconds < 3.5  # 989 vs 312 TFLOP/s, plus memory-bound parts
    ddp = training_speed(m, replace(s, num_gpus=8), find_gpu("h100-sxm"), eff)
    assert 6 * h100.tokens_per_second < ddp.tokens_per_second <= 8 * h100.tokens_per_second
    # over PCIe the gradient all-reduce no longer hides behind the backward
    pcie = training_speed(m, replace(s, num_gpus=8, seq_len=256), find_gpu("h100-pcie"), eff)
    # (over NVLink it hides, costing only the compute it slows while it runs: plan/overlap.py)
    assert pcie.communication_seconds > 10 * ddp.communication_seconds > 0
