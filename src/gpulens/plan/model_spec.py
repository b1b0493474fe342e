"""`ModelSpec`: what everything downstream (memory, speed) reads of a model: the shapes and the
few architectural choices that change memory or FLOPs (gated MLP, norm kind, fused q/k/v, learned
positions, MoE, MLA), with the parameter and KV-cache counts derived from them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelSpec:
    """Shapes and architectural traits of a transformer. Counts are plain integers."""

    name: str
    family: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    max_positions: int | None = None  # max_position_embeddings (the learned position table's size)
    max_context: int | None = None  # the longest sequence it takes: max_positions, stretched by RoPE scaling
    mlp: str = "gated"  # gated (SwiGLU/GeGLU: 3 matrices) | plain (2 matrices)
    act: str = "silu"  # silu | gelu | gelu_tanh | gelu_new (GPT-2's Python tanh formula)
    norm: str = "rmsnorm"  # rmsnorm | gemma_rmsnorm | layernorm
    norms_per_layer: int = 2
    norm_bias: bool = True  # a LayerNorm's bias (MPT's no_bias drops it); RMSNorm has none
    embedding_norm: bool = False  # a LayerNorm right after the embedding lookup (BLOOM's word_embeddings_layernorm)
    qkv_fused: bool = False
    gate_up_fused: bool = False
    qkv_bias: bool = False
    bias: bool = False  # biases on every linear (GPT-2, NeoX, BERT)
    qk_norm: bool = False
    learned_positions: bool = False
    type_vocab_size: int = 0
    encoder: bool = False  # BERT-like: bidirectional, pooler
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = True  # Qwen2-MoE gates its shared expert (h -> 1); DeepSeek does not
    first_dense_layers: int = 0  # DeepSeek: the first k layers have a dense MLP (first_k_dense_replace)
    kv_lora_rank: int = 0  # MLA: the latent each token caches (0 = ordinary attention)
    q_lora_rank: int = 0  # MLA: low-rank query projection (0 = a plain q_proj)
    qk_rope_head_dim: int = 0  # MLA: the rotary part of each head's query/key, cached once per token
    v_head_dim: int = 0  # MLA: value head size
    dropout: float = 0.0  # hidden dropout active in training (saves a 1-byte mask per element)
    parallel_residual: bool = False  # GPT-NeoX: attention and MLP read the same input
    final_logit_softcap: float | None = None
    attention_impl: str = "sdpa"  # what transformers runs: sdpa, or eager where the family has no SDPA path (Gemma-2)
    attn_logit_softcap: float | None = None  # Gemma-2: tanh soft-capping of the attention scores
    sliding_window: int | None = None  # tokens a local-attention layer sees (Mistral v0.1, Gemma-2/3 local layers)
    sliding_layers: int = 0  # how many layers use the window (the others attend to everything)
    rough: bool = False  # built from a bare parameter count: shapes are guessed
    assumed_dense: bool = False  # an unknown model_type read as a dense LLaMA-like decoder (--assume-dense)
    untyped: bool = False  # a config.json with no model_type, read as a dense LLaMA-like decoder
    source: str = ""
    published_params: int | None = None

    # ------------------------------------------------------------ parameter counts

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def _mla_attn_params(self) -> int:
        h, a = self.hidden_size, self.num_heads
        qk = self.head_dim  # nope + rope
        q = h * a * qk if not self.q_lora_rank else h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * a * qk
        kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank  # kv_a_proj_with_mqa + its norm
        kv += self.kv_lora_rank * a * (qk - self.qk_rope_head_dim + self.v_head_dim)  # kv_b_proj: k_nope and v per head
        return q + kv + a * self.v_head_dim * h

    def _attn_params(self) -> int:
        if self.is_mla:
            return self._mla_attn_params()
        h = self.hidden_size
        n = h * self.q_size + 2 * h * self.kv_size + self.q_size * h
        if self.qkv_bias or self.bias:
            n += self.q_size + 2 * self.kv_size
        if self.bias:
            n += h
        if self.qk_norm:
            n += 2 * self.head_dim
        return n

    def _dense_mlp_params(self, inter: int) -> int:
        h = self.hidden_size
        if self.mlp == "gated":
            return 3 * h * inter + ((2 * inter + h) if self.bias else 0)
        return 2 * h * inter + ((inter + h) if self.bias else 0)

    def _norm_params(self) -> int:
        return 2 * self.hidden_size if self.norm == "layernorm" and self.norm_bias else self.hidden_size

    def expert_params_per_layer(self) -> int:
        if not self.is_moe:
            return 0
        return self.num_experts * self._dense_mlp_params(self.moe_intermediate_size or self.intermediate_size)

    def _mlp_params(self) -> int:
        if not self.is_moe:
            return self._dense_mlp_params(self.intermediate_size)
        n = self.expert_params_per_layer() + self.hidden_size * self.num_experts  # router
        if self.shared_expert_intermediate_size:
            n += self._dense_mlp_params(self.shared_expert_intermediate_size) + self.hidden_size * self.shared_expert_gate
        return n

    def layer_params(self) -> int:
        """Parameters of one (MoE, where the model has them) transformer layer."""
        return self._attn_params() + self._mlp_params() + self.norms_per_layer * self._norm_params()

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    @property
    def block_params(self) -> int:
        """Parameters of all transformer layers (DeepSeek's first layers are dense)."""
        dense = self._attn_params() + self._dense_mlp_params(self.intermediate_size) + self.norms_per_layer * self._norm_params()
        return (self.num_layers - self.first_dense_layers) * self.layer_params() + self.first_dense_layers * dense

    @property
    def embedding_params(self) -> int:
        h = self.hidden_size
        n = self.vocab_size * h
        if self.learned_positions and self.max_positions:
            n += self.max_positions * h
        if self.type_vocab_size:
            n += self.type_vocab_size * h
        if self.encoder:
            n += 2 * h  # embedding LayerNorm
        elif self.embedding_norm:
            n += self._norm_params()
        return n

    @property
    def lm_head_params(self) -> int:
        """Parameters of the output projection that are not shared with the input embedding."""
        return 0 if (self.tie_word_embeddings or self.encoder) else self.vocab_size * self.hidden_size

    @property
    def params(self) -> int:
        """Total parameters (all experts of a MoE)."""
        n = self.embedding_params + self.block_params + self._norm_params() + self.lm_head_params
        if self.encoder:
            n += self.hidden_size * self.hidden_size + self.hidden_size  # pooler
            n -= self._norm_params()  # BERT has no final norm
        return n

    @property
    def active_params(self) -> int:
        """Parameters touched per token (a MoE routes each token through `experts_per_token` experts)."""
        if not self.is_moe:
            return self.params
        inactive = (self.num_experts - self.experts_per_token) * self._dense_mlp_params(
            self.moe_intermediate_size or self.intermediate_size
        )
        return self.params - self.moe_layers * inactive

    @property
    def matmul_params(self) -> int:
        """Active parameters used in matrix multiplies (drives FLOPs): excludes the embedding lookup,
        norms and position tables; the output head counts even when tied."""
        norms = (self.num_layers * self.norms_per_layer + 1) * self._norm_params()
        emb_lookup = self.embedding_params - (self.vocab_size * self.hidden_size if self.tie_word_embeddings else 0)
        n = self.active_params - emb_lookup - norms
        if self.encoder:
            n += self.vocab_size * self.hidden_size  # the MLM head multiplies by the tied embedding
        return max(n, 1)

    @property
    def linear_params(self) -> int:
        """Parameters of the Linear layers (what autocast caches a 16-bit copy of)."""
        norms = self.num_layers * self.norms_per_layer * self._norm_params()
        return self.block_params - norms + self.vocab_size * self.hidden_size

    @property
    def kv_elements_per_token_layer(self) -> int:
        """Cached elements per token per layer: K and V of the KV heads, or MLA's latent plus the
        shared rotary key (what transformers and vLLM cache for DeepSeek-V2/V3)."""
        return self.kv_lora_rank + self.qk_rope_head_dim if self.is_mla else 2 * self.kv_size

    def kv_bytes_per_token(self, dtype_bytes: float) -> float:
        """KV-cache bytes per token of context with every layer holding it (no window)."""
        return self.num_layers * self.kv_elements_per_token_layer * dtype_bytes

    def kv_bytes_for_context(self, tokens: float, dtype_bytes: float) -> float:
        """KV-cache bytes of one sequence of `tokens`: a sliding-window layer keeps only its window
        (transformers' DynamicSlidingWindowLayer, vLLM's sliding-window blocks)."""
        per_layer_token = self.kv_elements_per_token_layer * dtype_bytes
        local = self.sliding_layers if self.sliding_window else 0
        window = min(tokens, self.sliding_window or tokens)
        return per_layer_token * ((self.num_layers - local) * tokens + local * window)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "family": self.family,
            "params": self.params,
            "active_params": self.active_params,
            "hidden_size": self.hidden_size,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": self.tie_word_embeddings,
            "num_experts": self.num_experts,
            "experts_per_token": self.experts_per_token,
            "rough": self.rough,
            "max_context": self.max_context,
            "assumed_dense": self.assumed_dense,
            "untyped": self.untyped,
        }


# ---------------------------------------------------------------- Hugging Face config.json
