"""`--precision fp8` under Megatron-style parallelism (plan/fp8_megatron.py): hand values of a TP 8 x PP 2
plan's FP8 GEMM time, casts and memory deltas; FP8 faster than bf16 on a large compute-bound plan; the
sequence-parallel all-gathers in FP8; the refusals that remain, through the CLI."""

from __future__ import annotations

import json

import pytest

from gpulens.cli.main import main
from gpulens.plan import TrainSetup, find_gpu, preset, training_memory, training_speed
from gpulens.plan.fp8 import SCALING_BYTES_PER_LINEAR, fp8_linear_params
from gpulens.plan.kernels import MATMUL_CEILING
from gpulens.plan.links import ring_gather_or_scatter
from gpulens.plan.speed import default_efficiency

CAP = 10**15
H, Q, KV, INTER, LAYERS = 8192, 8192, 1024, 28672, 80  # llama-3-70b
# per layer: linear_qkv h x (q + 2 kv), linear_proj q x h, linear_fc1 h x 2 inter, linear_fc2 inter x h
N8 = LAYERS * (H * (Q + 2 * KV) + Q * H + H * 2 * INTER + INTER * H)


def _setup(precision: str, **kw) -> TrainSetup:
    base = dict(precision=precision, micro_batch=1, seq_len=4096, grad_accum=8, num_gpus=16, tensor_parallel=8,
                pipeline_parallel=2, sequence_parallel=True, zero_stage=1)
    return TrainSetup(**(base | kw))


def _speed(precision: str, **kw):
    gpu = find_gpu("h100-sxm")
    return training_speed(preset("llama-3-70b"), _setup(precision, **kw), gpu, default_efficiency(gpu))


def _memory(precision: str, **kw):
    return training_memory(preset("llama-3-70b"), _setup(precision, **kw), capacity_bytes=CAP)


def test_fp8_gemm_time_of_a_tp8_pp2_plan_by_hand():
    assert fp8_linear_params(preset("llama-3-70b")) == N8 == 68_451_041_280
    f = _speed("fp8").fp8
    assert f is not None and f.gemms == ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
    # this GPU's 1/16 of 6 x N8 x 4096 tokens at the FP8 peak x the 16-bit ceiling's share
    flops = 6 * N8 * 4096 / 16
    assert f.gemm_flops_per_micro_batch == pytest.approx(flops)
    assert f.gemm_seconds == pytest.approx(flops / (1979e12 * MATMUL_CEILING["H100-SXM"]))
    # casts (4 bytes an element): forward qkv and fc1 inputs h/8 (sequence-parallel shards), proj q/8, fc2 inter/8;
    # backward: qkv (q + 2kv)/8, fc1 2 inter/8, proj and fc2 h/8 (quantized before the FP8 all-gather)
    fwd, bwd = (H + H + Q + INTER) / 8, (Q + 2 * KV + 2 * INTER + H + H) / 8
    assert f.cast_bytes == pytest.approx(40 * 4096 * 4 * (fwd + bwd))
    # the bf16 weights once per step: read 2, write the FP8 copy and its transpose
    assert f.weight_cast_bytes_per_step == pytest.approx(N8 / 16 * 4)
    # per layer and micro-batch: qkv and mlp inputs -s h/8 each, fc2's input -s inter/8, proj's FP8 copy +s q/8
    assert f.saved_activation_delta_bytes == pytest.approx(40 * 4096 * (-2 * H - INTER + Q) / 8)


def test_fp8_memory_deltas_of_a_tp8_pp2_plan_by_hand():
    amp, fp8 = _memory("amp_bf16"), _memory("fp8")
    assert fp8.breakdown["fp8_weight_copies"] == 2 * N8 // 16  # row-wise + transposed FP8, cached all run
    assert fp8.breakdown["fp8_scaling_state"] == 40 * 4 * SCALING_BYTES_PER_LINEAR
    assert fp8.breakdown["weights"] == amp.breakdown["weights"]  # bf16 module, as amp_bf16 under Megatron
    assert fp8.breakdown["optimizer_states"] == amp.breakdown["optimizer_states"]
    # the first stage holds 2 micro-batches of its 40 layers (1F1B): 80 layer-micro-batches
    per_layer = 4096 * (-2 * H - INTER + Q) // 8  # -18,874,368 bytes
    assert per_layer == -18_874_368
    assert fp8.candidates["backward start"] - amp.candidates["backward start"] == pytest.approx(
        2 * N8 // 16 + 40 * 4 * SCALING_BYTES_PER_LINEAR + 80 * per_layer, abs=2)


def test_selective_recompute_halves_the_attention_output_and_full_recompute_changes_no_activation():
    sel_amp, sel = _memory("amp_bf16", selective_recompute=True), _memory("fp8", selective_recompute=True)
    # without the core's own copy, linear_proj's FP8 input replaces the bf16 one: -s q/8 instead of +s q/8
    d = sel.breakdown["activations"] - sel_amp.breakdown["activations"]
    assert d == pytest.approx(80 * 4096 * (-2 * H - INTER - Q) / 8, abs=2)
    full_amp, full = _memory("amp_bf16", grad_ckpt=True), _memory("fp8", grad_ckpt=True)
    assert full.breakdown["activations"] == full_amp.breakdown["activations"]  # the bf16 layer inputs only


def test_fp8_is_faster_than_bf16_on_a_large_compute_bound_megatron_plan():
    amp, fp8 = _speed("amp_bf16"), _speed("fp8")
    assert amp.step_seconds / 2 < fp8.step_seconds < amp.step_seconds
    assert fp8.compute_seconds < amp.compute_seconds and fp8.memory_seconds > amp.memory_seconds  # the casts
    # lower activations; the peak is higher here only by the cached FP8 weights
    assert _memory("fp8").breakdown["activations"] < _memory("amp_bf16").breakdown["activations"]
    # break-even: 2 N8 / 16 bytes of FP8 weights = 80 x 18.9 MB x micro-batch, about 5.7 sequences of 4096
    assert _memory("fp8", micro_batch=4).peak_bytes > _memory("amp_bf16", micro_batch=4).peak_bytes
    assert _memory("fp8", micro_batch=8).peak_bytes < _memory("amp_bf16", micro_batch=8).peak_bytes


def test_sequence_parallel_all_gathers_move_fp8_bytes():
    gpu = find_gpu("h100-sxm")
    f = _speed("fp8").fp8
    full = 4096 * H * 2
    per_gather = ring_gather_or_scatter(full, 8, gpu).seconds - ring_gather_or_scatter(full / 2, 8, gpu).seconds
    assert f.tensor_parallel_all_gather_saving_seconds == pytest.approx(40 * 4 * per_gather)
    assert _speed("fp8").communication_seconds < _speed("amp_bf16").communication_seconds
    # without sequence parallelism TP moves only bf16 all-reduces
    nosp = _speed("fp8", sequence_parallel=False).fp8
    assert nosp.tensor_parallel_all_gather_saving_seconds == 0.0
    assert (_speed("fp8", sequence_parallel=False).communication_seconds
            == pytest.approx(_speed("amp_bf16", sequence_parallel=False).communication_seconds))


def test_weight_cast_once_per_step_not_per_micro_batch():
    a, b = _speed("fp8", grad_accum=8).fp8, _speed("fp8", grad_accum=16).fp8
    assert a.weight_cast_seconds_per_step == b.weight_cast_seconds_per_step > 0


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["plan", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


MEGATRON = ("--workload", "train", "--gpu", "h100-sxm", "--gpus", "16", "--tp", "8", "--pp", "2", "--precision", "fp8")


@pytest.mark.parametrize("argv,needle", [
    (("--model", "mixtral-8x7b"), "a mixture of experts"),
    (("--model", "llama-3-70b", "--finetune", "lora"), "--finetune lora is not modelled"),
    (("--model", "llama-3-8b", "--gpus", "2", "--tp", "1", "--pp", "1", "--zero", "3", "--zero-layout",
      "deepspeed"), "16-bit-module layout"),
])
def test_what_fp8_still_refuses_exits_2(capsys, argv, needle):
    rc, out, err = run(capsys, *MEGATRON, *argv)
    assert rc == 2
    assert needle in err and "Traceback" not in err + out


def test_megatron_fp8_cli_text_and_json(capsys):
    argv = (*MEGATRON, "--model", "llama-3-70b", "--sp", "--seq", "4096", "--grad-accum", "8", "--zero", "1",
            "--zero-layout", "deepspeed")  # Megatron's distributed optimizer: its own bf16 layout, accepted
    rc, out, err = run(capsys, *argv, "--format", "json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["speed"]["fp8"]["gemms"][0] == "linear_qkv"
    assert d["memory"]["breakdown"]["fp8_weight_copies"] == 2 * N8 // 16
    rc, out, err = run(capsys, *argv)
    assert rc == 0 and "FP8 GEMMs" in out and "Traceback" not in err
    assert max(len(line) for line in out.splitlines()) <= 80
