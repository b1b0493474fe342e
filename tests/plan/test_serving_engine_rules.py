"""SGLang's and TGI's own KV-pool sizing and scheduler defaults (plan/serve_engine_rules.py), each
checked by hand from the rule cited there, against vLLM's, and through the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gpulens.cli.main import main
from gpulens.plan import serve_engine_rules as rules
from gpulens.plan.catalog import find_gpu
from gpulens.plan.models import preset
from gpulens.plan.serve import ServeSetup, plan_serving, weight_bytes
from gpulens.plan.speed import default_efficiency

M = preset("llama-3-8b")
H100 = find_gpu("h100-sxm")  # nvidia-smi 81,559 MiB
L4 = find_gpu("l4")  # 23,034 MiB
CTX = 512 << 20  # plan_serving's CUDA context
KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads of 128, bf16: 128 KiB


def _pool(runtime: str, gpu, **kw) -> tuple[float, object]:
    eff = default_efficiency(gpu)
    plan = plan_serving(M, ServeSetup(runtime=runtime, **kw), gpu, eff, cuda_context_bytes=CTX)
    return plan.memory.breakdown["kv_cache"], plan


def _vllm_by_hand(gpu) -> float:
    eff = default_efficiency(gpu)
    act = 8192 * (2 * 4096 * 2 + 3 * 14336 * 2) + 128256 * 4
    return 0.9 * gpu.memory_bytes - CTX - weight_bytes(M, "bf16") - act - (1 << 30) - eff.workspace_bytes


def _sglang_by_hand(gpu, f: float) -> float:
    # model_runner.profile_max_num_token: free after the weights - (1 - f) x free at start
    free_at_start = gpu.memory_bytes - CTX
    return f * free_at_start - weight_bytes(M, "bf16")


def _tgi_by_hand(gpu) -> float:
    eff = default_efficiency(gpu)
    tokens = 4096 - 1 + 50  # launcher: max_input_tokens (min(8192, 4096) - 1) + 50
    act = tokens * (2 * 4096 * 2 + 3 * 14336 * 2) + 2 * tokens * 128256 * 2  # MLP + logits and log-softmax
    warmup_kv = 2 * 4096 * KV_PER_TOKEN  # two requests of 4,095 tokens, each with blocks for 4,096
    free = gpu.memory_bytes - CTX - weight_bytes(M, "bf16") - act - eff.workspace_bytes - warmup_kv
    return 0.95 * free + warmup_kv


@pytest.mark.parametrize("gpu", [H100, L4], ids=["h100-sxm", "l4"])
def test_each_engines_pool_by_hand_and_all_three_differ(gpu):
    vllm, _ = _pool("vllm", gpu)
    sglang, sp = _pool("sglang", gpu)
    tgi, tp = _pool("tgi", gpu)
    assert vllm == int(_vllm_by_hand(gpu))
    assert sglang == int(_sglang_by_hand(gpu, 0.88))  # <= 81,920 MiB at TP1: 0.88
    assert tgi == int(_tgi_by_hand(gpu))
    assert len({vllm, sglang, tgi}) == 3
    assert "mem_fraction_static 0.880" in sp.memory.notes[0] and "SGLang v0.4.6.post5" in sp.memory.notes[0]
    assert "TGI v2.0.4" in tp.memory.notes[0] and "4,145 tokens" in tp.memory.notes[0]
    # SGLang's activations and graphs are the (1 - f) share, not a profiling forward
    assert sp.memory.breakdown["activations_and_graphs"] == int(0.12 * (gpu.memory_bytes - CTX))
    assert "cuda_graphs" not in sp.memory.breakdown and "cuda_graphs" not in tp.memory.breakdown


def test_h100_figures():
    """Llama-3-8B bf16 on an H100 SXM, 512 + 128 tokens: 54.4 (vLLM), 54.7 (SGLang), 58.7 GiB (TGI)."""
    gib = [round(_pool(rt, H100)[0] / 2**30, 1) for rt in ("vllm", "sglang", "tgi")]
    assert gib == [54.4, 54.7, 58.7]


def test_sglang_mem_fraction_static_rule():
    assert [rules.sglang_mem_fraction_static(81559, n) for n in (1, 2, 4, 8, 16)] == [0.88, 0.87, 0.85, 0.81, 0.79]
    assert rules.sglang_mem_fraction_static(95830, 8) == 0.88  # H100 NVL: above 81,920, at most 96 GiB
    g = 143771  # H200: min(0.88 + 48 GiB x 0.12 / G, (G - 18 GiB) / G)
    assert rules.sglang_mem_fraction_static(g, 1) == pytest.approx(min(0.88 + 49152 * 0.12 / g, (g - 18432) / g))
    assert rules.sglang_mem_fraction_static(g, 1) == pytest.approx((g - 18432) / g)


def test_sglang_fraction_falls_with_tensor_parallelism():
    one = plan_serving(M, ServeSetup(runtime="sglang"), H100, default_efficiency(H100), cuda_context_bytes=CTX)
    four = plan_serving(M, ServeSetup(runtime="sglang", tensor_parallel=4), H100, default_efficiency(H100),
                        cuda_context_bytes=CTX)
    assert "mem_fraction_static 0.850" in four.memory.notes[0]
    per_gpu_weights = four.memory.breakdown["weights"]
    assert four.memory.breakdown["kv_cache"] == int(0.85 * (H100.memory_bytes - CTX - four.memory.breakdown.get(
        "nccl_buffers", 0)) - per_gpu_weights)
    assert one.memory.breakdown["kv_cache"] < four.memory.breakdown["kv_cache"]


def test_sglang_has_no_block_rounding_tgi_rounds_to_16():
    s = {"prompt_tokens": 522, "new_tokens": 128}  # 650 tokens: 656 in blocks of 16
    sglang, sp = _pool("sglang", H100, **s)
    tgi, tp = _pool("tgi", H100, **s)
    assert sp.max_concurrency == int(sglang // (650 * KV_PER_TOKEN))
    assert tp.max_concurrency == int(tgi // (656 * KV_PER_TOKEN))
    assert sp.max_concurrency > int(sglang // (656 * KV_PER_TOKEN))  # whole pages of 16 would hold fewer


@pytest.mark.parametrize("runtime, gpu, chunk", [
    ("vllm", H100, 8192), ("vllm", L4, 8192), ("trtllm", L4, 8192),
    ("sglang", H100, 8192), ("sglang", L4, 2048),  # chunked_prefill_size: 2,048 under 25,000 MiB
    ("tgi", H100, 4145), ("tgi", L4, 4145),  # max_batch_prefill_tokens = 4,095 + 50
])
def test_default_prefill_chunk_per_engine(runtime, gpu, chunk):
    s = rules.with_engine_defaults(ServeSetup(runtime=runtime), M, gpu.memory_bytes)
    assert s.step_budget_tokens == chunk
    given = rules.with_engine_defaults(ServeSetup(runtime=runtime, prefill_chunk_tokens=1000), M, gpu.memory_bytes)
    assert given.step_budget_tokens == 1000


def test_tgi_defaults_follow_a_short_context_model():
    tiny = preset("tinyllama-1.1b")  # 2,048 positions: max_input_tokens 2,047, prefill 2,097
    assert rules.tgi_max_batch_prefill_tokens(tiny) == 2097
    assert rules.default_max_num_batched_tokens("tgi", tiny) == 2097


def test_tgi_warmup_tokens_follow_max_num_batched_tokens():
    small, _ = _pool("tgi", H100, max_num_batched_tokens=2048)
    default, _ = _pool("tgi", H100)
    assert small > default  # a smaller warmup forward leaves more free memory
    assert math.isclose(_pool("vllm", H100, max_num_batched_tokens=8192)[0], _pool("vllm", H100)[0])


def _plan(argv: list[str]) -> int:
    return main(["plan", "--model", "llama-3-8b", "--workload", "infer", "--gpu", "l4", *argv])


def test_cli_refuses_max_num_batched_tokens_with_sglang(capsys):
    assert _plan(["--runtime", "sglang", "--max-num-batched-tokens", "4096"]) == 2
    err = capsys.readouterr().err
    assert "mem_fraction_static" in err and "Traceback" not in err


def test_cli_json_names_the_rule_and_the_chunk(capsys):
    assert _plan(["--runtime", "sglang", "--target-rps", "1", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    text = json.dumps(d)
    assert "SGLang v0.4.6.post5" in text and "chunked prefill budget 2,048 tokens" in text
    assert _plan(["--runtime", "tgi", "--target-rps", "1", "--format", "json"]) == 0
    text = capsys.readouterr().out
    assert "TGI v2.0.4" in text and "chunked prefill budget 4,145 tokens" in text


def test_docs_list_each_rule_with_its_source():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "plan.md").read_text(encoding="utf-8")
    for needle in ("v0.4.6.post5", "mem_fraction_static", "profile_max_num_token", "chunked_prefill_size",
                   "page_size", "cuda_graph_max_bs", "8f22cb961ad1afaba1755b98fb4e5e81536c8971",
                   "flash_causal_lm.py", "--max-batch-prefill-tokens", "--cuda-memory-fraction", "BLOCK_SIZE"):
        assert needle in doc, needle
