"""Pipeline-parallel serving (--pp), the TensorRT-LLM runtime profile (--runtime trtllm) and prefix
caching (--prefix-hit-ratio): each checked against a hand computation, a trend, and the CLI's
refusals (plan/serve_pipeline.py, plan/serve_engines.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gpulens.cli.main import main
from gpulens.plan.advice import replica_options
from gpulens.plan.catalog import find_gpu
from gpulens.plan.models import preset
from gpulens.plan.serve import ServeSetup, plan_serving, serving_speed, weight_bytes
from gpulens.plan.serve_pipeline import boundaries_across_nodes, pipeline_sends
from gpulens.plan.speed import default_efficiency

M = preset("llama-3-8b")
GPU = find_gpu("h100-sxm")
EFF = default_efficiency(GPU)
VLLM = ServeSetup(runtime="vllm")
CTX = 512 << 20  # plan_serving's CUDA context


def _sends(setup: ServeSetup, tokens: int) -> float:
    return pipeline_sends(tokens, M.hidden_size, 2, setup.tensor_parallel, setup.pipeline_parallel, GPU,
                          gpus_per_node=setup.gpus_per_node,
                          inter_node_bytes_per_second=setup.inter_node_bytes_per_second).seconds


# --- pipeline parallelism ----------------------------------------------------------------------

def test_two_stages_halve_the_weights_per_gpu_and_more_than_double_the_concurrency():
    one = plan_serving(M, VLLM, GPU, EFF)
    two = plan_serving(M, replace(VLLM, pipeline_parallel=2), GPU, EFF)
    # by hand: half the blocks, plus the last stage's head and final norm (Llama-3-8B is untied)
    blocks = M.block_params * 2
    head_and_norm = (M.params - M.block_params - M.vocab_size * M.hidden_size) * 2
    assert two.memory.breakdown["weights"] == int(blocks / 2 + head_and_norm)
    assert two.memory.breakdown["weights"] == pytest.approx(one.memory.breakdown["weights"] / 2, rel=0.01)
    # each sequence takes half its cache per GPU, and the pool grew by the weights saved
    assert two.max_concurrency > 2 * one.max_concurrency


def test_batch_one_tpot_rises_by_the_sends_only():
    one = serving_speed(M, VLLM, GPU, EFF)
    two = serving_speed(M, replace(VLLM, pipeline_parallel=2), GPU, EFF)
    sends = _sends(replace(VLLM, pipeline_parallel=2), 1)
    assert sends > 0
    assert two.tpot_seconds == pytest.approx(one.tpot_seconds + sends, rel=1e-12)
    assert two.pipeline is not None and two.pipeline.micro_batches == 1
    assert one.pipeline is None and "pipeline" not in one.to_dict()


def test_large_batch_decode_throughput_gains_between_one_and_two_fold():
    """The model: TPOT(b, N=2) = TPOT(b/2, one stage) + sends; throughput = b / TPOT."""
    b = 512
    one = serving_speed(M, replace(VLLM, batch=b), GPU, EFF)
    half = serving_speed(M, replace(VLLM, batch=b // 2), GPU, EFF)
    two = serving_speed(M, replace(VLLM, batch=b, pipeline_parallel=2), GPU, EFF)
    assert two.tpot_seconds == pytest.approx(half.tpot_seconds + _sends(replace(VLLM, pipeline_parallel=2), b // 2), rel=1e-12)
    gain = two.decode_tokens_per_second / one.decode_tokens_per_second
    assert 1.4 < gain < 2.0  # KV reads halve per micro-batch, each micro-batch reads the weights again
    # at batch 1 nothing is pipelined: no gain
    assert serving_speed(M, replace(VLLM, pipeline_parallel=2), GPU, EFF).decode_tokens_per_second < \
        serving_speed(M, VLLM, GPU, EFF).decode_tokens_per_second


def test_a_stage_boundary_across_nodes_goes_over_the_network():
    assert boundaries_across_nodes(4, 4, 8) == 1  # stages 0-1 on node 0, 2-3 on node 1
    assert boundaries_across_nodes(8, 2, 8) == 1 and boundaries_across_nodes(2, 4, 8) == 0
    within = _sends(replace(VLLM, tensor_parallel=2, pipeline_parallel=4), 64)
    across = _sends(replace(VLLM, tensor_parallel=4, pipeline_parallel=4), 64)
    assert across > within


# --- TensorRT-LLM ------------------------------------------------------------------------------

def test_trtllm_kv_pool_is_ninety_percent_of_the_free_memory_by_hand():
    trt = plan_serving(M, replace(VLLM, runtime="trtllm"), GPU, EFF, cuda_context_bytes=CTX)
    h, inter, vocab = M.hidden_size, M.intermediate_size, M.vocab_size
    weights = weight_bytes(M, "bf16")
    act = 8192 * (2 * h * 2 + 3 * inter * 2) + 1 * vocab * 4  # the profiling forward at max_num_tokens, batch 1
    free = GPU.memory_bytes - CTX - weights - act - EFF.workspace_bytes
    assert trt.memory.breakdown["kv_cache"] == int(0.9 * free)
    assert "cuda_graphs" not in trt.memory.breakdown
    vllm = plan_serving(M, VLLM, GPU, EFF, cuda_context_bytes=CTX)
    vllm_pool = 0.9 * GPU.memory_bytes - CTX - weights - act - (1 << 30) - EFF.workspace_bytes
    assert vllm.memory.breakdown["kv_cache"] == int(vllm_pool)
    assert trt.memory.breakdown["kv_cache"] > vllm.memory.breakdown["kv_cache"]


def test_trtllm_blocks_of_64_tokens_round_the_context_up():
    # 650 tokens: 41 blocks of 16 (656 tokens) in vLLM, 11 blocks of 64 (704) in TensorRT-LLM
    s = replace(VLLM, prompt_tokens=522, new_tokens=128)
    trt = plan_serving(M, replace(s, runtime="trtllm"), GPU, EFF)
    per_token = M.kv_bytes_per_token(2.0)
    assert trt.max_concurrency == int(trt.memory.breakdown["kv_cache"] // (704 * per_token))


def test_trtllm_is_an_engine_in_replica_plans():
    opts = replica_options(M, replace(VLLM, runtime="trtllm"), [GPU], {GPU.name: EFF}, target_rps=10,
                           tpot_slo_s=None, ttft_slo_s=1.0)
    assert opts and all(o.utilization_ratio is not None for o in opts)  # continuous batching, not static batches


# --- prefix caching ----------------------------------------------------------------------------

def test_half_the_prompt_cached_halves_the_matmul_flops_and_attention_reads_the_whole_context():
    p = 2000
    s = replace(VLLM, prompt_tokens=p)
    full = serving_speed(M, s, GPU, EFF)
    half = serving_speed(M, replace(s, prefix_hit_ratio=0.5), GPU, EFF)
    n, L, H, d, V, h = M.matmul_params, M.num_layers, M.num_heads, M.head_dim, M.vocab_size, M.hidden_size
    q = p // 2
    assert half.prefill_flops == 2 * n * q + 2 * L * H * d * (p * p - q * q) - 2 * V * h * (q - 1)
    assert full.prefill_flops == 2 * n * p + 2 * L * H * d * p * p - 2 * V * h * (p - 1)
    assert 0.5 < half.ttft_seconds / full.ttft_seconds < 0.6  # attention over the whole context and fixed costs
    assert half.tpot_seconds == full.tpot_seconds  # decoding reads the same cache


def test_prefix_hits_raise_a_replicas_capacity_within_a_ttft_target():
    s = replace(VLLM, prompt_tokens=2000, new_tokens=256)
    kw = {"target_rps": None, "tpot_slo_s": None, "ttft_slo_s": 0.5}
    plain = replica_options(M, s, [GPU], {GPU.name: EFF}, **kw)
    cached = replica_options(M, replace(s, prefix_hit_ratio=0.5), [GPU], {GPU.name: EFF}, **kw)
    tp1 = [o for o in plain if o.tensor_parallel == 1][0]
    tp1c = [o for o in cached if o.tensor_parallel == 1][0]
    assert tp1c.requests_per_second_per_replica > 1.3 * tp1.requests_per_second_per_replica


# --- the CLI -----------------------------------------------------------------------------------

def _plan(argv: list[str]) -> int:
    return main(["plan", "--model", "llama-3-8b", "--workload", "infer", "--gpu", "h100-sxm", *argv])


@pytest.mark.parametrize("argv, needle", [
    (["--runtime", "hf", "--pp", "2"], "transformers' generate has no pipeline schedule"),
    (["--runtime", "tgi", "--pp", "2"], "TGI shards only"),
    (["--runtime", "vllm", "--pp", "3"], "does not split"),
    (["--runtime", "vllm", "--gpus", "4", "--tp", "4", "--pp", "2"], "is not --tp 4 x --pp 2"),
    (["--runtime", "vllm", "--pp", "2", "--draft-model", "llama-3.2-1b", "--acceptance-rate", "0.7"], "one pipeline stage"),
    (["--prefix-hit-ratio", "0.5"], "recomputes every prompt"),
    (["--runtime", "vllm", "--prefix-hit-ratio", "1"], "below 1"),
    (["--runtime", "vllm", "--prefix-hit-ratio", "-0.2"], "between 0 and 1"),
])
def test_refusals_exit_2_with_one_sentence(capsys, argv, needle):
    assert _plan(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_text_and_json_show_the_three_mechanisms(capsys):
    assert _plan(["--runtime", "vllm", "--gpus", "4", "--pp", "2", "--batch", "64", "--prefix-hit-ratio", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "TP 2 × PP 2" in out and "pipeline stages" in out and "prefix cache hits" in out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert _plan(["--runtime", "trtllm", "--pp", "2", "--prefix-hit-ratio", "0.25", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["gpu"]["count"] == 2 and d["setup"]["pipeline_parallel"] == 2
    assert d["speed"]["pipeline"]["stages"] == 2 and d["speed"]["prefix_hit_ratio"] == 0.25
    assert any("TensorRT-LLM" in n for n in d["notes"])
