"""Issue 25's precision mechanisms: FSDP bf16 mixed precision (Composer / llm-foundry), a fused
16-bit cross-entropy, FP8 GEMMs at the FP8 peak, weight-only int8/int4 dequantization."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from gpulens.errors import BadInputError
from gpulens.plan import PlanRequest, find_gpu, load_model, plan
from gpulens.plan.memory import TrainSetup, layer_activation_bytes, training_memory
from gpulens.plan.serve import DEQUANT_OPS_PER_WEIGHT, ServeSetup, dequantize_seconds, serving_speed
from gpulens.plan.speed import Efficiency

LLAMA = load_model("llama-3-8b")
H100 = find_gpu("h100-sxm")


def _mem(**kw):
    base = dict(precision="amp_bf16", micro_batch=2, seq_len=2048, zero_stage=3, num_gpus=8)
    return training_memory(LLAMA, TrainSetup(**(base | kw)), capacity_bytes=H100.memory_bytes)


def test_fsdp_bf16_keeps_fp32_shards_and_saves_pure_16_bit_activations():
    amp, mp, ds = _mem(), _mem(zero_layout="fsdp-bf16"), _mem(zero_layout="deepspeed")
    # the sharded states are FSDP's fp32 ones: weights 4 Psi / N
    assert mp.breakdown["weights"] == amp.breakdown["weights"] == int(4 * LLAMA.params / 8)
    # no autocast: no per-Linear 16-bit casts, no cached weight copies; activations as in bf16 training
    assert "autocast_weight_copies" not in mp.breakdown
    assert mp.breakdown["activations"] == ds.breakdown["activations"] < amp.breakdown["activations"]
    bf16_layer = layer_activation_bytes(LLAMA, "bf16", 2, 2048)
    amp_layer = layer_activation_bytes(LLAMA, "amp_bf16", 2, 2048)
    assert sum(bf16_layer[k] for k in ("attention", "mlp", "norms")) < sum(amp_layer[k] for k in ("attention", "mlp", "norms"))
    assert mp.peak_bytes < amp.peak_bytes


def test_fsdp_bf16_is_refused_outside_bf16_mixed_precision():
    with pytest.raises(BadInputError, match="fsdp-bf16"):
        TrainSetup(precision="bf16", zero_stage=3, num_gpus=8, zero_layout="fsdp-bf16").validate()


def test_a_fused_cross_entropy_holds_the_16_bit_logits_only():
    torch_loss = _mem(zero_layout="fsdp-bf16", loss="torch")
    fused = _mem(zero_layout="fsdp-bf16", loss="fused")
    tokens = 2 * 2048
    assert torch_loss.peak_at == "backward start"
    assert torch_loss.breakdown["logits_and_loss"] == tokens * 12 * LLAMA.vocab_size
    # the fused kernel's 16-bit logits (plus its fp32 loss per token) are all that differs at the backward's
    # start; so small, they no longer set the peak here (the top layer's backward, with the head's gradient, does)
    assert (torch_loss.candidates["backward start"] - fused.candidates["backward start"]
            == tokens * 12 * LLAMA.vocab_size - tokens * (2 * LLAMA.vocab_size + 4))
    assert fused.peak_at == "top layer backward" and fused.peak_bytes < torch_loss.peak_bytes
    with pytest.raises(BadInputError, match="loss"):
        TrainSetup(loss="chunked").validate()


def test_fp8_prefill_runs_at_the_fp8_peak():
    eff = Efficiency()
    setup = ServeSetup(batch=8, prompt_tokens=4096, new_tokens=16, runtime="vllm")
    bf16 = serving_speed(LLAMA, setup, H100, eff)
    # static activation scales: the GEMMs alone (dynamic scaling's own passes: test_fp8_activations.py)
    fp8 = serving_speed(LLAMA, replace(setup, dtype="fp8", fp8_activations="static"), H100, eff)
    assert H100.peak_flops("fp8") == pytest.approx(2 * H100.peak_flops("bf16"), rel=0.01)
    # compute-bound prefill: close to half the time (the fixed costs and elementwise work stay)
    assert 0.45 < fp8.prefill_seconds / bf16.prefill_seconds < 0.65
    dynamic = serving_speed(LLAMA, replace(setup, dtype="fp8"), H100, eff)
    assert fp8.prefill_seconds < dynamic.prefill_seconds < bf16.prefill_seconds
    with pytest.raises(BadInputError):
        plan(PlanRequest(model="llama-3-8b", workload="infer", gpu="a100-80gb", dtype="fp8"))


def test_weight_only_kernels_pay_their_dequantization_on_the_cuda_cores():
    a100 = find_gpu("a100-80gb")
    s = ServeSetup(runtime="vllm")
    assert dequantize_seconds(LLAMA, s, a100) == 0.0
    int8 = dequantize_seconds(LLAMA, replace(s, dtype="int8"), a100)
    int4 = dequantize_seconds(LLAMA, replace(s, dtype="int4"), a100)
    assert int8 == pytest.approx(DEQUANT_OPS_PER_WEIGHT["int8"] * LLAMA.block_params / a100.fp32_flops)
    assert int4 == pytest.approx(2 * int8)
    assert dequantize_seconds(LLAMA, replace(s, dtype="int8", tensor_parallel=4), a100) == pytest.approx(int8 / 4)
    # int4 still decodes faster than int8, int8 faster than bf16 (fewer bytes), but not by the bytes alone
    eff = Efficiency()
    t = {d: serving_speed(LLAMA, replace(s, dtype=d), a100, eff).tpot_seconds for d in ("bf16", "int8", "int4")}
    assert t["int4"] < t["int8"] < t["bf16"]
    assert t["bf16"] / t["int4"] < 3.5


def _gpulens(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpulens", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args,needle", [
    (("--workload", "infer", "--loss", "fused"), "--loss"),
    (("--workload", "train", "--zero-layout", "fsdp-bf16"), "--zero-layout"),
    (("--workload", "train", "--gpus", "8", "--zero", "3", "--zero-layout", "fsdp-bf16", "--precision", "bf16"),
     "fsdp-bf16"),
    (("--workload", "train", "--loss", "chunked"), "loss"),
])
def test_meaningless_combinations_are_one_sentence_and_exit_2(args, needle):
    r = _gpulens("plan", "--model", "llama-3-8b", "--gpu", "h100-sxm", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and needle in r.stderr


def test_the_cli_plans_llm_foundry_style_fsdp():
    r = _gpulens("plan", "--model", "llama-3-8b", "--gpu", "h100-sxm", "--workload", "train", "--gpus", "8",
                 "--zero", "3", "--zero-layout", "fsdp-bf16", "--loss", "fused", "--batch", "4", "--seq", "4096",
                 "--format", "json")
    assert r.returncode == 0, r.stderr
    assert '"zero_layout": "fsdp-bf16"' in r.stdout and '"loss": "fused"' in r.stdout
