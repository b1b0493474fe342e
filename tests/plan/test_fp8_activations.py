"""FP8 W8A8 serving with dynamic activation scales (plan/serve_quant.py): two kernels per GEMM
input every step, each at least its launch floor; static scales cost nothing; the published
torchao rows are planned on the card they ran on (a user-defined GPU entry)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gpulens.cli.main import main
from gpulens.plan import find_gpu, load_model
from gpulens.plan.published import load_figures, predict
from gpulens.plan.serve import ServeSetup, serving_speed
from gpulens.plan.serve_quant import GEMM_INPUTS_PER_LAYER, KERNEL_FLOOR_SECONDS, fp8_activation_quant_seconds
from gpulens.plan.speed import Efficiency

LLAMA = load_model("llama-3-8b")
H100 = find_gpu("h100-sxm")
BW = H100.memory_bandwidth_bytes_per_second


def test_at_decode_sizes_each_gemm_input_costs_two_launch_floors():
    s = ServeSetup(dtype="fp8", batch=1, runtime="vllm")
    per_step = fp8_activation_quant_seconds(LLAMA, s, H100, 1, BW)
    assert per_step == pytest.approx(LLAMA.num_layers * GEMM_INPUTS_PER_LAYER * 2 * KERNEL_FLOOR_SECONDS)
    # a quantized output head quantizes its input too
    head = fp8_activation_quant_seconds(LLAMA, replace(s, quantize_head=True), H100, 1, BW)
    assert head == pytest.approx(per_step + 2 * KERNEL_FLOOR_SECONDS)
    # static scales, or weights that are not FP8: nothing
    assert fp8_activation_quant_seconds(LLAMA, replace(s, fp8_activations="static"), H100, 1, BW) == 0.0
    assert fp8_activation_quant_seconds(LLAMA, replace(s, dtype="int8"), H100, 1, BW) == 0.0


def test_a_prefill_pays_the_bytes_and_tensor_parallel_ranks_quantize_their_shards():
    s = ServeSetup(dtype="fp8", runtime="vllm")
    tokens = 8192
    floors = LLAMA.num_layers * GEMM_INPUTS_PER_LAYER * 2 * KERNEL_FLOOR_SECONDS
    one = fp8_activation_quant_seconds(LLAMA, s, H100, tokens, BW)
    widths = LLAMA.num_layers * (2 * LLAMA.hidden_size + LLAMA.q_size + LLAMA.intermediate_size)
    assert one == pytest.approx(5.0 * tokens * widths / BW)  # read twice in 16-bit, written once in FP8
    assert one > floors
    tp4 = fp8_activation_quant_seconds(LLAMA, replace(s, tensor_parallel=4), H100, tokens, BW)
    # the O and down inputs are split over the ranks, the QKV and MLP inputs are whole on each
    split = LLAMA.num_layers * (2 * LLAMA.hidden_size + (LLAMA.q_size + LLAMA.intermediate_size) / 4)
    assert tp4 == pytest.approx(5.0 * tokens * split / BW)


def test_dynamic_scaling_makes_decode_slower_and_static_does_not():
    eff = Efficiency()
    base = ServeSetup(dtype="fp8", batch=1, runtime="vllm", prompt_tokens=512, new_tokens=128)
    dynamic = serving_speed(LLAMA, base, H100, eff)
    static = serving_speed(LLAMA, replace(base, fp8_activations="static"), H100, eff)
    assert dynamic.tpot_seconds - static.tpot_seconds == pytest.approx(dynamic.fp8_activation_quant_seconds)
    assert static.fp8_activation_quant_seconds == 0.0 and dynamic.fp8_activation_quant_seconds > 0


def test_torchao_h100_rows_are_planned_on_metas_h100():
    figs = {f["id"]: f for f in load_figures()}
    row = figs["torchao-llama31-8b-bf16-h100"]
    assert row["config"]["gpu_spec"]["bandwidth_gbps"] == 2400
    assert "custom to Meta's H100 variant" in " ".join(row["config"]["gpu_spec"]["sources"])
    on_meta = predict(row)
    as_sxm = predict({**row, "config": {k: v for k, v in row["config"].items() if k != "gpu_spec"} | {"gpu": "h100-sxm"}})
    # a bandwidth-bound decode, slower by nearly the bandwidths' ratio (the fixed per-step costs stay)
    assert 2400 / 3350 < on_meta.predicted / as_sxm.predicted < 0.8


@pytest.mark.parametrize("argv, words", [
    (["--dtype", "bf16", "--fp8-activations", "static"], "--fp8-activations says how FP8 GEMMs scale"),
    (["--dtype", "fp8", "--fp8-activations", "sometimes"], "Unknown FP8 activation scaling"),
])
def test_fp8_activation_option_is_refused_where_it_means_nothing(capsys, argv, words):
    rc = main(["plan", "--model", "llama-3-8b", "--workload", "infer", "--gpu", "h100", "--runtime", "vllm", *argv])
    _, err = capsys.readouterr()
    assert rc == 2 and words in err and "Traceback" not in err


def test_the_plan_says_what_it_does_not_price_for_fp8_below_sixteen_rows(capsys):
    base = ["plan", "--model", "llama-3-8b", "--workload", "infer", "--gpu", "h100", "--runtime", "vllm", "--dtype", "fp8",
            "--format", "json"]
    assert main([*base, "--batch", "1"]) == 0
    notes = " ".join(json.loads(capsys.readouterr().out)["notes"])
    assert "fewer than 16 rows are not priced" in notes and "FP8 activations scaled dynamically" in notes
    assert main([*base, "--batch", "32"]) == 0
    assert "fewer than 16 rows" not in " ".join(json.loads(capsys.readouterr().out)["notes"])
