"""How `make bench` puts a published figure to llm-analysis (benchmarks/bench_llm_analysis.py).

llm-analysis itself runs only in make bench's own venv; these check the translation that decides
whether the two planners answered the same question: the layout, precision and model shapes each
figure states, and the figure's unit computed from llm-analysis's times by gpulens's own rule.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from gpulens.plan.published import load_figures

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_llm_analysis.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_llm_analysis", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def figures():
    return {f["id"]: f for f in load_figures()}


def test_composer_fsdp_pure_bf16(bench, figures):
    fig = figures["llmfoundry-a100_40gb-mpt70b-s2048-g64-mb2"]
    case = bench.case_for(fig)
    assert case["workload"] == "train" and case["gpu"] == "a100-sxm-40gb"
    assert case["parallel"] == {"tp": 1, "pp": 1, "dp": 64, "sp": 1}
    assert case["train"] == {"batch": 2, "grad_accum": 1, "seq": 2048, "recompute": 2, "zero": 3,
                             "master_weights_bytes": 0, "optimizer_state_bytes": 4}
    assert case["model"]["ffn_embed_dim"] == 4 * 8192 and not case["gated_mlp"]  # MPT's plain 4x MLP
    # 128 sequences of 2048 tokens over 64 GPUs in 10 s
    assert bench.in_figure_unit(fig, case, {"step_seconds": 10.0}) == pytest.approx(128 * 2048 / 10.0 / 64)


def test_amp_keeps_fp32_master_weights(bench, figures):
    fig = next(f for f in figures.values() if f["config"].get("mixed_precision") == "DEFAULT")
    t = bench.case_for(fig)["train"]
    assert (t["master_weights_bytes"], t["optimizer_state_bytes"]) == (4, None)  # llm-analysis's fp32 Adam


def test_megatron_layout_and_recompute(bench, figures):
    sel = next(f for f in figures.values() if f["config"].get("recompute") == "selective"
               and f["config"].get("virtual_stages", 1) == 1)
    case = bench.case_for(sel)
    c = sel["config"]
    assert case["train"]["recompute"] == 1  # llm-analysis's SELECTIVE is Korthikanti's attention-core recompute
    assert case["parallel"]["tp"] == c["tensor_parallel"]
    assert case["parallel"]["dp"] * c["tensor_parallel"] * c.get("pipeline_parallel", 1) == c["gpus"]
    assert case["parallel"]["sp"] == (c["tensor_parallel"] if c.get("sequence_parallel") else 1)


def test_what_llm_analysis_has_no_input_for_is_left_out_with_the_reason(bench, figures):
    answers = [bench.case_for(f) for f in figures.values() if f["kind"] in bench.KINDS]
    reasons = {a for a in answers if isinstance(a, str)}
    assert reasons == {"context parallelism", "interleaved pipeline schedule", "FP8 training"}


def test_gated_mlp_and_weight_only_int4(bench, figures):
    fig = figures["gptfast-llama2-7b-int4"]
    case = bench.case_for(fig)
    # Llama-2-7B's three 11008-wide matrices as llm-analysis's two-matrix FFN of the same weight
    assert case["model"]["ffn_embed_dim"] == 16512 and case["gated_mlp"]
    assert case["dtype"] == "w4a16e16" and case["infer"] == {"batch": 1, "prompt": 5, "new_tokens": 200}
    # gpt-fast times the whole generate(): 200 tokens over prefill + 200 decode steps
    got = bench.in_figure_unit(fig, case, {"prefill_seconds": 0.02, "decode_seconds_per_token": 0.005})
    assert got == pytest.approx(200 / (0.02 + 200 * 0.005))


def test_mixtral_experts_keep_their_width(bench, figures):
    case = bench.case_for(figures["gptfast-mixtral-8x7b-bf16-tp2"])
    # Mixtral's config has no moe_intermediate_size: each expert is intermediate_size (14336) wide
    assert case["model"]["ffn_embed_dim"] == 21504
    assert (case["model"]["moe_num_experts"], case["model"]["moe_top_k"]) == (8, 2)
    assert case["parallel"]["tp"] == 2


def test_a_card_outside_its_catalog_goes_in_as_its_spec(bench, figures):
    case = bench.case_for(figures["torchao-llama31-8b-fp8dq-tensor-h100"])
    g = case["gpu_config"]
    assert (g["hbm_bandwidth_in_GB_per_sec"], g["peak_fp16_TFLOPS"], g["peak_i8_TFLOPS"]) == (2400, 989.5, 1979)
    assert g["intra_node_bandwidth_in_GB_per_sec"] == 450 and case["dtype"] == "w8a8e16"
