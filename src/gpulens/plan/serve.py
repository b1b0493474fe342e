"""Serving memory and speed for two runtime profiles (hf; vllm, sglang, tgi and trtllm as engines).

- `hf`: transformers' generate with a DynamicCache. The prefill computes logits for every prompt
  position (16-bit, batch x prompt x vocabulary); the cache grows by concatenation, so each decode
  step copies it once more. Peak = max(prefill, the last layer's MLP in prefill, end of decode).
- `vllm`: a share of the card (gpu_memory_utilization, 0.9) less the weights, profiling forward and
  CUDA graphs is the paged KV cache; last-position logits; the answer is the maximum concurrency.
  trtllm, sglang, tgi size it their own way (serve_engines.py); pipeline stages: serve_pipeline.py.

Speed: prefill compute-bound (2 N per token + causal attention); a decode step memory-bound (weights
+ KV bytes per step over bandwidth x efficiency) plus fixed per-step and per-layer overheads.

Tensor parallelism (Megatron's split): two all-reduces per layer (after attention's output and the
MLP's down projection) of batch x hidden x 2 bytes a decode step, x prompt in the prefill, each a
ring all-reduce by size, degree and link (`links.ring_all_reduce`), not overlapped: vLLM, TGI,
SGLang and gpt-fast issue it on the compute stream between the two matmuls.

Engine choices a user sets (docs/plan.md, Serving options): the output head split over the TP group
(`tp_shards_head`: vLLM yes, gpt-fast no) and quantized (`quantize_head`); the profiling forward's
tokens (`max_num_batched_tokens`), NCCL's record_stream (`nccl_record_streams`: vLLM <= 0.2.6) and
communicators per GPU (`nccl_communicators`: vLLM 0.2.x two), which shrink the KV pool.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gpulens.errors import BadInputError
from gpulens.plan import serve_engines as engines
from gpulens.plan import serve_pipeline as stages
from gpulens.plan.catalog import GpuSpec
from gpulens.plan.links import (
    DEFAULT_GPUS_PER_NODE,
    DEFAULT_INTER_NODE_BYTES_PER_SECOND,
    AllReduceCost,
    nccl_communicator_bytes,
    ring_all_reduce,
)
from gpulens.plan.memory import MemoryEstimate, peak_of
from gpulens.plan.models import ModelSpec
from gpulens.plan.serve_quant import (  # noqa: F401 - re-exported: callers and tests read them here
    DEQUANT_OPS_PER_WEIGHT,
    check_fp8_activations,
    dequantize_seconds,
    expected_experts_touched,
    fp8_activation_quant_seconds,
    quantized_head_params,
)
from gpulens.plan.speed import Efficiency

if TYPE_CHECKING:
    from gpulens.plan.speculative import SpeculativeSetup, SpeculativeSpeed

WEIGHT_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
INT4_GROUP = 128  # GPTQ/AWQ default group size: one fp16 scale and one zero point per group (--int4-group-size)
VLLM_BLOCK_TOKENS = engines.VLLM_BLOCK_TOKENS  # callers import it from here
RUNTIMES = ("hf", "vllm", "sglang", "tgi", "trtllm")  # the engines preallocate a paged KV pool (vLLM's layout; trtllm's own sizing)
VLLM_MAX_BATCHED_TOKENS = engines.rules.VLLM_MAX_BATCHED_TOKENS  # the profiling forward's token budget (--max-num-batched-tokens)
VLLM_CUDA_GRAPHS_BYTES = 1 << 30  # captured graphs' private pool, typical size


@dataclass(frozen=True)
class ServeSetup:
    dtype: str = "bf16"  # weight format: fp32, bf16, fp16, fp8, int8, int4
    kv_dtype: str | None = None  # None: the compute dtype; "fp8" halves the cache
    batch: int = 1  # concurrent sequences
    prompt_tokens: int = 512
    new_tokens: int = 128
    runtime: str = "hf"
    tensor_parallel: int = 1
    gpu_memory_utilization: float = 0.9
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE  # TP beyond one node runs over the network
    inter_node_bytes_per_second: float = DEFAULT_INTER_NODE_BYTES_PER_SECOND
    max_num_batched_tokens: int | None = None  # an engine's profiling forward (None: the engine's default, serve_engine_rules)
    nccl_record_streams: bool = False  # engine at TP > 1: all-reduced activations held to the forward's end
    speculative: SpeculativeSetup | None = None  # a draft model proposes, the target verifies (plan/speculative.py)
    step_tokens: int = 1  # tokens per sequence a decode step computes: K + 1 for a speculative verification
    tp_shards_head: bool = True  # the output head split over the TP group (vLLM); gpt-fast replicates it
    quantize_head: bool = False  # int8/int4/fp8 also quantize the output head (gpt-fast: every nn.Linear)
    nccl_communicators: int = 1  # engine at TP > 1: NCCL communicators on each GPU before it sizes the KV pool
    int4_group_size: int = INT4_GROUP  # int4 weights per fp16 scale + zero point (gpt-fast's README figures: 32)
    prefill_chunk_tokens: int | None = None  # an engine scheduler's per-step token budget (None: max_num_batched_tokens)
    pipeline_parallel: int = 1  # pipeline stages per replica, each on tensor_parallel GPUs (plan/serve_pipeline.py)
    prefix_hit_ratio: float = 0.0  # share of each prompt found in the engine's prefix cache (plan/serve_engines.py)
    fp8_activations: str = "dynamic"  # --dtype fp8: activation scales computed each step, or static (plan/serve_quant.py)

    @property
    def prefill_tokens(self) -> int:  # prompt tokens a prefill computes: those the prefix cache does not hold
        return engines.computed_prompt_tokens(self.prompt_tokens, self.prefix_hit_ratio)

    @property
    def step_budget_tokens(self) -> int:
        """The tokens an engine step may carry, decodes and prefill chunks together (plan/scheduling.py):
        vLLM's one flag sets this and its profiling forward (SGLang, TGI: serve_engine_rules.with_engine_defaults)."""
        return self.prefill_chunk_tokens or self.max_num_batched_tokens or VLLM_MAX_BATCHED_TOKENS

    @property
    def compute_dtype(self) -> str:
        return self.dtype if self.dtype in ("fp32", "fp16") else "bf16"

    @property
    def matmul_dtype(self) -> str:
        """The tensor-core format the GEMMs run in: FP8 weights with FP8 activations (TensorRT-LLM,
        vLLM's fp8 W8A8) use the FP8 peak; weight-only int8/int4 dequantize to 16-bit first."""
        return "fp8" if self.dtype == "fp8" else self.compute_dtype

    @property
    def kv_bytes(self) -> float:
        kv = self.kv_dtype or self.compute_dtype
        if kv not in WEIGHT_BYTES or kv in ("int4",):
            raise BadInputError(f"Unknown KV-cache dtype {kv!r}.", hint="Use bf16, fp16, fp8 or fp32.")
        return WEIGHT_BYTES[kv]

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.new_tokens

    def validate(self, gpu: GpuSpec | None = None) -> None:
        if self.dtype not in WEIGHT_BYTES:
            raise BadInputError(f"Unknown weight dtype {self.dtype!r}.", hint=f"Use one of {', '.join(WEIGHT_BYTES)}.")
        check_fp8_activations(self.fp8_activations)
        if self.runtime not in RUNTIMES:
            raise BadInputError(f"Unknown runtime {self.runtime!r}.", hint="Use hf (transformers generate), vllm, sglang, tgi or trtllm.")
        for what, v in (("batch", self.batch), ("prompt length", self.prompt_tokens),
                        ("profiling token budget", self.max_num_batched_tokens or 1),
                        ("number of new tokens", self.new_tokens), ("tensor-parallel degree", self.tensor_parallel),
                        ("pipeline-parallel degree", self.pipeline_parallel)):
            if v <= 0:
                raise BadInputError(f"The {what} must be at least 1, not {v}.", hint=f"Pass a positive {what}.")
        if self.prefill_chunk_tokens is not None and self.prefill_chunk_tokens <= 0:
            raise BadInputError(f"The prefill chunk budget must be at least 1 token, not {self.prefill_chunk_tokens}.",
                                hint="vLLM's default max_num_batched_tokens is 8192.")
        engines.check_prefix_caching(self.runtime, self.prefix_hit_ratio)
        if self.int4_group_size <= 0:
            raise BadInputError(f"The int4 group size must be at least 1, not {self.int4_group_size}.",
                                hint="GPTQ/AWQ use 128; gpt-fast's int4 benchmarks 32.")
        if self.nccl_communicators < 0:
            raise BadInputError(f"The number of NCCL communicators cannot be negative ({self.nccl_communicators}).",
                                hint="Pass 0 or more (vLLM 0.2.x: 2).")
        if not 0.1 <= self.gpu_memory_utilization <= 1.0:
            raise BadInputError("gpu_memory_utilization must lie between 0.1 and 1.", hint="vLLM's default is 0.9.")
        if gpu is not None:
            for fmt in {self.dtype, self.kv_dtype or self.compute_dtype, self.compute_dtype}:
                if fmt in ("fp8", "bf16", "fp16"):
                    gpu.peak_flops(fmt)  # raises UnsupportedPrecisionError with a hint


def tensor_parallel_problem(m: ModelSpec, tp: int) -> str | None:
    """Why `tp` cannot split `m`, as vLLM checks it (None when it can): the attention heads must
    divide evenly, and the KV heads either divide evenly or are replicated (tp a multiple of them)."""
    if tp <= 1:
        return None
    if m.num_heads % tp:
        return f"{m.name} has {m.num_heads} attention heads, which {tp} GPUs cannot split evenly"
    if m.num_kv_heads % tp and tp % m.num_kv_heads:
        return f"{m.name} has {m.num_kv_heads} KV heads: {tp} GPUs neither split nor replicate them evenly"
    return None


def check_tensor_parallel(m: ModelSpec, tp: int) -> None:
    why = tensor_parallel_problem(m, tp)
    if why:
        ok = [d for d in range(1, m.num_heads + 1) if d <= 64 and tensor_parallel_problem(m, d) is None]
        raise BadInputError(f"Tensor parallelism {tp}: {why}.",
                            hint=f"Use --tp {', '.join(str(d) for d in ok if d > 1) or '1'} (degrees that divide the heads).")


def weight_bytes(m: ModelSpec, dtype: str, group: int = INT4_GROUP) -> float:
    """Quantization applies to the transformer blocks' Linear layers; embeddings, the output head
    and norms stay in 16-bit (as GPTQ/AWQ/FP8 checkpoints ship them). int4: one fp16 scale and
    one fp16 zero point per `group` weights (4 bytes: 0.03 bytes per weight at 128, 0.125 at 32)."""
    per = WEIGHT_BYTES[dtype]
    if dtype in ("fp32", "bf16", "fp16"):
        return m.params * per
    blocks = m.block_params
    rest = m.params - blocks
    q = blocks * per
    if dtype == "int4":
        q += blocks / group * 4  # fp16 scale + fp16 zero per group
    elif dtype == "int8":
        q += m.num_layers * 6 * m.hidden_size * 2  # per-output-channel fp16 scales (order of magnitude)
    return q + rest * 2


@dataclass
class ServeSpeed:
    batch: int
    prefill_seconds: float
    ttft_seconds: float
    tpot_seconds: float
    decode_tokens_per_second: float  # batch / TPOT
    request_seconds: float  # prefill + new_tokens x TPOT
    requests_per_second: float
    output_tokens_per_second: float
    bound: str  # "memory" or "compute" for decode
    efficiency_source: str
    tensor_parallel_seconds: float = 0.0  # of each decode step: 2 all-reduces per layer, not overlapped
    prefill_tensor_parallel_seconds: float = 0.0  # of the prefill, likewise
    tensor_parallel_link: str = ""  # the ring's slowest link
    tensor_parallel_protocol: str = ""  # the NCCL protocol the decode all-reduce is priced with
    speculative: SpeculativeSpeed | None = None  # with a draft model: what a step costs and yields
    prefill_flops: float = 0.0  # the prefill's FLOPs (prompt tokens the prefix cache does not hold)
    prefix_hit_ratio: float = 0.0
    pipeline: stages.PipelineSpeed | None = None  # pipeline stages: micro-batches and sends (plan/serve_pipeline.py)
    fp8_activation_quant_seconds: float = 0.0  # of each decode step: dynamic FP8 activation scaling (serve_quant.py)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None or k not in ("speculative", "pipeline")}


@dataclass
class ServePlan:
    memory: MemoryEstimate
    speed: ServeSpeed
    max_batch_that_fits: int
    max_concurrency: int | None  # vllm: sequences of the full context the KV pool holds
    kv_cache_bytes_per_token: float
    tpot_by_batch: list[dict[str, float]] = field(default_factory=list)
    max_batch_for_tpot: int | None = None


def serving_memory(m: ModelSpec, setup: ServeSetup, *, capacity_bytes: int, eff: Efficiency,
                   cuda_context_bytes: int = 512 << 20) -> MemoryEstimate:
    tp = setup.tensor_parallel
    b, p, k = setup.batch, setup.prompt_tokens, setup.new_tokens
    cb = 4 if setup.compute_dtype == "fp32" else 2
    w = serving_weight_bytes(m, setup)
    # KV heads split over TP, replicated beyond them; a pipeline stage holds its layers' share
    kv_share = max(1, tp // max(1, m.num_kv_heads)) / tp / setup.pipeline_parallel

    def kv(tokens: float) -> float:  # one sequence's cache on one GPU
        return m.kv_bytes_for_context(tokens, setup.kv_bytes) * kv_share
    h, inter, vocab = m.hidden_size, m.intermediate_size, m.vocab_size
    notes: list[str] = []
    if setup.runtime == "hf":
        if tp > 1:  # transformers' docs: TP is communication-heavy, keep it inside one node
            notes.append("transformers' own tensor parallelism (from_pretrained(tp_plan=\"auto\"), run with torchrun) "
                         "is priced with generate's eager costs on each GPU"
                         + ("; its docs advise one node, and pipeline or data parallelism across nodes"
                            if tp > setup.gpus_per_node else ""))
        cands: dict[str, dict[str, float]] = {
            "prefill logits": {
                "weights": w, "kv_cache": kv(p) * b,
                "logits": b * p * vocab * cb / tp + b * p * h * cb,  # logits of every prompt position + head input
                "cuda_workspace": eff.workspace_bytes,
            },
            "prefill mlp": {
                "weights": w, "kv_cache": kv(p) * b,
                "activations": b * p * (2 * h * cb + 3 * inter * cb / tp),  # input, gate, up, act of the last layer
                "cuda_workspace": eff.workspace_bytes,
            },
            "end of decode": {
                "weights": w, "kv_cache": kv(p + k) * b * (1 + 1 / m.num_layers),  # + one layer's cat copy
                "logits": b * vocab * (cb + 8), "cuda_workspace": eff.workspace_bytes,
            },
        }
        return peak_of(cands, notes, reserved_ratio=eff.reserved_ratio, cuda_context_bytes=cuda_context_bytes,
                       capacity_bytes=capacity_bytes)
    # vLLM: preallocate; the KV pool is what is left (SGLang, TGI: serve_engine_rules.py)
    setup = engines.rules.with_engine_defaults(setup, m, capacity_bytes)
    budget = setup.gpu_memory_utilization * capacity_bytes - cuda_context_bytes
    tokens = max(setup.max_num_batched_tokens or VLLM_MAX_BATCHED_TOKENS, p)  # SGLang runs none
    mlp_act = tokens * (2 * h * cb + 3 * inter * cb / tp)
    act = mlp_act + min(256, max(b, 1)) * vocab * 4
    held = all_reduce_held_bytes(m, setup, tokens, cb)
    graphs = VLLM_CUDA_GRAPHS_BYTES if setup.runtime != "trtllm" else 0  # TensorRT-LLM: no graph pool (serve_engines)
    nccl = engine_nccl_bytes(setup)
    draft_w = serving_weight_bytes(setup.speculative.draft, setup) if setup.speculative else 0.0
    kv_pool = budget - w - draft_w - act - held - graphs - nccl - eff.workspace_bytes
    if setup.runtime == "trtllm":  # a share of what is free, not of the card
        kv_pool = engines.trtllm_kv_pool_bytes(capacity_bytes, cuda_context_bytes, w + draft_w + act + held + nccl + eff.workspace_bytes)
        notes.append(engines.TRTLLM_NOTE)
    if setup.pipeline_parallel > 1:
        notes.append(stages.stage_note(m, setup.pipeline_parallel))
    breakdown = {
        "weights": int(w), **({"draft_weights": int(draft_w)} if draft_w else {}), "activations": int(act),
        **({"cuda_graphs": int(graphs)} if setup.runtime != "trtllm" else {}), "nccl_buffers": int(nccl),
        "cuda_workspace": int(eff.workspace_bytes), "kv_cache": int(max(0.0, kv_pool)),
    }
    pool = engines.engine_pool(setup.runtime, m, capacity_bytes=capacity_bytes, cuda_context_bytes=cuda_context_bytes, tokens=tokens,
                               weights={"weights": w, "draft_weights": draft_w}, mlp_activation_bytes=mlp_act + held, act_bytes=cb,
                               nccl_bytes=nccl, workspace_bytes=eff.workspace_bytes, kv_bytes_per_token=kv(1.0), gpus=tp * setup.pipeline_parallel)
    if pool is not None:  # SGLang's, TGI's own sizing, each rule in its note
        kv_pool, held, breakdown = pool.kv_pool_bytes, 0.0, {k: int(v) for k, v in pool.rows.items()}
        notes.insert(0, pool.note)
    breakdown = {k: v for k, v in breakdown.items() if v or k != "nccl_buffers"}
    if held:  # after the profiling forward's own peak, in the memory table
        first = ("weights", "draft_weights", "activations")
        breakdown = {k: v for k, v in breakdown.items() if k in first} | {
            "nccl_held_activations": int(held)} | {k: v for k, v in breakdown.items() if k not in first}
        notes.append(f"{held / 2**30:.1f} GiB of all-reduced activations stay reserved through the profiling forward "
                     "(ProcessGroupNCCL's record_stream; vLLM <= 0.2.6, or TORCH_NCCL_AVOID_RECORD_STREAMS unset)")
    peak = int(sum(breakdown.values()))
    per_seq = engine_sequence_kv_bytes(m, setup)
    concurrency = int(max(0.0, kv_pool) // per_seq) if per_seq else 0
    fits = kv_pool > 0 and concurrency >= b
    notes.append(f"the KV pool holds {concurrency} sequences of {setup.context_tokens} tokens"
                 + (f" (with the draft {setup.speculative.draft.name}'s cache and {setup.speculative.tokens} lookahead "
                    "slots each)" if setup.speculative else ""))
    est = MemoryEstimate(peak, breakdown, "start (preallocated)", peak, cuda_context_bytes, capacity_bytes, fits,
                         {"start (preallocated)": peak}, notes)
    return est


def engine_nccl_bytes(setup: ServeSetup) -> float:
    """What an engine's NCCL communicators hold on each GPU of its TP group, outside PyTorch's
    allocator (`links.nccl_communicator_bytes` each), which the KV pool is sized around: vLLM reads
    the device's free memory after its profiling forward (PR #2031), so memory NCCL took counts.
    `nccl_communicators`: vLLM 0.2.x made two, a warm-up all_reduce on the default process group
    (worker.py's `_init_distributed_environment`) and the tensor-parallel group `initialize_model_parallel`
    creates with `torch.distributed.new_group`, each its own communicator under PyTorch 2.1.
    0 at TP 1 and for hf."""
    if setup.tensor_parallel <= 1 or setup.runtime == "hf":
        return 0.0
    return float(setup.nccl_communicators * nccl_communicator_bytes(setup.tensor_parallel))


def all_reduce_held_bytes(m: ModelSpec, setup: ServeSetup, tokens: int, act_bytes: float) -> float:
    """What an engine's profiling forward keeps reserved at TP > 1 when PyTorch's ProcessGroupNCCL
    marks each all-reduced tensor with record_stream (`nccl_record_streams`): the caching allocator
    reuses a block freed on the compute stream only once an event on the NCCL stream has completed,
    and the CPU enqueues the whole forward long before the GPU reaches it, so none of the 2 L + 1
    all-reduced activations (the vocab-parallel embedding's and two per layer, tokens x hidden each)
    is reused within the forward. vLLM issue #2248 (comment of 2024-01-26: fragmentation at TP > 1
    from record_stream; TORCH_NCCL_AVOID_RECORD_STREAMS=1, set from vLLM 0.2.7 with PyTorch >= 2.1.2,
    removes it), and vLLM PR #2031, whose profiling reads the device's used memory (reserved, not
    allocated), which is how it shows up in the KV pool. 0 at TP 1, for hf and without the flag."""
    if setup.tensor_parallel <= 1 or not setup.nccl_record_streams or setup.runtime == "hf":
        return 0.0
    return (2 * m.num_layers + 1) * tokens * m.hidden_size * act_bytes


def engine_sequence_kv_bytes(m: ModelSpec, setup: ServeSetup) -> float:
    """One sequence's KV blocks on one GPU of an engine's pool: the full context in whole blocks;
    with a draft model (plan/speculative.py), K lookahead slots more, and the draft's cache beside
    the target's (vLLM gives both models the same number of blocks)."""
    tp = setup.tensor_parallel
    extra = setup.speculative.tokens if setup.speculative else 0
    block = engines.block_tokens(setup.runtime)
    seq_tokens = math.ceil((setup.context_tokens + extra) / block) * block
    per_seq = m.kv_bytes_for_context(seq_tokens, setup.kv_bytes) * max(1, tp // max(1, m.num_kv_heads)) / tp / setup.pipeline_parallel
    if setup.speculative:  # the draft's cache: split over the TP group like the target's
        d = setup.speculative.draft
        per_seq += d.kv_bytes_for_context(seq_tokens, setup.kv_bytes) * max(1, tp // max(1, d.num_kv_heads)) / tp
    return per_seq


def vllm_concurrency(m: ModelSpec, setup: ServeSetup, capacity_bytes: int, eff: Efficiency) -> int:
    est = serving_memory(m, setup, capacity_bytes=capacity_bytes, eff=eff)
    return int(est.breakdown.get("kv_cache", 0) // engine_sequence_kv_bytes(m, setup))


def decode_weight_bytes(m: ModelSpec, dtype: str, batch: int, group: int = INT4_GROUP) -> float:
    """Weight bytes one decode step reads: every matrix except the input embedding's table (a
    lookup reads `batch` rows; a tied table is read whole by the output head), and for a MoE only
    the experts the batch's tokens touch."""
    total = weight_bytes(m, dtype, group)
    if not m.tie_word_embeddings and not m.encoder:
        total -= m.vocab_size * m.hidden_size * 2 * (1 - min(batch, m.vocab_size) / m.vocab_size)
    if m.is_moe:
        blocks = m.block_params
        block_bytes_per_param = (weight_bytes(m, dtype, group) - (m.params - blocks) * 2) / blocks if dtype not in (
            "fp32", "bf16", "fp16") else WEIGHT_BYTES[dtype]
        touched = expected_experts_touched(m.num_experts, m.experts_per_token, batch) / m.num_experts
        total -= m.moe_layers * m.expert_params_per_layer() * block_bytes_per_param * (1 - touched)
    return total


def head_quantization_saving(m: ModelSpec, setup: ServeSetup) -> float:
    """Bytes a quantized output head saves against the 16-bit one `weight_bytes` counts (its
    scales added back: int4 one fp16 scale and zero point per group, int8 one fp16 scale per row)."""
    n = quantized_head_params(m, setup)
    if not n:
        return 0.0
    scales = n / setup.int4_group_size * 4 if setup.dtype == "int4" else m.vocab_size * 2
    return n * (2 - WEIGHT_BYTES[setup.dtype]) - scales


def decode_head_bytes(m: ModelSpec, batch: int, setup: ServeSetup | None = None) -> float:
    """What a decode step reads outside the transformer blocks: the output head whole (16-bit, or
    in the weight format with `quantize_head`), the input embedding only by the rows it looks up (a
    tied table is the head), the final norm. An engine that splits only the blocks over the TP
    group (gpt-fast's `apply_tp` loops over `model.layers`; vLLM splits the head too) has every
    rank read all of it."""
    rest = (m.params - m.block_params) * 2
    if not m.tie_word_embeddings and not m.encoder:
        rest -= m.vocab_size * m.hidden_size * 2 * (1 - min(batch, m.vocab_size) / m.vocab_size)
    return rest - (head_quantization_saving(m, setup) if setup is not None else 0.0)


def serving_weight_bytes(m: ModelSpec, setup: ServeSetup) -> float:
    """One GPU's weights: the model over the TP group, the quantized head's saving taken off, and,
    for an engine that splits only the blocks, the rest (embedding, head, final norm) whole."""
    w = (weight_bytes(m, setup.dtype, setup.int4_group_size) - head_quantization_saving(m, setup)) / setup.tensor_parallel
    rest = (m.params - m.block_params) * 2 - head_quantization_saving(m, setup)
    if setup.pipeline_parallel > 1:  # the heaviest stage: its share of the blocks, its embedding or head (serve_pipeline)
        blocks = weight_bytes(m, setup.dtype, setup.int4_group_size) - (m.params - m.block_params) * 2
        rest = stages.heaviest_stage_rest_params(m) * 2 - head_quantization_saving(m, setup)
        w = (blocks / setup.pipeline_parallel + rest) / setup.tensor_parallel
    if not setup.tp_shards_head and setup.tensor_parallel > 1:
        w += rest * (setup.tensor_parallel - 1) / setup.tensor_parallel
    return w


def elementwise_bytes_per_token_layer(m: ModelSpec, c: float) -> float:
    """Bytes an eager forward's elementwise kernels read and write per token and layer (c: bytes
    per activation element). RMSNorm as transformers writes it: read x, write its fp32 copy, pow
    (read, write), mean (read), scale (read, write), cast back (read, write), weight (read,
    write): 28 h + 4 c h; LayerNorm is one fused kernel (read, write). Two residual adds (read
    two, write one); rotary on q and k (~9 passes: two products, rotate_half's slices and cat,
    the sum); the MLP's activation (gated: act(gate) and its product with up, 5 passes over the
    intermediate; plain: 2), per routed expert for a MoE."""
    h = m.hidden_size
    norm = 2 * c * h if m.norm == "layernorm" else 28 * h + 4 * c * h
    total = m.norms_per_layer * norm + 2 * 3 * c * h
    if not m.learned_positions:
        total += 9 * c * (m.q_size + m.kv_size)
    inter = m.moe_intermediate_size or m.intermediate_size
    act = (5 if m.mlp == "gated" else 2) * c * inter
    if m.is_moe:
        act *= m.experts_per_token
        if m.shared_expert_intermediate_size:
            act += 5 * c * m.shared_expert_intermediate_size
    return total + act


def serving_speed(m: ModelSpec, setup: ServeSetup, gpu: GpuSpec, eff: Efficiency) -> ServeSpeed:
    """Prefill: compute-bound (2 N per token + causal attention) at the runtime's prefill
    efficiency. A decode step: the bytes it reads (the weights it touches, the KV cache at the
    current context; eager generate also copies the cache) over the runtime's share of the
    bandwidth, or the compute bound at large batch, plus the runtime's fixed costs. With a draft
    model, plan/speculative.py prices the draft and the verification steps with this function."""
    if setup.speculative is not None:  # the draft prices its steps with this function (no import back up)
        return setup.speculative.speed(m, setup, gpu, eff)
    if setup.pipeline_parallel > 1:  # the stages' sum and the sends (plan/serve_pipeline.py)
        return stages.pipelined_speed(m, setup, gpu, serving_speed(m, replace(setup, pipeline_parallel=1), gpu, eff),
                               lambda size: serving_speed(m, replace(setup, pipeline_parallel=1, batch=size), gpu, eff))
    rt = eff.runtime(setup.runtime)
    tp = setup.tensor_parallel
    b, p, k = setup.batch, setup.prompt_tokens, setup.new_tokens
    fmt = setup.matmul_dtype
    # hf is PyTorch eager, as training is: it shares the training fit's matmul efficiency; an
    # engine has its own prefill efficiency for its compute bound
    matmul_ratio = eff.fp32_compute_ratio if fmt == "fp32" else eff.compute_ratio
    if setup.runtime != "hf" and rt.prefill_compute_ratio:
        matmul_ratio = rt.prefill_compute_ratio
    peak = gpu.peak_flops(fmt) * matmul_ratio * tp
    bw = gpu.memory_bandwidth_bytes_per_second * rt.decode_bandwidth_ratio * tp
    n = m.matmul_params
    q_p = setup.prefill_tokens  # a prefix-cache hit's tokens are not computed; the rest attend to all p
    cached = p - q_p
    attn_flops = 2 * m.num_layers * m.num_heads * m.head_dim * (p * p - cached * cached) * b  # causal QK^T and AV
    prefill_flops = 2 * n * b * q_p + attn_flops
    if setup.runtime != "hf":
        prefill_flops -= 2 * m.vocab_size * m.hidden_size * b * (q_p - 1)  # logits of the last position only
    pre_ratio = rt.prefill_compute_ratio or matmul_ratio
    # a prefill is one forward of the same layers: their launch cost per layer, plus its own fixed cost
    prefill = (prefill_flops / (gpu.peak_flops(fmt) * pre_ratio * tp) + rt.prefill_overhead_seconds
               + m.num_layers * rt.decode_layer_overhead_seconds)
    elementwise = m.num_layers * b * q_p * elementwise_bytes_per_token_layer(m, WEIGHT_BYTES[setup.compute_dtype])
    pre_bw = gpu.memory_bandwidth_bytes_per_second * (rt.prefill_bandwidth_ratio or eff.memory_bandwidth_ratio) * tp
    prefill += elementwise / pre_bw + fp8_activation_quant_seconds(m, setup, gpu, b * q_p, pre_bw / tp)
    ctx = p + k / 2  # mean context during decode
    kv_read = b * m.kv_bytes_for_context(ctx, setup.kv_bytes)
    if setup.runtime == "hf":
        # DynamicCache concatenates (reads and writes the cache once more per step); with grouped
        # KV heads, SDPA's eager path repeats K and V to every query head (written, then read)
        if m.is_mla:
            # transformers decompresses every cached latent into per-head K and V each step
            # (written, then read by SDPA): a (qk + v) elements per token and layer
            full = m.num_heads * (m.head_dim + m.v_head_dim) / m.kv_elements_per_token_layer
            kv_read *= 3 + 2 * full
        else:
            rep = m.num_heads // m.num_kv_heads
            kv_read *= 3 + (2 * rep if rep > 1 else 0)
    replicated = 0.0 if setup.tp_shards_head else (tp - 1) * decode_head_bytes(m, b, setup)  # every rank reads it whole
    q = setup.step_tokens  # a speculative verification computes K + 1 tokens per sequence, reading all once
    weights_read = decode_weight_bytes(m, setup.dtype, b * q, setup.int4_group_size) - head_quantization_saving(m, setup) + replicated
    mem_time = (weights_read + kv_read) / bw + dequantize_seconds(m, setup, gpu)
    fp8_quant = fp8_activation_quant_seconds(m, setup, gpu, b * q, bw / tp)  # launch floors at decode sizes
    mem_time += fp8_quant
    comp_time = (2 * m.active_params * b + 4 * m.num_layers * m.num_heads * m.head_dim * ctx * b) * q / peak
    overhead = rt.decode_step_overhead_seconds + m.num_layers * rt.decode_layer_overhead_seconds
    act_bytes = 4 if fmt == "fp32" else 2
    step_ar = tensor_parallel_all_reduce(m, setup, gpu, b * q * m.hidden_size * act_bytes)
    prefill_ar = tensor_parallel_all_reduce(m, setup, gpu, b * q_p * m.hidden_size * act_bytes)
    comm = 2 * m.num_layers * step_ar.seconds  # two all-reduces per layer
    prefill_comm = 2 * m.num_layers * prefill_ar.seconds
    prefill += prefill_comm
    tpot = max(mem_time, comp_time) + overhead + comm
    bound = "memory" if mem_time >= comp_time else "compute"
    req = prefill + k * tpot
    return ServeSpeed(
        batch=b,
        prefill_seconds=prefill,
        ttft_seconds=prefill,
        tpot_seconds=tpot,
        decode_tokens_per_second=b / tpot,
        request_seconds=req,
        requests_per_second=b / req,
        output_tokens_per_second=b * k / req,
        bound=bound,
        efficiency_source=rt.source,
        tensor_parallel_seconds=comm,
        prefill_tensor_parallel_seconds=prefill_comm,
        tensor_parallel_link=step_ar.link.name if tp > 1 else "",
        tensor_parallel_protocol=step_ar.protocol,
        prefill_flops=prefill_flops,
        prefix_hit_ratio=setup.prefix_hit_ratio,
        fp8_activation_quant_seconds=fp8_quant,
    )


def tensor_parallel_all_reduce(m: ModelSpec, setup: ServeSetup, gpu: GpuSpec, message_bytes: float) -> AllReduceCost:
    """One of a layer's two tensor-parallel all-reduces over the replica's TP group."""
    return ring_all_reduce(message_bytes, setup.tensor_parallel, gpu, gpus_per_node=setup.gpus_per_node,
                           inter_node_bytes_per_second=setup.inter_node_bytes_per_second)


def max_batch_that_fits(m: ModelSpec, setup: ServeSetup, capacity_bytes: int, eff: Efficiency, limit: int = 4096) -> int:
    """The largest concurrency whose memory fits (0 if not even one)."""
    if setup.runtime != "hf":
        return min(limit, vllm_concurrency(m, setup, capacity_bytes, eff))

    def ok(bb: int) -> bool:
        return serving_memory(m, replace(setup, batch=bb), capacity_bytes=capacity_bytes, eff=eff).fits

    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and ok(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def plan_serving(m: ModelSpec, setup: ServeSetup, gpu: GpuSpec, eff: Efficiency, *, tpot_target_seconds: float | None = None,
                 cuda_context_bytes: int = 512 << 20) -> ServePlan:
    setup = engines.rules.with_engine_defaults(setup, m, gpu.memory_bytes)  # SGLang's, TGI's own defaults
    setup.validate(gpu)
    check_tensor_parallel(m, setup.tensor_parallel)
    stages.check_pipeline(m, setup.runtime, setup.pipeline_parallel, speculative=setup.speculative is not None)
    if setup.speculative is not None:
        setup.speculative.check(m, setup)
    mem = serving_memory(m, setup, capacity_bytes=gpu.memory_bytes, eff=eff, cuda_context_bytes=cuda_context_bytes)
    speed = serving_speed(m, setup, gpu, eff)
    max_fit = max_batch_that_fits(m, setup, gpu.memory_bytes, eff)
    table = []
    bb = 1
    while bb <= max(1, max_fit):
        s = serving_speed(m, replace(setup, batch=bb), gpu, eff)
        table.append({"batch": bb, "ttft_seconds": s.ttft_seconds, "tpot_seconds": s.tpot_seconds,
                      "output_tokens_per_second": s.output_tokens_per_second}
                     | ({"speculative_speedup_ratio": s.speculative.speedup_ratio} if s.speculative else {}))
        bb *= 2
    best_for_target = None
    if tpot_target_seconds is not None:
        best_for_target = 0
        for bb in range(1, max(1, max_fit) + 1):
            if serving_speed(m, replace(setup, batch=bb), gpu, eff).tpot_seconds <= tpot_target_seconds:
                best_for_target = bb
            else:
                break
    kv_tok = m.kv_bytes_per_token(setup.kv_bytes)
    conc = vllm_concurrency(m, setup, gpu.memory_bytes, eff) if setup.runtime != "hf" else None
    return ServePlan(mem, speed, max_fit, conc, kv_tok, table, best_for_target)
