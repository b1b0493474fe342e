"""SGLang's and TGI's own KV-pool sizing and scheduler defaults, each at a named release.

vLLM's profile (serve.py) takes gpu_memory_utilization = 0.9 of the whole card and gives the KV pool
what the weights, a profiling forward over max_num_batched_tokens (8,192), a CUDA-graph pool and the
NCCL buffers leave. The engines below size theirs otherwise; every constant names its source.

SGLang, release v0.4.6.post5 (the PyPI wheel of tag v0.4.6.post5 of github.com/sgl-project/sglang):
- `mem_fraction_static` (python/sglang/srt/server_args.py, `ServerArgs.__post_init__`): with the
  card's nvidia-smi memory.total G MiB (`get_device_memory_capacity`) and tp x pp GPUs, at
  G <= 81,920: 0.79 from 16 GPUs, 0.81 from 8, 0.85 from 4, 0.87 from 2, else 0.88; above 81,920
  MiB: 0.88; above 96 x 1,024 MiB it becomes min(f + 48 x 1,024 x (1 - f) / G, (G - 18 x 1,024) / G).
- what it covers (python/sglang/srt/model_executor/model_runner.py, `profile_max_num_token`): the
  KV pool is the memory free after the weights are loaded less (1 - f) x the memory free when the
  distributed setup ended (`init_torch_distributed`'s `min_per_gpu_memory`, after the CUDA context
  and the communicators): KV = f x (card - context - NCCL) - weights. The weights and the pool are
  the static share; activations, the CUDA graphs and the workspace come out of the other (1 - f).
  No profiling forward: `--max-num-batched-tokens` does not enter.
- `chunked_prefill_size` (server_args.py): 2,048 below 25,000 MiB, else 8,192 (16,384 only in
  prefill-decode disaggregation, not modelled): the scheduler's per-step prefill budget.
- `page_size` = 1 (server_args.py): RadixAttention's token-level pages, no block rounding.
- `cuda_graph_max_bs` (server_args.py): 8 below 25,000 MiB at TP < 4, 80 at TP >= 4; otherwise
  unset and model_executor/cuda_graph_runner.py captures batches up to 160 (to 256 above 96 GiB).
  Reported only: the graphs live in the (1 - f) share, not in the pool.

TGI (text-generation-inference), release v2.0.4 (github.com/huggingface/text-generation-inference,
commit 8f22cb961ad1afaba1755b98fb4e5e81536c8971):
- `--cuda-memory-fraction` 1.0 (launcher/src/main.rs; server/text_generation_server/utils/dist.py
  MEMORY_FRACTION), so `get_cuda_free_memory` (utils/import_utils.py: free - (1 - fraction) x total)
  is the device's free memory.
- the pool (server/text_generation_server/models/flash_causal_lm.py, `FlashCausalLM.warmup`): after a
  warmup forward over `--max-batch-prefill-tokens`, whose blocks it has allocated and whose
  activations the caching allocator still holds, it takes "5% for some wiggle room" off:
  KV = 0.95 x (card - context - weights - warmup activations - NCCL - workspace - warmup KV)
  + the warmup batch's KV blocks. The CUDA graphs (--cuda-graphs 1,2,4,8,16,32) are captured after
  the pool, from that 5 %.
- the warmup batch (router/client/src/client.rs, `warmup`): requests of max_input_tokens filling
  max_batch_prefill_tokens, with `prefill_logprobs: true`, so the forward computes the logits of
  every position and their log-softmax (tokens x vocabulary, twice, 16-bit); each request holds
  blocks for max_total_tokens.
- defaults (launcher/src/main.rs): max_total_tokens = min(max_position_embeddings, 4,096),
  max_input_tokens = that - 1, max_batch_prefill_tokens = max_input_tokens + 50 (4,145 for an
  8,192-position model): the warmup's tokens and the router's per-batch prefill budget.
- BLOCK_SIZE = 16 (server/text_generation_server/models/cache_manager.py; from v2.3 flashinfer's 1
  or flashdecoding's 256, not modelled).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from gpulens.plan.models import ModelSpec

SGLANG_RELEASE = "SGLang v0.4.6.post5"
TGI_RELEASE = "TGI v2.0.4"
VLLM_MAX_BATCHED_TOKENS = 8192  # vLLM's and TensorRT-LLM's max_num_batched_tokens / max_num_tokens
MIB = 1 << 20
SGLANG_SMALL_GPU_MIB = 25_000  # server_args.py: chunked_prefill_size and cuda_graph_max_bs below this
TGI_FREE_FRACTION = 0.95  # flash_causal_lm.py warmup: "Leave 5% for some wiggle room"
TGI_MAX_TOTAL_TOKENS = 4096  # launcher/src/main.rs: max_default
TGI_PREFILL_EDGE_TOKENS = 50  # launcher: max_batch_prefill_tokens = max_input_tokens + 50
TGI_BLOCK_TOKENS = 16  # cache_manager.py BLOCK_SIZE


@dataclass(frozen=True)
class EnginePool:
    """An engine's KV pool on one GPU and the rows of its start-up memory (bytes), with the rule."""

    kv_pool_bytes: float
    rows: dict[str, float]  # the breakdown, kv_cache last
    note: str


def sglang_mem_fraction_static(gpu_mib: float, gpus: int) -> float:
    """SGLang v0.4.6.post5 ServerArgs.__post_init__: the static share for tp x pp = `gpus` GPUs."""
    if gpu_mib <= 81920:
        f = 0.79 if gpus >= 16 else 0.81 if gpus >= 8 else 0.85 if gpus >= 4 else 0.87 if gpus >= 2 else 0.88
    else:
        f = 0.88
    if gpu_mib > 96 * 1024:
        f = min(f + 48 * 1024 * (1 - f) / gpu_mib, (gpu_mib - 1024 * 18) / gpu_mib)  # "15 GB + 3GB for cuda graph"
    return f


def sglang_chunked_prefill_size(gpu_mib: float) -> int:
    return 2048 if gpu_mib < SGLANG_SMALL_GPU_MIB else 8192


def sglang_cuda_graph_max_bs(gpu_mib: float, tp: int) -> int:
    if gpu_mib < SGLANG_SMALL_GPU_MIB:
        return 8 if tp < 4 else 80
    return 256 if gpu_mib > 96 * 1024 else 160  # cuda_graph_runner.py's capture list


def tgi_max_total_tokens(m: ModelSpec) -> int:
    return min(m.max_positions or TGI_MAX_TOTAL_TOKENS, TGI_MAX_TOTAL_TOKENS)


def tgi_max_batch_prefill_tokens(m: ModelSpec) -> int:
    """TGI v2.0.4's launcher default: max_input_tokens (max_total_tokens - 1) + 50."""
    return tgi_max_total_tokens(m) - 1 + TGI_PREFILL_EDGE_TOKENS


def default_max_num_batched_tokens(runtime: str, m: ModelSpec) -> int:
    """The engine's profiling / warmup forward tokens when the user gives none."""
    return tgi_max_batch_prefill_tokens(m) if runtime == "tgi" else VLLM_MAX_BATCHED_TOKENS


def default_prefill_chunk_tokens(runtime: str, capacity_bytes: float, max_num_batched_tokens: int) -> int:
    """The scheduler's per-step token budget when the user gives none: SGLang's chunked_prefill_size,
    TGI's max_batch_prefill_tokens (the warmup's own), vLLM's and TensorRT-LLM's max_num_batched_tokens."""
    if runtime == "sglang":
        return sglang_chunked_prefill_size(capacity_bytes / MIB)
    return max_num_batched_tokens


def with_engine_defaults(setup: Any, m: ModelSpec, capacity_bytes: float) -> Any:
    """A ServeSetup with its engine's defaults filled in where the user left them unset (None)."""
    if setup.runtime == "hf":
        return setup if setup.max_num_batched_tokens is not None else replace(setup, max_num_batched_tokens=VLLM_MAX_BATCHED_TOKENS)
    tokens = setup.max_num_batched_tokens or default_max_num_batched_tokens(setup.runtime, m)
    if setup.runtime == "sglang":  # no profiling forward: the flag stays unset (request.py refuses it)
        chunk = setup.prefill_chunk_tokens or sglang_chunked_prefill_size(capacity_bytes / MIB)
        return setup if chunk == setup.prefill_chunk_tokens else replace(setup, prefill_chunk_tokens=chunk)
    chunk = setup.prefill_chunk_tokens or default_prefill_chunk_tokens(setup.runtime, capacity_bytes, tokens)
    if tokens == setup.max_num_batched_tokens and chunk == setup.prefill_chunk_tokens:
        return setup
    return replace(setup, max_num_batched_tokens=tokens, prefill_chunk_tokens=chunk)


def _weights(weights: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in weights.items() if v}  # the model's, and a draft's where there is one


def sglang_pool(capacity_bytes: float, cuda_context_bytes: float, weights: dict[str, float], nccl_bytes: float,
                gpus: int) -> EnginePool:
    """KV = f x (card - context - NCCL) - weights; the rest, (1 - f) of it, for activations and graphs."""
    f = sglang_mem_fraction_static(capacity_bytes / MIB, gpus)
    free_at_start = capacity_bytes - cuda_context_bytes - nccl_bytes
    kv = f * free_at_start - sum(weights.values())
    rest = (1 - f) * free_at_start
    note = (f"{SGLANG_RELEASE}: the KV pool is mem_fraction_static {f:.3f} of the memory free at start less the "
            f"weights; {rest / 2**30:.1f} GiB left for activations and CUDA graphs (up to batch "
            f"{sglang_cuda_graph_max_bs(capacity_bytes / MIB, gpus)}); token-level pages (page_size 1)")
    return EnginePool(kv, _weights(weights) | {"nccl_buffers": nccl_bytes, "activations_and_graphs": rest,
                           "kv_cache": max(0.0, kv)}, note)


def tgi_warmup_kv_bytes(m: ModelSpec, tokens: int, kv_bytes_per_token: float) -> float:
    """The warmup batch's blocks: ceil(tokens / max_input_tokens) requests of max_total_tokens each."""
    total = tgi_max_total_tokens(m)
    requests = math.ceil(tokens / max(1, total - 1))
    return requests * math.ceil(total / TGI_BLOCK_TOKENS) * TGI_BLOCK_TOKENS * kv_bytes_per_token


def tgi_logits_bytes(m: ModelSpec, tokens: int, act_bytes: float) -> float:
    """The warmup's prefill_logprobs: every position's logits and their log-softmax, 16-bit."""
    return 2 * tokens * m.vocab_size * act_bytes


def tgi_pool(capacity_bytes: float, cuda_context_bytes: float, weights: dict[str, float], activation_bytes: float,
             nccl_bytes: float, workspace_bytes: float, warmup_kv_bytes: float, tokens: int) -> EnginePool:
    """KV = 0.95 x (free after the warmup forward) + the warmup batch's blocks."""
    free = capacity_bytes - cuda_context_bytes - sum(weights.values()) - activation_bytes - nccl_bytes - workspace_bytes - warmup_kv_bytes
    kv = TGI_FREE_FRACTION * free + warmup_kv_bytes
    wiggle = max(0.0, (1 - TGI_FREE_FRACTION) * free)
    note = (f"{TGI_RELEASE}: the KV pool is {TGI_FREE_FRACTION:.0%} of the memory free after a warmup forward of "
            f"{tokens:,} tokens (max_batch_prefill_tokens, all-position logits), in blocks of {TGI_BLOCK_TOKENS}; "
            f"CUDA graphs come out of the {wiggle / 2**30:.1f} GiB left")
    return EnginePool(kv, _weights(weights) | {"activations": activation_bytes, "nccl_buffers": nccl_bytes,
                           "cuda_workspace": workspace_bytes, "free_reserve": wiggle, "kv_cache": max(0.0, kv)}, note)
