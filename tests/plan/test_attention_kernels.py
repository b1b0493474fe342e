"""The attention core priced at its kernel's measured speed, and the matmuls at the GPU's measured
matmul ceiling (plan/kernels.py): the charts' numbers come back where they were measured, the
kernels that have no benchmark on a GPU leave the attention with the matmuls, and the choice is an
option of the plan."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpulens.errors import BadInputError
from gpulens.plan import PlanRequest, find_gpu, from_hf_config, plan, preset
from gpulens.plan.calibration import load_efficiency
from gpulens.plan.kernels import MATMUL_CEILING, attention_flops_run, attention_rate, kernel_head_dim
from gpulens.plan.memory import TrainSetup, megatron_activation_bytes, training_memory
from gpulens.plan.published import _request, load_figures
from gpulens.plan.request import PlanOptions
from gpulens.plan.speed import Efficiency, default_efficiency, training_speed

MPT_1B = {"model_type": "gpt2", "n_embd": 2048, "n_head": 16, "n_layer": 24, "vocab_size": 50368,
          "n_positions": 65536, "activation_function": "gelu"}  # head_dim 128


def _rate(kernel: str, gpu: str, head_dim: int, seq: int) -> float | None:
    g = find_gpu(gpu)
    r = attention_rate(kernel, g, head_dim, seq, g.peak_flops("bf16"))
    return None if r is None else r.flops_per_second / 1e12


def test_the_charts_figures_come_back_where_they_were_measured():
    # FlashAttention-2 paper, fwd + bwd, causal: A100 80GB SXM4 (peak 312) and H100 80GB SXM5 (989.5)
    assert _rate("flash2", "a100-80gb", 128, 16384) == pytest.approx(189)
    assert _rate("flash1", "a100-80gb", 64, 2048) == pytest.approx(77)
    assert _rate("flash1", "a100-80gb", 128, 512) == pytest.approx(55)
    assert _rate("flash2", "h100-sxm", 128, 8192) == pytest.approx(308)
    assert _rate("flash1", "h100-sxm", 64, 16384) == pytest.approx(156)


def test_between_and_beyond_the_measured_points():
    mid = _rate("flash2", "a100-80gb", 96, 16384)
    assert mid == pytest.approx((171 + 189) / 2)  # linear in head_dim
    assert _rate("flash2", "a100-80gb", 128, 2896) == pytest.approx((155 + 173) / 2, rel=0.01)  # log2 of the length
    assert _rate("flash2", "a100-80gb", 128, 65536) == pytest.approx(189)  # the 16k plateau, not extrapolated
    assert _rate("flash2", "a100-80gb", 128, 128) == pytest.approx(99)


def test_same_chip_cards_scale_the_share_by_their_own_peak():
    # an A100 40GB has the A100 80GB's chip and peak; an H100 PCIe the H100's chip at a lower peak
    assert _rate("flash2", "a100-40gb", 128, 16384) == pytest.approx(189)
    h100_pcie = find_gpu("h100-pcie")
    assert _rate("flash2", "h100-pcie", 128, 8192) == pytest.approx(308 / 989.5 * h100_pcie.peak_flops("bf16") / 1e12)


def test_the_triton_port_is_priced_as_v1_and_unbenchmarked_gpus_get_none():
    # the paper's "Triton" bars are OpenAI Triton's triton.ops.flash_attention (benchmark_causal.py at
    # 4f285b35), not flash_attn_triton.py, whose docstring puts it just below v1's CUDA kernels: v1's
    # rate at head_dim 64
    assert _rate("triton", "a100-80gb", 64, 16384) == _rate("flash1", "a100-80gb", 64, 16384) == pytest.approx(97)
    assert _rate("triton", "h100-sxm", 64, 4096) == _rate("flash1", "h100-sxm", 64, 4096) == pytest.approx(138)
    # above 64 it scales as the Triton kernel it grew from does (A100 bars 76 -> 74 at 4k, 80 -> 80
    # at 16k), not as v1's CUDA kernels (87 -> 76, 97 -> 83)
    assert _rate("triton", "a100-80gb", 128, 4096) == pytest.approx(87 * 74 / 76)
    assert _rate("triton", "a100-80gb", 128, 16384) == pytest.approx(97)
    assert _rate("triton", "h100-sxm", 128, 4096) == pytest.approx(138 * 74 / 76)
    assert _rate("triton", "a100-80gb", 128, 512) == pytest.approx(58 * 50 / 59)  # short: below v1's 55
    assert _rate("flash2", "l4", 128, 4096) is None
    assert _rate("flash2", "mi300x", 128, 4096) is None


def test_flash_flop_count_is_the_benchmarks():
    # forward 4 H Q S / 2 (causal), backward 2.5 x; recomputation runs the forward once more
    assert attention_flops_run(1, 1, 128, 1024, recompute=False) == pytest.approx(3.5 * 4 * 128 * 1024 / 2)
    assert attention_flops_run(1, 1, 128, 1024, recompute=True) == pytest.approx(4.5 * 4 * 128 * 1024 / 2)


def test_training_speed_prices_the_attention_at_the_kernel():
    m = from_hf_config(MPT_1B, name="mpt-1b")
    gpu, eff = find_gpu("h100-sxm"), Efficiency()
    setup = TrainSetup("amp_bf16", "adamw", 1, 32768, attention_kernel="flash2")
    fa2 = training_speed(m, setup, gpu, eff)
    tri = training_speed(m, replace(setup, attention_kernel="triton"), gpu, eff)
    assert fa2.attention_kernel == "flash2" and tri.attention_kernel == "triton"
    # at 32k tokens the attention core dominates: v1-generation kernels (~14 % of an H100's peak)
    # (~16 % at hd 64) against FlashAttention-2 (~33 %) make the step much longer
    assert tri.attention_seconds == pytest.approx(fa2.attention_seconds * 328 / 156, rel=1e-6)  # v1 at hd 64, 16k
    assert tri.step_seconds > 1.6 * fa2.step_seconds
    assert 0 < fa2.attention_seconds < fa2.compute_seconds
    # fp32 has no flash kernel, and an unbenchmarked GPU keeps the attention with the matmuls
    assert training_speed(m, replace(setup, precision="fp32"), gpu, eff).attention_kernel == ""
    assert training_speed(m, setup, find_gpu("l4"), eff).attention_seconds == 0.0


def test_a_head_dim_between_tiles_costs_the_wider_tile():
    # flash-attn v1.0.9 dispatches d <= 32 / 64 / 128, v2.0.0 adds 96, 160, 192, 224, 256, and the
    # Triton port pads to the next power of two: 80 runs as 96 (v2) or 128 (v1, Triton)
    assert [kernel_head_dim("flash2", d) for d in (64, 80, 96, 112, 200)] == [64, 96, 96, 128, 224]
    assert [kernel_head_dim("flash1", d) for d in (40, 80, 128)] == [64, 128, 128]
    assert [kernel_head_dim("triton", d) for d in (8, 80, 128)] == [16, 128, 128]
    assert kernel_head_dim("eager", 80) == 80
    narrow = {**MPT_1B, "n_head": 20, "n_embd": 2240}  # head_dim 112, Triton's 128 tile
    wide = {**MPT_1B, "n_head": 20, "n_embd": 2560}  # head_dim 128
    gpu, setup = find_gpu("a100-80gb"), TrainSetup("amp_bf16", "adamw", 1, 16384, attention_kernel="triton")
    t112 = training_speed(from_hf_config(narrow, name="hd112"), setup, gpu, Efficiency()).attention_seconds
    t128 = training_speed(from_hf_config(wide, name="hd128"), setup, gpu, Efficiency()).attention_seconds
    assert t112 == pytest.approx(t128)  # the same 20 heads of 128 columns, 16 of them zeros


def test_auto_is_sdpas_flash_backend_in_16_bit():
    m = from_hf_config(MPT_1B, name="mpt-1b")
    sp = training_speed(m, TrainSetup("amp_bf16", "adamw", 2, 4096), find_gpu("a100-80gb"), Efficiency())
    assert sp.attention_kernel == "flash2" and "A100 80GB SXM4" in sp.attention_source


def test_uncalibrated_matmuls_run_at_the_measured_ceiling():
    a100 = default_efficiency(find_gpu("a100-80gb"))
    assert a100.compute_ratio == pytest.approx(271.2 / 312) and not a100.calibrated
    assert "not calibrated" in a100.source
    assert default_efficiency(find_gpu("h200")).compute_ratio == MATMUL_CEILING["H100-SXM"]
    assert default_efficiency(find_gpu("l4")) == Efficiency()  # no measurement: the generic default
    assert load_efficiency(find_gpu("a100-40gb"), path=Path("/nonexistent/c.json")) == default_efficiency(
        find_gpu("a100-40gb"))


def test_the_option_reaches_the_plan_and_is_checked():
    req = PlanOptions(model="llama-3.2-1b", attention_kernel="Triton", seq=8192, batch=1).to_request("h100-sxm")
    assert req.attention_kernel == "triton"
    res = plan(req, calibration_path=Path("/nonexistent/c.json"))
    assert res.speed["attention_kernel"] == "triton" and res.speed["attention_seconds"] > 0
    with pytest.raises(BadInputError, match="attention kernel"):
        plan(replace(req, attention_kernel="flash9"), calibration_path=Path("/nonexistent/c.json"))
    with pytest.raises(BadInputError, match="training option"):
        PlanOptions(model="llama-3.2-1b", workload="infer", attention_kernel="flash1").to_request("h100-sxm")


def test_llm_foundry_figures_are_planned_with_the_triton_kernel_they_ran():
    figs = [f for f in load_figures() if f["kind"] == "training_time"]
    foundry = [f for f in figs if f["source"].get("repo") == "mosaicml/llm-foundry"]
    assert foundry and all(_request(f).attention_kernel == "triton" for f in foundry)
    # NeMo 24.07's Megatron-Core runs: Transformer Engine's fused attention, cuDNN's backend on H100
    nemo = [f for f in figs if f["id"].startswith("nemo-24.07-")]
    assert nemo and all(_request(f).attention_kernel == "cudnn" for f in nemo)
    # Megatron-LM's 2022 figures ran unfused attention (the paper's 5as/h activation term): eager
    assert all(_request(f).attention_kernel == "eager" for f in figs if f not in foundry and f not in nemo)
    assert isinstance(PlanRequest(model="7b").attention_kernel, str)


def test_eager_attention_keeps_the_scores_and_prices_them_as_traffic():
    """--attention-kernel eager: the S x S scores, softmax and dropout in memory (saved for the
    backward and read and written as traffic), the attention FLOPs at the matmuls' rate."""
    m = preset("llama-3-8b")
    h100 = find_gpu("h100-sxm")
    flash = TrainSetup("bf16", "adamw", 1, 4096)
    eager = replace(flash, attention_kernel="eager")
    mem_f = training_memory(m, flash, capacity_bytes=h100.memory_bytes)
    mem_e = training_memory(m, eager, capacity_bytes=h100.memory_bytes)
    scores = m.num_layers * m.num_heads * 4096 * 4096 * 2  # at least one 16-bit S x S tensor a layer
    assert mem_e.breakdown["activations"] - mem_f.breakdown["activations"] > scores
    sp_f = training_speed(m, flash, h100, Efficiency())
    sp_e = training_speed(m, eager, h100, Efficiency())
    assert sp_f.attention_kernel == "flash2" and sp_e.attention_kernel == ""  # FLOPs with the matmuls
    assert sp_e.memory_seconds > sp_f.memory_seconds and sp_e.step_seconds > sp_f.step_seconds


def test_eager_attention_under_megatron_keeps_the_softmax_tensors():
    """Korthikanti et al. 2022, section 4 (tensor parallel t, no sequence parallelism): unfused
    attention keeps S x S tensors a layer (their 5 a s^2 b / t with dropout's mask and output; a
    LLaMA layer without dropout keeps the fused scale-mask-softmax's output alone, 2 a s^2 b / t);
    flash attention keeps only its per-row log-sum-exp (4 s b a / t bytes of fp32)."""
    m = preset("llama-3-8b")
    base = TrainSetup("bf16", "adamw", 1, 2048, num_gpus=8, tensor_parallel=8)
    flash = megatron_activation_bytes(m, base)
    eager = megatron_activation_bytes(m, replace(base, attention_kernel="eager"))
    a, s, t = m.num_heads, 2048, 8
    per_layer = 2 * a * s * s / t - 4 * s * a / t
    layers = (eager - flash) / per_layer
    assert layers == pytest.approx(round(layers)) and layers >= m.num_layers  # every layer in flight keeps them
