"""Where the serving engines differ from vLLM's memory layout, and prefix caching.

vLLM (`--runtime vllm`, the reference profile, in serve.py): gpu_memory_utilization (0.9) of the
whole card, less the weights, the profiling forward over max_num_batched_tokens (8,192), a CUDA-graph
pool and NCCL buffers, is the KV pool, in blocks of 16 tokens. SGLang and TGI: serve_engine_rules.py
(each engine's defaults at a named release, with where in its source they are).

TensorRT-LLM (`--runtime trtllm`):
- KV pool: `KvCacheConfig.free_gpu_memory_fraction` (default 0.9; the executor's
  `kv_cache_free_gpu_mem_fraction`) of the memory FREE once the weights and the engine's
  activation buffers are allocated (TensorRT-LLM docs, "Memory Usage of TensorRT-LLM": weights,
  activations pre-computed at build time for max_num_tokens, then the KV cache from what is
  free; "How to Change KV Cache Behavior": "allocate 90% of free GPU memory for KV cache"). vLLM
  instead takes gpu_memory_utilization of the whole card and gives the KV cache what is left.
  The activations are priced as vLLM's profiling forward over `--max-num-batched-tokens` (TRT-LLM's
  max_num_tokens, 8,192 by default as well); no CUDA-graph pool is counted (the TensorRT backend's
  executor captures none unless ExtendedRuntimePerfKnobConfig.cuda_graph_mode is set).
- blocks of 64 tokens (`trtllm-build --tokens_per_block`, default 64; the 1.x LLM API's
  KvCacheConfig.tokens_per_block defaults to 32), against vLLM's 16: a sequence's last block
  wastes up to 63 tokens.
- speed: the engine defaults (`speed.ENGINE`: CUDA graphs or fused whole-layer plugins, 60-80 %
  of the bandwidth bound at small batch); no sourced TensorRT-LLM-specific figure differs, so
  none is invented: calibrate with `"runtime": "trtllm"` runs.

Prefix caching (`--prefix-hit-ratio R`): the share of each prompt's tokens already in the engine's
prefix cache (vLLM automatic prefix caching, docs "Automatic Prefix Caching"; SGLang
RadixAttention, Zheng et al. 2024, "SGLang", section 3; TensorRT-LLM KV cache reuse). The prefill
computes the other (1 - R) P tokens (at least one: vLLM recomputes the last token of a fully cached
prompt for its logits), and those attend to the whole context: attention FLOPs P^2 - (R P)^2 of
the causal P^2. Not modelled: the shared blocks' memory saving across requests (each request's
pool share is counted whole), eviction, the hit ratio's dependence on load.
"""

from __future__ import annotations

import math

from gpulens.errors import BadInputError
from gpulens.plan import serve_engine_rules as rules
from gpulens.plan.models import ModelSpec

VLLM_BLOCK_TOKENS = 16
# trtllm-build --tokens_per_block; SGLang ServerArgs.page_size = 1 (token-level RadixAttention pages);
# TGI v2.0.4 cache_manager.BLOCK_SIZE = 16 (serve_engine_rules.py); vLLM's 16 otherwise
ENGINE_BLOCK_TOKENS = {"trtllm": 64, "sglang": 1, "tgi": rules.TGI_BLOCK_TOKENS}
TRTLLM_KV_FREE_FRACTION = 0.9  # KvCacheConfig.free_gpu_memory_fraction default
PREFIX_CACHING_RUNTIMES = ("vllm", "sglang", "tgi", "trtllm")
TRTLLM_NOTE = (f"TensorRT-LLM: the KV pool is {TRTLLM_KV_FREE_FRACTION:.0%} of the memory free after the weights and "
               f"activations (free_gpu_memory_fraction), in blocks of {ENGINE_BLOCK_TOKENS['trtllm']} tokens")


def block_tokens(runtime: str) -> int:
    """Tokens per KV block of an engine's paged cache."""
    return ENGINE_BLOCK_TOKENS.get(runtime, VLLM_BLOCK_TOKENS)


def trtllm_kv_pool_bytes(capacity_bytes: float, cuda_context_bytes: float, allocated_bytes: float) -> float:
    """TensorRT-LLM's KV pool: the free fraction of what the card has left after the CUDA context
    and everything allocated before the pool (weights, activations, workspace, NCCL buffers)."""
    return TRTLLM_KV_FREE_FRACTION * (capacity_bytes - cuda_context_bytes - allocated_bytes)


def engine_pool(runtime: str, m: ModelSpec, *, capacity_bytes: float, cuda_context_bytes: float,
                weights: dict[str, float], mlp_activation_bytes: float, tokens: int, act_bytes: float,
                nccl_bytes: float, workspace_bytes: float, kv_bytes_per_token: float, gpus: int) -> rules.EnginePool | None:
    """SGLang's and TGI's own KV pools and start-up rows (serve_engine_rules.py); None: vLLM's layout."""
    if runtime == "sglang":
        return rules.sglang_pool(capacity_bytes, cuda_context_bytes, weights, nccl_bytes, gpus)
    if runtime == "tgi":
        act = mlp_activation_bytes + rules.tgi_logits_bytes(m, tokens, act_bytes)
        return rules.tgi_pool(capacity_bytes, cuda_context_bytes, weights, act, nccl_bytes, workspace_bytes,
                              rules.tgi_warmup_kv_bytes(m, tokens, kv_bytes_per_token), tokens)
    return None


def check_engine_options(runtime: str, max_num_batched_tokens: int | None) -> None:
    if runtime == "sglang" and max_num_batched_tokens is not None:
        raise BadInputError("--max-num-batched-tokens sizes an engine's profiling forward, and SGLang sizes its KV "
                            "pool from mem_fraction_static without one.",
                            hint="Set SGLang's --chunked-prefill-size with --prefill-chunk-tokens, or drop --max-num-batched-tokens.")


def check_prefix_caching(runtime: str, ratio: float) -> None:
    if not 0.0 <= ratio < 1.0 or not math.isfinite(ratio):
        raise BadInputError(f"--prefix-hit-ratio must lie in [0, 1), not {ratio!r}.",
                            hint="Give the share of each prompt's tokens found in the prefix cache, e.g. 0.5.")
    if ratio > 0 and runtime not in PREFIX_CACHING_RUNTIMES:
        raise BadInputError("--prefix-hit-ratio describes an engine's prefix cache, and --runtime hf recomputes "
                            "every prompt.", hint="Add --runtime vllm (or sglang, tgi, trtllm), or drop --prefix-hit-ratio.")


def computed_prompt_tokens(prompt_tokens: int, ratio: float) -> int:
    """Prompt tokens the prefill computes with a prefix-cache hit ratio (at least one)."""
    if ratio <= 0:
        return prompt_tokens
    return max(1, math.ceil((1.0 - ratio) * prompt_tokens - 1e-9))
