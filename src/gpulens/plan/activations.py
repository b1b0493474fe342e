"""What one transformer layer saves for backward, per token, as transformers' eager code runs it
(SDPA attention), by precision mode; the head's and the loss's saved tensors. Split out of
memory.py, which adds weights, gradients, optimizer states and the peaks; the mechanisms are
described there and checked in tests/plan/test_saved_tensors.py."""

from __future__ import annotations

from dataclasses import dataclass

from gpulens.plan.models import ModelSpec
from gpulens.plan.nemo_optim import VOCAB_PARALLEL_LOSS_BYTES_PER_ENTRY

# ---------------------------------------------------------------- dtypes of each precision mode


@dataclass(frozen=True)
class _Mode:
    weight: int  # bytes per parameter as stored
    compute: int  # bytes per element of matmul outputs
    residual: int  # the residual stream's dtype
    amp: bool  # autocast: fp32 inputs to Linear layers are cast per layer


def _mode(precision: str) -> _Mode:
    if precision == "fp32":
        return _Mode(4, 4, 4, False)
    if precision in ("amp_bf16", "amp_fp16", "fp8"):  # fp8: Transformer Engine on the amp_bf16 layout (plan/fp8.py)
        return _Mode(4, 2, 4, True)
    return _Mode(2, 2, 2, False)  # bf16 / fp16: weights and states in 16-bit


def _norm_internal(m: ModelSpec, mode: _Mode) -> int:
    """Bytes per token a norm saves for backward besides its output (per hidden element)."""
    h = m.hidden_size
    if m.norm == "layernorm":
        return mode.residual * h  # native layer_norm saves its input (+ tiny mean/rstd)
    if m.norm == "gemma_rmsnorm":
        return 8 * h  # x.float() and the normalized fp32 tensor
    # LLaMA RMSNorm computes in fp32: saves the fp32 input and the normalized tensor (fp32 when the
    # residual is fp32, else the 16-bit cast that is multiplied by the weight)
    return (4 + 4) * h if mode.residual == 4 else (4 + 2) * h


def _norm_out(m: ModelSpec, mode: _Mode, consumers: int) -> int:
    """Bytes per token of the norm output as saved by the Linear layers that read it."""
    h = m.hidden_size
    if mode.amp:
            return consumers * 2 * h  # each Linear saves its own 16-bit cast of the fp32 output
    return mode.compute * h  # one tensor, shared by the Linear layers that read it


def attention_kernel(m: ModelSpec, precision: str) -> str:
    """Which SDPA backend PyTorch picks: flash needs 16-bit and head_dim <= 256; the memory-efficient
    kernel takes fp32 but not grouped-query heads (transformers passes enable_gqa), so fp32 with
    GQA falls back to the math kernel, which materializes the S x S probabilities."""
    if m.attention_impl == "eager":
        return "eager"
    half = precision != "fp32"
    gqa = m.num_kv_heads != m.num_heads
    if half and m.head_dim <= 256:
        return "flash"
    if not gqa:
        return "efficient"
    return "math"


def layer_activation_bytes(m: ModelSpec, precision: str, micro_batch: int, seq: int, *,
                           recompute: str = "none") -> dict[str, int]:
    """Bytes one layer saves for backward, split into attention / mlp / norms, for the micro-batch.

    `recompute="selective"` (Korthikanti et al. 2022, section 5): the attention core (from q, k, v
    to the output that o_proj reads) is checkpointed, so it keeps only its inputs q, k, v and the
    output o_proj saves anyway; what the kernel keeps inside (the S x S scores of the math and
    eager paths, repeated K/V, the flash kernel's log-sum-exp) is recomputed in the backward."""
    mode = _mode(precision)
    tokens = micro_batch * seq
    c = mode.compute
    a, g, d = m.num_heads, m.num_kv_heads, m.head_dim
    h = m.hidden_size
    # attention: input norm, its output as saved by q/k/v (one fused or three Linears), q/k/v/out
    # as the kernel saves them, its log-sum-exp
    qkv_linears = 1 if m.qkv_fused else 3
    norm_bytes = _norm_internal(m, mode) + _norm_out(m, mode, qkv_linears)
    attn = c * (a * d + 2 * g * d) + c * a * d + 4 * a  # q, k, v, out (out = o_proj's input), lse
    if m.qk_norm:
        attn += ((4 + 2) if c == 2 else 8) * (a + g) * d
    kernel = attention_kernel(m, precision)
    attn_sq = 0
    if kernel == "math":
        attn = c * 4 * a * d  # scaled q, repeated k and v, out
        attn_sq = micro_batch * a * seq * seq * c  # softmax probabilities (per layer)
    elif kernel == "eager":
        # transformers' eager attention (Gemma-2: no SDPA): q, K and V repeated to every head, the
        # output's contiguous copy for o_proj; per score: the soft-capping tanh's output, the fp32
        # softmax output and (16-bit) its cast that multiplies V
        attn = c * 4 * a * d
        per_score = 4 + (c if c != 4 else 0) + (c if m.attn_logit_softcap else 0)
        attn_sq = micro_batch * a * seq * seq * per_score
    if recompute == "selective":
        attn = c * (a * d + 2 * g * d) + c * a * d + (((4 + 2) if c == 2 else 8) * (a + g) * d if m.qk_norm else 0)
        attn_sq = 0
    if m.dropout > 0:
        attn += h  # 1-byte dropout mask after the attention output
    # MLP: post-attention norm, its output as saved by gate/up (or fc), the intermediates
    mlp_linears = (1 if m.gate_up_fused else 2) if m.mlp == "gated" else 1
    norm_bytes += _norm_out(m, mode, mlp_linears)
    if not m.parallel_residual:  # NeoX's two LayerNorms read (and save) the same input
        norm_bytes += _norm_internal(m, mode)
    extra_norms = max(0, m.norms_per_layer - 2)
    norm_bytes += extra_norms * 8 * h  # Gemma-2's post-norms: fp32 input and normalized copies
    inter = m.moe_intermediate_size or m.intermediate_size
    if m.mlp == "gated":
        per_expert_tok = 4 * c * inter  # gate out, act out, up out, product (= down's input)
    elif m.act == "gelu_new":
        # GPT-2's Python tanh-GELU keeps x, tanh(.), 0.5x, 1+tanh(.) and its output; under autocast
        # pow and tanh run in fp32
        per_expert_tok = (16 if mode.amp else 5 * c) * inter
    else:
        per_expert_tok = 2 * c * inter  # fc out (the activation's input), activation out
    if m.is_moe:
        # transformers runs the experts as grouped matmuls, which autocast does not cast: under
        # amp they compute (and save) in fp32
        k = m.experts_per_token
        ce = 4 if mode.amp else c
        per_expert_tok = per_expert_tok // c * ce
        mlp = k * (ce * h + per_expert_tok + ce * h) + 4 * m.num_experts  # routed copy, intermediates, out; router
        if m.shared_expert_intermediate_size:
            mlp += 4 * c * m.shared_expert_intermediate_size
    else:
        mlp = per_expert_tok
    if m.dropout > 0:
        mlp += h
    return {
        "attention": tokens * attn + attn_sq,
        "mlp": tokens * mlp,
        "norms": tokens * norm_bytes,
        "kernel_math": int(kernel == "math"),
    }


def _head_bytes_per_token(m: ModelSpec, mode: _Mode) -> int:
    """Final norm + the output head's saved input, per token."""
    if m.encoder:
        # BERT's MLM head: dense (saves the last hidden state), GELU, LayerNorm, decoder inputs
        return (mode.residual + 3 * mode.compute) * m.hidden_size
    return _norm_internal(m, mode) + _norm_out(m, mode, 1)


def _loss_bytes(m: ModelSpec, precision: str, tokens: int, loss: str = "torch") -> int:
    """Logits and loss alive at the start of the backward. transformers upcasts logits to fp32;
    log_softmax keeps its fp32 output, and its gradient plus the logits' gradient are allocated
    before it is released: 3 x 4 bytes per vocabulary entry per token. A fused kernel (flash-attn's
    in-place CrossEntropyLoss, llm-foundry's default) keeps the 16-bit logits and one fp32 lse."""
    if loss == "fused":
        return tokens * (_mode(precision).compute * m.vocab_size + 4)
    if loss == "vocab-parallel":  # Megatron-Core's: bf16 logits + an fp32 softmax made in place (plan/nemo_optim.py)
        return tokens * VOCAB_PARALLEL_LOSS_BYTES_PER_ENTRY * m.vocab_size
    per_tok = 12 * m.vocab_size
    if m.encoder and precision in ("bf16", "fp16"):
        per_tok = 6 * m.vocab_size  # BERT's MLM loss does not upcast
    if m.final_logit_softcap:
        per_tok += _mode(precision).compute * m.vocab_size  # tanh output kept by soft-capping
    return tokens * per_tok


def activation_bytes_full(m: ModelSpec, precision: str, micro_batch: int, seq: int, loss: str = "torch") -> int:
    """Saved activations without checkpointing plus the loss tensors (`loss`: the cross-entropy
    kernel, as `TrainSetup.loss`): the memory traffic a step's elementwise kernels move (used by
    the speed model)."""
    layer = layer_activation_bytes(m, precision, micro_batch, seq)
    per_layer = layer["attention"] + layer["mlp"] + layer["norms"]
    return m.num_layers * per_layer + _loss_bytes(m, precision, micro_batch * seq, loss)


def recomputed_attention_bytes(m: ModelSpec, precision: str, micro_batch: int, seq: int) -> int:
    """What selective recomputation drops from one layer and brings back while that layer's
    backward runs: the attention core's insides."""
    full = layer_activation_bytes(m, precision, micro_batch, seq)
    sel = layer_activation_bytes(m, precision, micro_batch, seq, recompute="selective")
    return full["attention"] - sel["attention"]
