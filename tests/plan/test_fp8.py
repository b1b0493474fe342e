"""`--precision fp8`: Transformer Engine's FP8 training (plan/fp8.py), checked against hand values,
its bounds (attention and elementwise work stay 16-bit) and its refusals through the CLI."""

from __future__ import annotations

import json

import pytest

from gpulens.cli.main import main
from gpulens.plan import TrainSetup, find_gpu, preset, training_memory, training_speed
from gpulens.plan.fp8 import SCALING_BYTES_PER_LINEAR, fp8_linear_params, saved_delta_bytes_per_token_layer
from gpulens.plan.kernels import MATMUL_CEILING
from gpulens.plan.speed import default_efficiency

CAP = 10**15  # a huge card: bytes, not fitting

# Llama-3-8B's block Linears by hand: per layer q 4096x4096, k and v 4096x1024, o 4096x4096,
# gate / up / down 4096x14336; 32 layers
LLAMA3_8B_FP8_PARAMS = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)


def _speed(precision: str, **kw):
    gpu = find_gpu("h100-sxm")
    setup = TrainSetup(precision=precision, micro_batch=2, seq_len=4096, num_gpus=8, zero_stage=3, **kw)
    return training_speed(preset("llama-3-8b"), setup, gpu, default_efficiency(gpu))


@pytest.mark.parametrize("kw", [{}, {"grad_ckpt": True}, {"selective_recompute": True}])
def test_fp8_step_is_faster_than_amp_bf16_but_not_twice(kw):
    amp, fp8 = _speed("amp_bf16", **kw), _speed("fp8", **kw)
    # FP8 halves only the block Linears' GEMM time; attention, the head, elementwise work, the casts stay
    assert amp.step_seconds / 2 < fp8.step_seconds < amp.step_seconds
    assert fp8.mfu_ratio > amp.mfu_ratio and fp8.mfu_peak_format == amp.mfu_peak_format == "bf16"


def test_fp8_gemms_priced_at_the_fp8_peak_times_the_16bit_ceiling():
    s = _speed("fp8").fp8
    assert s is not None
    tokens = 2 * 4096
    ceiling = MATMUL_CEILING["H100-SXM"]  # no FP8 ceiling measured: the 16-bit one's share
    assert s.gemm_flops_per_token == 6 * LLAMA3_8B_FP8_PARAMS
    assert s.gemm_seconds == pytest.approx(6 * LLAMA3_8B_FP8_PARAMS * tokens / (1979e12 * ceiling))
    # casts: inputs (fwd) and output gradients (bwd) read 2 + write 1 + 1 bytes; fp32 weights read 4, write 1 + 1
    ins, outs = 32 * (3 * 4096 + 4096 + 2 * 4096 + 14336), 32 * (4096 + 2 * 1024 + 4096 + 2 * 14336 + 4096)
    assert s.cast_bytes == tokens * (ins + outs) * 4 + LLAMA3_8B_FP8_PARAMS * 6
    assert "assumed" in s.ceiling_source and s.gemms[-1] == "down_proj"


def test_fp8_memory_adds_two_bytes_per_linear_weight_to_amp_bf16():
    m = preset("llama-3-8b")
    assert fp8_linear_params(m) == LLAMA3_8B_FP8_PARAMS
    amp = training_memory(m, TrainSetup(precision="amp_bf16", micro_batch=1, seq_len=2048), capacity_bytes=CAP)
    fp8 = training_memory(m, TrainSetup(precision="fp8", micro_batch=1, seq_len=2048), capacity_bytes=CAP)
    scaling = 32 * 7 * (1024 + 2) * 5 * 4  # amax history + scale + scale_inv, 3 fwd + 2 bwd FP8 tensors per Linear
    assert SCALING_BYTES_PER_LINEAR * 32 * 7 == scaling
    # the optimizer step holds no activations: FP8 is amp_bf16 plus the FP8 copies and the scaling state
    assert fp8.candidates["optimizer step"] - amp.candidates["optimizer step"] == 2 * LLAMA3_8B_FP8_PARAMS + scaling
    assert fp8.breakdown["weights"] == amp.breakdown["weights"] == 4 * m.params
    assert fp8.breakdown["fp8_weight_copies"] == 2 * LLAMA3_8B_FP8_PARAMS
    assert fp8.peak_at == "optimizer step" and fp8.peak_bytes > amp.peak_bytes
    # at the start of the backward (a larger micro-batch makes it the peak)
    amp = training_memory(m, TrainSetup(precision="amp_bf16", micro_batch=8, seq_len=4096), capacity_bytes=CAP)
    fp8 = training_memory(m, TrainSetup(precision="fp8", micro_batch=8, seq_len=4096), capacity_bytes=CAP)
    assert amp.peak_at == fp8.peak_at == "backward start"
    # TE casts its fp32 weights straight to FP8: only the (plain PyTorch) head keeps a bf16 autocast copy
    assert fp8.breakdown["autocast_weight_copies"] == 2 * 128256 * 4096
    # each Linear saves its input in FP8: q, k, v, gate, up 2 -> 1 byte of h, down 2 -> 1 of 14336, o_proj + 1 of h
    assert saved_delta_bytes_per_token_layer(m) == -5 * 4096 + 4096 - 14336
    assert fp8.breakdown["activations"] - amp.breakdown["activations"] == 32 * 8 * 4096 * (-5 * 4096 + 4096 - 14336)
    # selective recomputation re-runs the core, which then keeps no 16-bit output: o_proj's FP8 copy replaces it
    assert saved_delta_bytes_per_token_layer(m, selective_recompute=True) == -5 * 4096 - 4096 - 14336
    sel = dict(micro_batch=8, seq_len=4096, selective_recompute=True)
    amp_s = training_memory(m, TrainSetup(precision="amp_bf16", **sel), capacity_bytes=CAP)
    fp8_s = training_memory(m, TrainSetup(precision="fp8", **sel), capacity_bytes=CAP)
    assert fp8_s.breakdown["activations"] - amp_s.breakdown["activations"] == 32 * 8 * 4096 * (-5 * 4096 - 4096 - 14336)


def test_fp8_copies_shard_under_zero3():
    m = preset("llama-3-8b")
    one = training_memory(m, TrainSetup(precision="fp8", micro_batch=1, seq_len=2048), capacity_bytes=CAP)
    eight = training_memory(m, TrainSetup(precision="fp8", micro_batch=1, seq_len=2048, num_gpus=8, zero_stage=3),
                            capacity_bytes=CAP)
    assert eight.breakdown["fp8_weight_copies"] == one.breakdown["fp8_weight_copies"] // 8


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["plan", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


TRAIN = ("--model", "llama-3-8b", "--workload", "train")


@pytest.mark.parametrize("argv,needle", [
    (("--gpu", "a100-80gb", "--precision", "fp8"), "has no FP8 tensor cores"),
    (("--gpu", "v100-32gb", "--precision", "fp8"), "has no FP8 tensor cores"),
    (("--gpu", "h100-sxm", "--precision", "fp8", "--finetune", "lora"), "--finetune lora is not modelled"),
    (("--gpu", "h100-sxm", "--precision", "fp8", "--finetune", "qlora"), "--finetune qlora is not modelled"),
    (("--gpu", "h100-sxm", "--gpus", "2", "--tp", "2", "--precision", "fp8", "--finetune", "lora"),
     "--finetune lora is not modelled"),
    (("--gpu", "h100-sxm", "--gpus", "2", "--zero", "3", "--zero-layout", "deepspeed", "--precision", "fp8"),
     "16-bit-module layout"),
])
def test_fp8_refusals_are_one_sentence_and_exit_2(capsys, argv, needle):
    rc, out, err = run(capsys, *TRAIN, *argv)
    assert rc == 2
    assert needle in err and "Traceback" not in err + out


def test_fp8_json_and_text(capsys):
    argv = (*TRAIN, "--gpu", "h100-sxm", "--gpus", "8", "--zero", "3", "--batch", "1", "--precision", "fp8")
    rc, out, _ = run(capsys, *argv, "--format", "json")
    assert rc == 0
    d = json.loads(out)
    assert d["speed"]["mfu_peak_format"] == "bf16"
    f = d["speed"]["fp8"]
    assert f["gemms"] == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert {"gemm_seconds", "cast_seconds", "cast_bytes", "fp8_peak_flops", "ceiling_ratio", "ceiling_source",
            "recipe", "stays_16bit"} <= set(f)
    assert d["memory"]["breakdown"]["fp8_weight_copies"] == 2 * LLAMA3_8B_FP8_PARAMS // 8
    rc, out, _ = run(capsys, *argv)
    assert rc == 0
    assert "FP8 GEMMs" in out and "of the bf16 peak, not the FP8 one" in out and "down_proj" in out
    assert max(len(line) for line in out.splitlines()) <= 80
