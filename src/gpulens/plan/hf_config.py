"""A Hugging Face config.json read into a `ModelSpec`: the families the planner models, each
family's field names mapped (MPT, BLOOM and Falcon name theirs their own way), and one sentence
for a config it cannot model (an unknown model_type, an encoder-decoder, a field out of range)."""

from __future__ import annotations

import json
import math
from typing import Any

from gpulens.errors import BadInputError, shown
from gpulens.plan.model_spec import ModelSpec

# model_type -> family traits. A model_type not listed is refused (UnknownModelTypeError) unless
# the caller asks for a dense LLaMA-like reading (`assume_dense`, `--assume-dense`), which the
# plan then states.
_FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {},
    "mixtral": {"moe": True},
    "qwen2": {"qkv_bias": True},
    "qwen2_moe": {"qkv_bias": True, "moe": True},
    "qwen3": {"qk_norm": True},
    "qwen3_moe": {"qk_norm": True, "moe": True},
    # DeepSeek-V2/V3: multi-head latent attention (MLA), routed + shared experts, dense first layers
    "deepseek_v2": {"moe": True, "mla": True, "shared_gate": False},
    # (V3's per-expert score-correction bias is a buffer in transformers, not a parameter)
    "deepseek_v3": {"moe": True, "mla": True, "shared_gate": False},
    "gemma": {"norm": "gemma_rmsnorm", "act": "gelu_tanh", "tied": True},
    "gemma2": {"norm": "gemma_rmsnorm", "act": "gelu_tanh", "tied": True, "norms_per_layer": 4, "attn": "eager"},
    "gemma3_text": {"norm": "gemma_rmsnorm", "act": "gelu_tanh", "tied": True, "norms_per_layer": 4, "qk_norm": True},
    "phi3": {"qkv_fused": True, "gate_up_fused": True},
    "gpt2": {"norm": "layernorm", "mlp": "plain", "act": "gelu_new", "qkv_fused": True, "bias": True,
             "positions": "learned", "tied": True},
    "gpt_neox": {"norm": "layernorm", "mlp": "plain", "act": "gelu", "qkv_fused": True, "bias": True},
    "bert": {"norm": "layernorm", "mlp": "plain", "act": "gelu", "bias": True, "positions": "learned",
             "encoder": True, "tied": True},
    "roberta": {"norm": "layernorm", "mlp": "plain", "act": "gelu", "bias": True, "positions": "learned",
                "encoder": True, "tied": True},
    # MPT, BLOOM and Falcon name their config.json fields their own way: _own_fields reads them and
    # adds the traits that depend on the config (biases, ALiBi or learned positions, norm count).
    # transformers runs MPT's and BLOOM's attention eagerly (ALiBi added to the S x S scores).
    "mpt": {"norm": "layernorm", "mlp": "plain", "act": "gelu", "qkv_fused": True, "tied": True, "attn": "eager"},
    "bloom": {"norm": "layernorm", "mlp": "plain", "act": "gelu_tanh", "qkv_fused": True, "bias": True, "tied": True,
              "embedding_norm": True, "attn": "eager"},
    "falcon": {"norm": "layernorm", "mlp": "plain", "act": "gelu", "qkv_fused": True, "tied": True},
    # Nemotron-3/4 (transformers models/nemotron/modeling_nemotron.py): LayerNorm1P (a LayerNorm with
    # bias whose weight is stored minus one), a non-gated MLP up_proj -> relu2 -> down_proj (squared
    # ReLU: autograd keeps the ReLU's output, which the square reads, and the square's output, which
    # down_proj reads: the two tensors of a plain MLP), partial rotary positions (no parameters)
    "nemotron": {"norm": "layernorm", "mlp": "plain", "act": "relu2"},
}
# the model_type of Falcon's first (remote-code) configs: RefinedWeb is the 40B's layout
# (new_decoder_architecture), RefinedWebModel the 7B's
_LEGACY_TYPES = {"refinedweb": "falcon", "refinedwebmodel": "falcon"}
# encoder-decoders: two stacks, cross-attention and a cross-attention KV cache, none of which the
# planner models; refused even with --assume-dense (a dense decoder reading would be made up)
_ENCODER_DECODER = {"t5", "mt5", "umt5", "longt5", "switch_transformers", "bart", "mbart", "pegasus", "marian",
                    "blenderbot", "m2m_100", "plbart", "led", "whisper", "nllb_moe", "fsmt", "prophetnet"}


class UnknownModelTypeError(BadInputError):
    """A config whose `model_type` is no family the planner models (MLA, new MoE layouts, ...):
    reading it as a dense LLaMA would give wrong parameter and KV-cache figures silently."""


def supported_model_types() -> list[str]:
    return sorted(set(_FAMILIES) | set(_LEGACY_TYPES))


def _rope_context(cfg: dict[str, Any], positions: int | None, where: str) -> int | None:
    """The longest context a config supports: max_position_embeddings, extended by a RoPE scaling
    whose type stretches it (linear, dynamic, yarn, longrope: factor x the original length;
    llama3-type configs already give the extended length in max_position_embeddings)."""
    rs = cfg.get("rope_scaling")
    if not positions or not isinstance(rs, dict):
        return positions
    kind = str(rs.get("rope_type") or rs.get("type") or "").lower()
    raw = rs.get("factor")
    if raw is None:
        factor = 1.0
    elif isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw) or raw <= 0:
        # an unreadable factor had been ignored: the context planned as if the scaling were not there
        raise BadInputError(f"The field 'rope_scaling.factor' in {where} must be a number above 0, not {shown(raw)}.",
                            hint="Fix the config (the model's config.json on the Hub has the right value).")
    else:
        factor = float(raw)
    if kind in ("linear", "dynamic", "yarn", "longrope") and factor > 1:
        original = _positive_int(rs.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
                                 or positions, "rope_scaling.original_max_position_embeddings", where)
        if original * factor > _COUNT_MAX:  # a factor of 1e308 makes the product infinite
            raise BadInputError(f"The rope_scaling.factor {factor:g} in {where} stretches the context past the "
                                f"planner's limit of {_COUNT_MAX:,} tokens.", hint="Fix the config.")
        return max(positions, int(original * factor))
    return positions


def _sliding(cfg: dict[str, Any], mtype: str, layers: int) -> tuple[int | None, int]:
    """(window, layers using it). Qwen2 configs carry a window they do not use
    (use_sliding_window false); `layer_types` names each layer where a config has it; else
    Gemma-2 alternates local and global layers, Gemma-3 has one global layer in
    `sliding_window_pattern`, and other families window every layer (Mistral v0.1)."""
    window = cfg.get("sliding_window")
    if not window or cfg.get("use_sliding_window") is False:
        return None, 0
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        return int(window), sum(1 for t in types if t == "sliding_attention")
    if mtype == "gemma2":
        return int(window), (layers + 1) // 2
    if mtype.startswith("gemma3"):
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        return int(window), sum(1 for i in range(layers) if (i + 1) % pattern)
    return int(window), layers


def _need_int(cfg: dict[str, Any], keys: tuple[str, ...], where: str) -> int:
    """The first of `keys` the config gives, a count above zero and within `_SIZE_LIMITS`."""
    k = _need_key(cfg, keys, where)
    return _positive_int(cfg[k], k, where)


def _need_key(cfg: dict[str, Any], keys: tuple[str, ...], where: str) -> str:
    """The first of `keys` the config gives (a family's own name for the field, or an alias)."""
    for k in keys:
        if cfg.get(k) is not None:
            return k
    raise BadInputError(
        f"The model config {where} lacks the field {keys[0]!r}.",
        hint=f"Add {keys[0]!r} to the config (it is in the model's config.json on the Hub).",
    )


def _positive_int(v: Any, key: str, where: str) -> int:
    try:
        i = int(v)
    except (TypeError, ValueError):
        raise BadInputError(f"The field {key!r} in {where} must be an integer, not {v!r}.", hint="Fix the config.") from None
    if i <= 0:
        raise BadInputError(f"The field {key!r} in {where} must be above zero, not {i}.", hint="Fix the config.")
    if i > _COUNT_MAX:  # e.g. MPT's d_model x expansion_ratio 1e300: a count no GPU holds, and past a float
        raise BadInputError(f"The field {key!r} in {where} gives {shown(i, quote=False)}, above the planner's limit of "
                            f"{_COUNT_MAX:,}.", hint="Fix the config.")
    _check_size(i, key, where)
    return i


def _check_size(v: float, key: str, where: str) -> None:
    """Refuse a size past `_SIZE_LIMITS` (one sentence naming the field and the limit)."""
    limit = _SIZE_LIMITS.get(key)
    if limit is not None and v > limit[0]:
        said = f"{int(v):,}" if v < 1e21 else f"{v:.3g}"
        verb = "gives an MLP width of" if key == "expansion_ratio" else "is"  # MPT's: d_model x expansion_ratio
        raise BadInputError(f"The field {key!r} in {where} {verb} {said}; no model has {limit[1].format(f'{limit[0]:,}')}.",
                            hint="Fix the config (the model's config.json on the Hub has the right value).")


# config.json fields the planner reads, by kind: checked before any arithmetic, so a string, a
# negative count or an overflowing number is one sentence naming the field, never a traceback or a
# silently wrong plan (a "no" read as true).
_COUNT_FIELDS = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "vocab_size", "max_position_embeddings", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "head_dim",
    "num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok", "top_k", "moe_intermediate_size",
    "shared_expert_intermediate_size", "n_shared_experts", "first_k_dense_replace", "kv_lora_rank", "q_lora_rank",
    "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "sliding_window", "sliding_window_pattern",
    "type_vocab_size", "original_max_position_embeddings",
    "d_model", "n_heads", "n_layers", "max_seq_len", "n_embed", "num_kv_heads", "n_head_kv", "ffn_hidden_size",
    "num_ln_in_parallel_attn",
)
# a length of 0 is no model's: it had been read as "not given" (no context limit, or a family default)
_LENGTH_FIELDS = ("max_position_embeddings", "n_positions", "max_seq_len", "original_max_position_embeddings")
_FLAG_FIELDS = ("tie_word_embeddings", "use_sliding_window", "attention_bias", "use_parallel_residual",
                "no_bias", "learned_pos_emb", "multi_query", "new_decoder_architecture", "parallel_attn", "alibi")
_REAL_FIELDS = ("resid_pdrop", "hidden_dropout_prob", "hidden_dropout", "final_logit_softcapping",
                "attn_logit_softcapping", "rope_theta", "expansion_ratio")
# sizes no model has at 0: a 0 had been read as "not given" (head_dim 0 planned as hidden / heads,
# num_kv_heads 0 as every head, n_inner or ffn_hidden_size 0 as 4 x hidden, moe_intermediate_size 0
# as intermediate_size, sliding_window_pattern 0 as 6), so a present 0 is refused; absent stays
# absent. Counts where 0 means "none" (n_shared_experts, first_k_dense_replace, q_lora_rank,
# type_vocab_size, sliding_window, a dense config's num_experts) may be 0.
_NONZERO_FIELDS = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "vocab_size", "n_embd", "n_layer", "n_head", "n_inner", "head_dim", "moe_intermediate_size", "kv_lora_rank",
    "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "sliding_window_pattern", "d_model", "n_heads", "n_layers",
    "n_embed", "num_kv_heads", "n_head_kv", "ffn_hidden_size", "num_ln_in_parallel_attn",
)
_COUNT_MAX = 1 << 40
# Upper bounds on sizes, far above any real model so that nothing real is refused, but low enough
# that a typo or a hostile value (num_hidden_layers 1e12) is one sentence instead of a plan of
# "tokens/s 0" on "TP across 8,589,934,592 GPUs". The largest published models have some 200 layers
# (DeepNet trained 1,000 as an experiment), a hidden size near 30,000 (an MLP near 75,000), 128 to
# 160 heads of at most 512 wide, a vocabulary near 1,000,000 (Gemma 3: 262,144) and up to some
# 1,000,000 experts (Mixture of A Million Experts, PEER): each bound is at least 10 x past those.
_SIZE_LIMITS: dict[str, tuple[int, str]] = {
    **{k: (10_000, "more than {} layers") for k in (
        "num_hidden_layers", "n_layer", "n_layers", "num_layers", "first_k_dense_replace", "sliding_window_pattern")},
    **{k: (1_000_000, "a hidden size above {}") for k in ("hidden_size", "n_embd", "d_model", "n_embed")},
    **{k: (1_000_000, "a latent rank above {}") for k in ("kv_lora_rank", "q_lora_rank")},
    **{k: (100_000, "more than {} attention heads") for k in (
        "num_attention_heads", "n_head", "n_heads", "num_key_value_heads", "num_kv_heads", "n_head_kv",
        "attn_config.kv_n_heads")},
    **{k: (100_000, "attention heads wider than {}") for k in (
        "head_dim", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")},
    **{k: (10_000_000, "an MLP wider than {}") for k in (
        "intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", "ffn_config.ffn_hidden_size", "expansion_ratio",
        "moe_intermediate_size", "shared_expert_intermediate_size")},
    **{k: (100_000_000, "a vocabulary of more than {} tokens") for k in ("vocab_size",)},
    **{k: (100_000_000, "more than {} token types") for k in ("type_vocab_size",)},
    **{k: (10_000_000, "more than {} experts") for k in (
        "num_local_experts", "num_experts", "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "top_k")},
}
# the whole model: the same limit as a bare size (`--model 1000t`, models.from_param_count), some 500 x
# the largest published models; a config whose sizes each pass can still multiply past it
PARAMS_MAX = 10**15


def check_config_fields(cfg: dict[str, Any], where: str) -> None:
    """Refuse config.json values of the wrong kind (BadInputError naming the field)."""
    for k in _COUNT_FIELDS:
        v = cfg.get(k)
        if v is None:
            continue
        whole = isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and math.isfinite(v) and v == int(v)
        if whole and v > 0 and k in _SIZE_LIMITS:
            _check_size(v, k, where)
        if not whole or not 0 <= v <= _COUNT_MAX:
            low = 1 if k in _NONZERO_FIELDS else 0
            raise BadInputError(f"The field {k!r} in {where} must be a whole number from {low} to "
                                f"{_SIZE_LIMITS.get(k, (_COUNT_MAX,))[0]:,}, not {v!r}.",
                                hint="Fix the config (the model's config.json on the Hub has the right value).")
        if v == 0 and k in _LENGTH_FIELDS:
            raise BadInputError(f"The field {k!r} in {where} gives a context of 0 tokens.",
                                hint="Fix the config (the model's config.json on the Hub has the right value), or "
                                     "drop the field.")
        if v == 0 and k in _NONZERO_FIELDS:
            raise BadInputError(f"The field {k!r} in {where} must be above zero, not 0.",
                                hint="Fix the config (the model's config.json on the Hub has the right value).")
    for k in _FLAG_FIELDS:
        v = cfg.get(k)
        if v is not None and not isinstance(v, bool):
            raise BadInputError(f"The field {k!r} in {where} must be true or false, not {v!r}.", hint="Fix the config.")
    for k in _REAL_FIELDS:
        v = cfg.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)):
            raise BadInputError(f"The field {k!r} in {where} must be a finite number, not {v!r}.", hint="Fix the config.")


# ---------------------------------------------------------------- MPT, BLOOM, Falcon: their own field names


def _flag(d: dict[str, Any], key: str, default: bool, where: str, prefix: str = "") -> bool:
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise BadInputError(f"The field {prefix + key!r} in {where} must be true or false, not {v!r}.", hint="Fix the config.")
    return v


def _sub_config(cfg: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    v = cfg.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise BadInputError(f"The field {key!r} in {where} must be an object, not {v!r}.", hint="Fix the config.")
    return v


def _mpt_fields(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """MPT (mosaicml/mpt-*, transformers' MptConfig and llm-foundry's): d_model, n_heads, n_layers,
    expansion_ratio (or ffn_config.ffn_hidden_size), max_seq_len; no_bias drops every Linear's and
    LayerNorm's bias; ALiBi (attn_config.alibi) or rotary (attn_config.rope) replace the learned
    position table (learned_pos_emb), as llm-foundry's config does; attn_config.kv_n_heads for the
    grouped-query variants. Defaults are transformers' MptConfig's (no_bias true, alibi true)."""
    attn = _sub_config(cfg, "attn_config", where)
    ffn = _sub_config(cfg, "ffn_config", where)
    h = _need_int(cfg, ("d_model",), where)
    heads = _need_int(cfg, ("n_heads",), where)
    layers = _need_int(cfg, ("n_layers",), where)
    kind = str(attn.get("attn_type") or "multihead_attention")
    if kind == "multihead_attention":
        kv = heads
    elif kind == "multiquery_attention":
        kv = 1
    elif kind == "grouped_query_attention":
        kv = _positive_int(attn.get("kv_n_heads"), "attn_config.kv_n_heads", where)
    else:
        raise BadInputError(f"The attn_config.attn_type {kind!r} of {where} is none of MPT's (multihead_attention, "
                            "multiquery_attention, grouped_query_attention).", hint="Fix the config.")
    if _flag(attn, "qk_ln", False, where, "attn_config.") or _flag(attn, "qk_gn", False, where, "attn_config."):
        raise BadInputError(f"The MPT config {where} normalizes queries and keys (attn_config.qk_ln or qk_gn), "
                            "whose norms the planner does not model.", hint="Plan it from a config without qk_ln.")
    alibi = _flag(attn, "alibi", True, where, "attn_config.")
    rope = _flag(attn, "rope", False, where, "attn_config.")
    learned = _flag(cfg, "learned_pos_emb", True, where) and not alibi and not rope
    ffn_type = str(ffn.get("ffn_type") or "mptmlp")
    if ffn_type not in ("mptmlp", "mptglu"):
        raise BadInputError(f"The ffn_config.ffn_type {ffn_type!r} of {where} (TransformerEngine's fused MLP or a "
                            "MegaBlocks MoE) is not an MLP the planner models.", hint="Plan it from a config with "
                            "ffn_type mptmlp or mptglu.")
    ratio = cfg.get("expansion_ratio", 4)
    inter = ffn.get("ffn_hidden_size")
    inter = (_positive_int(inter, "ffn_config.ffn_hidden_size", where) if inter is not None
             else _positive_int(int(h * float(ratio)), "expansion_ratio", where))
    act_cfg = ffn.get("ffn_act_fn") if isinstance(ffn.get("ffn_act_fn"), dict) else {}
    act_name = str(act_cfg.get("name") or "gelu")
    act = "silu" if act_name == "silu" else ("gelu_tanh" if act_cfg.get("approximate") == "tanh" else "gelu")
    no_bias = _flag(cfg, "no_bias", True, where)
    norm_type = str(cfg.get("norm_type") or "low_precision_layernorm").lower()
    if "rmsnorm" in norm_type:
        norm = "rmsnorm"
    elif "layernorm" in norm_type:
        norm = "layernorm"
    else:
        raise BadInputError(f"The norm_type {norm_type!r} of {where} is neither a LayerNorm nor an RMSNorm.",
                            hint="Fix the config.")
    return {"h": h, "layers": layers, "heads": heads, "kv": kv, "inter": inter,
            "positions": cfg.get("max_seq_len") or 2048, "dropout": float(cfg.get("resid_pdrop") or 0.0),
            "traits": {"bias": not no_bias, "norm_bias": not no_bias, "norm": norm, "act": act,
                       "mlp": "gated" if ffn_type == "mptglu" else "plain",
                       "positions": "learned" if learned else ("alibi" if alibi else "rope")}}


def _bloom_fields(cfg: dict[str, Any], where: str) -> dict[str, Any]:
    """BLOOM: hidden_size (n_embed in the first configs), n_head, n_layer; ALiBi (no position
    table, no length limit in the config), a LayerNorm after the embedding, biases everywhere, an
    MLP of 4 x hidden (transformers ignores n_inner), a tied head."""
    h = _need_int(cfg, ("hidden_size", "n_embed"), where)
    layers = _need_int(cfg, ("n_layer", "num_hidden_layers"), where)
    heads = _need_int(cfg, ("n_head", "num_attention_heads"), where)
    return {"h": h, "layers": layers, "heads": heads, "kv": heads, "inter": 4 * h, "positions": None,
            "dropout": float(cfg.get("hidden_dropout") or 0.0), "traits": {"positions": "alibi"}}


def _falcon_fields(cfg: dict[str, Any], legacy: str, where: str) -> dict[str, Any]:
    """Falcon, as transformers' FalconConfig and FalconAttention read it: the fused query_key_value
    holds all heads (3 x hidden), one shared K/V head (multi_query, the 7B) or num_kv_heads groups
    (new_decoder_architecture, the 40B and 180B); parallel_attn feeds attention and MLP from one
    LayerNorm (two, ln_attn and ln_mlp, in the new architecture); bias on every Linear or none;
    rotary positions unless alibi. The remote-code model_types keep n_head / n_head_kv / n_layer
    and imply the architecture: RefinedWeb is the new one."""
    h = _need_int(cfg, ("hidden_size", "n_embed"), where)
    layers = _need_int(cfg, ("num_hidden_layers", "n_layer"), where)
    heads = _need_int(cfg, ("num_attention_heads", "n_head"), where)
    new_arch = _flag(cfg, "new_decoder_architecture", legacy == "refinedweb", where)
    if new_arch:
        kv = int(cfg.get("num_kv_heads") or cfg.get("n_head_kv") or heads)
    elif _flag(cfg, "multi_query", True, where):
        kv = 1
    else:
        kv = heads  # the old layout without multi_query: query_key_value is 3 x hidden
    parallel = _flag(cfg, "parallel_attn", True, where)
    n_ln = cfg.get("num_ln_in_parallel_attn") or (2 if new_arch else 1)
    bias = _flag(cfg, "bias", False, where)
    alibi = _flag(cfg, "alibi", False, where)
    inter = int(cfg.get("ffn_hidden_size") or 4 * h)
    act = str(cfg.get("activation") or "gelu")
    return {"h": h, "layers": layers, "heads": heads, "kv": kv, "inter": inter,
            "positions": cfg.get("max_position_embeddings") or 2048,  # FalconConfig's default
            "dropout": float(cfg.get("hidden_dropout") or 0.0),
            "traits": {"bias": bias, "norms_per_layer": 2 if (not parallel or n_ln == 2) else 1,
                       "parallel": parallel, "positions": "alibi" if alibi else "rope",
                       "act": act if act in ("gelu", "gelu_tanh", "silu") else "gelu"}}


def _check_model_type(cfg: dict[str, Any], key: str, where: str) -> None:
    """A model_type that is given must be a family's name: null, a number or a list had been read
    as no model_type at all, so a config saying `"model_type": null` was planned as a LLaMA while
    `"unicorn"` was refused. Absent (or "", which transformers writes for a config of no model
    class) keeps its meaning: a dense LLaMA-like decoder."""
    if key.rsplit(".", 1)[-1] not in cfg:
        return
    v = cfg[key.rsplit(".", 1)[-1]]
    if not isinstance(v, str):
        raise BadInputError(
            f"The field {key!r} in {where} must be a model family's name such as 'llama', not "
            f"{shown(json.dumps(v), quote=False)}.",
            hint="Give the model's model_type (its config.json on the Hub has it; supported: "
                 f"{', '.join(supported_model_types())}), or drop the field to plan it as a dense LLaMA-like "
                 "decoder, as a config without model_type is planned.")


def _moe_count(cfg: dict[str, Any], keys: tuple[str, ...], where: str) -> tuple[int, str]:
    """A MoE config's expert count or experts per token, and the field that gave it."""
    for k in keys:
        if cfg.get(k):
            return int(cfg[k]), k
    zero = next((k for k in keys if cfg.get(k) == 0), None)
    if zero is not None:  # 0 had been reported as a missing field
        raise BadInputError(f"The field {zero!r} in {where} must be above zero in a mixture-of-experts model, not 0.",
                            hint="Fix the config (the model's config.json on the Hub has the right value).")
    raise BadInputError(f"The MoE config {where} lacks {keys[0]!r} (or {', '.join(repr(k) for k in keys[1:])}).",
                        hint="Add num_local_experts (or num_experts) and num_experts_per_tok.")


def from_hf_config(cfg: dict[str, Any], *, name: str = "model", where: str | None = None,
                   assume_dense: bool = False) -> ModelSpec:
    """A ModelSpec from the fields of a Hugging Face `config.json` (a dict). A `model_type` that
    is no supported family raises UnknownModelTypeError, unless `assume_dense`."""
    where = where or name
    if not isinstance(cfg, dict):
        raise BadInputError(f"The model config {where} is not a JSON object.", hint="Point --model at a config.json.")
    _check_model_type(cfg, "model_type", where)
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers keep the LM under text_config
        inner = dict(cfg["text_config"])
        _check_model_type(inner, "text_config.model_type", where)
        inner.setdefault("model_type", cfg.get("model_type", ""))
        cfg = inner
    check_config_fields(cfg, where)
    mtype = str(cfg.get("model_type") or "").lower().replace("-", "_")
    if mtype in _ENCODER_DECODER or cfg.get("is_encoder_decoder") is True:
        raise UnknownModelTypeError(
            f"The model {where} ({mtype or 'model_type unset'}) is an encoder-decoder, which the planner does not "
            f"model: its figures come from one decoder-only or encoder-only stack, and a second stack with "
            f"cross-attention and its own KV cache would be guesses.",
            hint="Plan a decoder-only or encoder-only model; --assume-dense does not apply to encoder-decoders.")
    legacy = mtype if mtype in _LEGACY_TYPES else ""
    mtype = _LEGACY_TYPES.get(mtype, mtype)
    traits = dict(_FAMILIES.get(mtype, {}))
    if mtype.endswith("_text") and mtype.removesuffix("_text") in _FAMILIES:
        traits = dict(_FAMILIES[mtype.removesuffix("_text")])
    elif mtype and mtype not in _FAMILIES and not assume_dense:
        raise UnknownModelTypeError(
            f"The model_type {mtype!r} of {where} is not a family the planner models, so its parameter "
            f"and KV-cache figures would be guesses.",
            hint=f"Supported: {', '.join(supported_model_types())}. Pass --assume-dense to plan it as a dense "
                 f"LLaMA-like decoder anyway (the plan then says so).")
    assumed = bool(mtype) and mtype not in _FAMILIES and not (mtype.endswith("_text") and traits)
    family = mtype or "llama"

    def need(*keys: str) -> int:
        return _need_int(cfg, keys, where)

    if mtype == "gpt2":
        h, layers, heads = need("n_embd", "hidden_size"), need("n_layer", "num_hidden_layers"), need("n_head", "num_attention_heads")
        inter = int(cfg.get("n_inner") or 4 * h)
        positions = cfg.get("n_positions") or cfg.get("max_position_embeddings") or 1024
        kv = heads
        dropout = float(cfg.get("resid_pdrop", 0.1) or 0.0)
    elif mtype in ("mpt", "bloom", "falcon"):
        own = (_mpt_fields(cfg, where) if mtype == "mpt" else _bloom_fields(cfg, where) if mtype == "bloom"
               else _falcon_fields(cfg, legacy, where))
        h, layers, heads, kv, inter = own["h"], own["layers"], own["heads"], own["kv"], own["inter"]
        positions, dropout = own["positions"], own["dropout"]
        traits.update(own["traits"])
    else:
        h = need("hidden_size", "d_model")
        layers = need("num_hidden_layers", "n_layer", "num_layers")
        heads = need("num_attention_heads", "n_head")
        kv = heads if cfg.get("num_key_value_heads") is None else need("num_key_value_heads")  # 0 was read as "all heads"
        inter = need("intermediate_size", "ffn_dim", "n_inner")
        positions = cfg.get("max_position_embeddings")
        dropout = float(cfg.get("hidden_dropout_prob", cfg.get("hidden_dropout", 0.0)) or 0.0)
    vocab = need("vocab_size")
    if heads % kv:
        raise BadInputError(
            f"num_attention_heads ({heads}) in {where} is not a multiple of num_key_value_heads ({kv}).",
            hint="Check the config's head counts.",
        )
    head_dim = int(cfg.get("head_dim") or 0) or h // heads
    mla = bool(traits.get("mla"))
    if not cfg.get("head_dim") and not mla and h % heads:  # hidden 4095 over 32 heads was planned at width 127
        raise BadInputError(f"hidden_size ({h}) in {where} is not a multiple of num_attention_heads ({heads}), and no "
                            "head_dim gives the heads' width.", hint="Check the config's hidden_size and head counts.")
    if mla:  # MLA: q/k heads of nope + rope; one cached latent for all heads
        head_dim = int(cfg.get("qk_nope_head_dim") or 0) + int(cfg.get("qk_rope_head_dim") or 0)
        kv = 1
        if not cfg.get("kv_lora_rank") or head_dim <= 0 or not cfg.get("v_head_dim"):
            raise BadInputError(f"The MLA config {where} lacks kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim "
                                "or v_head_dim.", hint="Use the model's config.json from the Hub.")
    shared_inter = int(cfg.get("shared_expert_intermediate_size") or 0)
    if cfg.get("n_shared_experts"):
        shared_inter = int(cfg["n_shared_experts"]) * int(cfg.get("moe_intermediate_size") or 0)
    tied_default = bool(traits.get("tied", False))
    tied = bool(cfg.get("tie_word_embeddings", tied_default))
    moe = bool(traits.get("moe")) or bool(cfg.get("num_local_experts") or cfg.get("num_experts"))
    experts = per_tok = 0
    if moe:
        experts, experts_key = _moe_count(cfg, ("num_local_experts", "num_experts", "n_routed_experts"), where)
        per_tok, per_tok_key = _moe_count(cfg, ("num_experts_per_tok", "top_k"), where)
        if per_tok > experts:  # more routed experts than there are: the inactive parameters came out negative
            raise BadInputError(f"The field {per_tok_key!r} in {where} is {per_tok:,}, more than the {experts:,} experts "
                                f"of {experts_key!r}.", hint="Fix the config (the model's config.json on the Hub has "
                                                             "the right value).")
        first_dense = int(cfg.get("first_k_dense_replace") or 0)
        if first_dense > layers:  # more dense layers than layers: a negative count of MoE layers
            raise BadInputError(f"The field 'first_k_dense_replace' in {where} is {first_dense:,}, more than the "
                                f"model's {layers:,} layers.", hint="Fix the config (the model's config.json on the "
                                                                    "Hub has the right value).")
    act = traits.get("act", "silu")
    hact = "" if mtype in ("mpt", "bloom", "falcon") else str(
        cfg.get("hidden_act") or cfg.get("hidden_activation") or cfg.get("activation_function") or "")
    if hact in ("gelu_pytorch_tanh", "gelu_tanh"):
        act = "gelu_tanh"
    elif hact == "gelu_new":
        act = "gelu_new"
    elif hact == "gelu":
        act = "gelu"
    spec = ModelSpec(
        name=name,
        family=family,
        hidden_size=h,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=vocab,
        tie_word_embeddings=tied,
        max_positions=int(positions) if positions else None,
        max_context=_rope_context(cfg, int(positions) if positions else None, where),
        mlp=traits.get("mlp", "gated"),
        act=act,
        norm=traits.get("norm", "rmsnorm"),
        norms_per_layer=int(traits.get("norms_per_layer", 2)),
        norm_bias=bool(traits.get("norm_bias", True)),
        embedding_norm=bool(traits.get("embedding_norm", False)),
        qkv_fused=bool(traits.get("qkv_fused", False)),
        gate_up_fused=bool(traits.get("gate_up_fused", False)),
        qkv_bias=bool(cfg.get("attention_bias", traits.get("qkv_bias", False))),
        bias=bool(traits.get("bias", False)),
        qk_norm=bool(traits.get("qk_norm", False)),
        learned_positions=traits.get("positions") == "learned",
        type_vocab_size=int(cfg.get("type_vocab_size") or 0) if traits.get("encoder") else 0,
        encoder=bool(traits.get("encoder", False)),
        num_experts=experts,
        experts_per_token=per_tok,
        moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0),
        shared_expert_intermediate_size=shared_inter,
        shared_expert_gate=bool(traits.get("shared_gate", True)),
        first_dense_layers=int(cfg.get("first_k_dense_replace") or 0) if moe else 0,
        kv_lora_rank=int(cfg.get("kv_lora_rank") or 0) if mla else 0,
        q_lora_rank=int(cfg.get("q_lora_rank") or 0) if mla else 0,
        qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0) if mla else 0,
        v_head_dim=int(cfg.get("v_head_dim") or 0) if mla else 0,
        dropout=dropout,
        parallel_residual=(mtype == "gpt_neox" and bool(cfg.get("use_parallel_residual", True)))
        or bool(traits.get("parallel", False)),
        final_logit_softcap=cfg.get("final_logit_softcapping"),
        attention_impl=str(traits.get("attn", "sdpa")),
        sliding_window=_sliding(cfg, mtype, layers)[0],
        sliding_layers=_sliding(cfg, mtype, layers)[1],
        attn_logit_softcap=cfg.get("attn_logit_softcapping"),
        assumed_dense=assumed,
        untyped=not mtype,
        source=where,
    )
    if spec.params > PARAMS_MAX:  # each size within its bound, their product past any model
        raise BadInputError(f"The sizes in {where} (hidden {h:,}, {layers:,} layers, MLP {inter:,}, vocabulary "
                            f"{vocab:,}{f', {experts:,} experts' if experts else ''}) make {spec.params / 1e12:,.0f}T "
                            f"parameters; no model has more than {PARAMS_MAX / 1e12:,.0f}T.",
                            hint="Fix the config (the model's config.json on the Hub has the right values).")
    return spec


# ---------------------------------------------------------------- presets
