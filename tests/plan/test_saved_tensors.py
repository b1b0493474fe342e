"""The activation model against what autograd really saves, family by family.

Tiny models of each family are built with transformers on the CPU, one forward pass runs under a
`saved_tensors_hooks` that records the storage of every tensor autograd keeps for backward, and
the sum is compared with the planner's per-layer accounting (plus the head and the saved fp32
log-softmax). Cases are chosen where the CPU kernels save what the CUDA ones do (CPU autocast,
for one, leaves `pow` in 16-bit, which changes GPT-2's tanh-GELU; CPU masks for dropout are fp32
where CUDA keeps bytes, so dropout is off here)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")

from gpulens.plan import from_hf_config  # noqa: E402
from gpulens.plan.memory import _head_bytes_per_token, _mode, layer_activation_bytes  # noqa: E402

SMALL = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
             intermediate_size=704, vocab_size=8000)
CASES = [
    ("LlamaConfig", SMALL, "fp32"),
    ("LlamaConfig", SMALL | {"num_key_value_heads": 2}, "amp"),
    ("LlamaConfig", SMALL, "bf16"),
    ("Qwen2Config", SMALL, "amp"),
    ("Qwen3Config", SMALL | {"head_dim": 64}, "bf16"),
    ("GemmaConfig", SMALL | {"head_dim": 64}, "amp"),
    ("Phi3Config", SMALL | {"pad_token_id": 0}, "bf16"),
    ("MixtralConfig", SMALL | {"intermediate_size": 384, "num_local_experts": 4, "num_experts_per_tok": 2}, "amp"),
    ("GPT2Config", dict(n_embd=256, n_layer=2, n_head=4, vocab_size=8000, n_positions=512, attn_pdrop=0.0,
                        resid_pdrop=0.0, embd_pdrop=0.0), "fp32"),
    ("GPTNeoXConfig", dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024,
                           vocab_size=8000), "bf16"),
    ("BertConfig", dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024,
                        vocab_size=8000, attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0), "fp32"),
]


def _measured_saved_bytes(model, mode: str, ids) -> int:
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
        return t

    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    param_shapes = {tuple(p.shape) for p in model.parameters()} | {tuple(p.shape[::-1]) for p in model.parameters()}
    casts: set[int] = set()

    def pack_tracking(t):
        # autocast's cached 16-bit weight copies are counted by the planner separately
        if mode == "amp" and t.dtype == torch.bfloat16 and tuple(t.shape) in param_shapes:
            casts.add(t.untyped_storage().data_ptr())
        return pack(t)

    with torch.autograd.graph.saved_tensors_hooks(pack_tracking, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "amp"):
            model(input_ids=ids, labels=ids)
    return sum(n for ptr, n in seen.items() if ptr not in param_ptrs and ptr not in casts)


@pytest.mark.parametrize("cls,cfg,mode", CASES, ids=[f"{c[0].removesuffix('Config')}-{c[2]}" for c in CASES])
def test_saved_activations_match_autograd(cls, cfg, mode):
    torch.manual_seed(0)
    config = getattr(tf, cls)(**cfg)
    if cls == "BertConfig":
        model = tf.BertForMaskedLM(config)
    else:
        model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    if mode == "bf16":
        model = model.to(torch.bfloat16)
    model.train()
    b, s = 2, 96
    ids = torch.randint(0, 8000, (b, s))
    measured = _measured_saved_bytes(model, mode, ids)

    hf = json.loads(config.to_json_string()) | {"model_type": config.model_type}
    spec = from_hf_config(hf)
    assert spec.params == sum(p.numel() for p in model.parameters()) or spec.encoder
    precision = {"amp": "amp_bf16", "bf16": "bf16", "fp32": "fp32"}[mode]
    layer = layer_activation_bytes(spec, precision, b, s)
    tokens = b * s
    log_softmax = tokens * spec.vocab_size * (2 if (spec.encoder and mode == "bf16") else 4)
    predicted = (spec.num_layers * (layer["attention"] + layer["mlp"] + layer["norms"])
                 + tokens * _head_bytes_per_token(spec, _mode(precision)) + log_softmax)
    assert predicted == pytest.approx(measured, rel=0.05)


@pytest.mark.parametrize("seq", [96, 384])
@pytest.mark.parametrize("mode", ["bf16", "fp32"])
def test_gemma2_eager_attention_matches_autograd(seq, mode):
    """Gemma-2 has no SDPA path in transformers: eager attention keeps every S x S score (the
    soft-capping tanh, the fp32 softmax, its 16-bit cast); the final logit soft-capping keeps its
    tanh too."""
    torch.manual_seed(0)
    config = tf.Gemma2Config(**(SMALL | {"head_dim": 64, "num_key_value_heads": 2}))
    model = tf.AutoModelForCausalLM.from_config(config)
    assert model.config._attn_implementation == "eager"
    if mode == "bf16":
        model = model.to(torch.bfloat16)
    model.train()
    b = 2
    ids = torch.randint(0, 8000, (b, seq))
    measured = _measured_saved_bytes(model, mode, ids)
    spec = from_hf_config(json.loads(config.to_json_string()) | {"model_type": "gemma2"})
    layer = layer_activation_bytes(spec, mode, b, seq)
    tokens = b * seq
    c = 2 if mode == "bf16" else 4
    loss = tokens * spec.vocab_size * (4 + c)  # saved fp32 log-softmax + the logit soft-capping tanh
    predicted = (spec.num_layers * (layer["attention"] + layer["mlp"] + layer["norms"])
                 + tokens * _head_bytes_per_token(spec, _mode(mode)) + loss)
    assert predicted == pytest.approx(measured, rel=0.05)


@pytest.mark.parametrize("cls,extra,local", [
    ("MistralConfig", {"sliding_window": 32}, 4),  # Mistral v0.1: every layer windowed
    ("Gemma2Config", {"sliding_window": 32, "head_dim": 64}, 2),  # Gemma-2: local and global layers alternate
    ("Qwen2Config", {"sliding_window": 32, "use_sliding_window": False}, 0),  # a window the config does not use
])
def test_sliding_window_kv_cache_matches_transformers(cls, extra, local):
    """The KV cache a forward leaves in transformers' DynamicCache (sliding-window layers keep
    their window) against kv_bytes_for_context."""
    torch.manual_seed(0)
    config = getattr(tf, cls)(**(SMALL | {"num_hidden_layers": 4, "num_key_value_heads": 2} | extra))
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    seq = 96
    with torch.no_grad():
        cache = model(torch.randint(0, 8000, (1, seq)), use_cache=True).past_key_values
    measured = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    spec = from_hf_config(json.loads(config.to_json_string()) | {"model_type": config.model_type})
    assert spec.sliding_layers == local
    assert spec.kv_bytes_for_context(seq, 4) == pytest.approx(measured, rel=0.05)
    if local:
        assert spec.kv_bytes_for_context(seq, 4) < spec.kv_bytes_per_token(4) * seq


@pytest.mark.parametrize("cls,extra", [
    ("DeepseekV2Config", {"q_lora_rank": None}),
    ("DeepseekV3Config", {"q_lora_rank": 96, "n_group": 2, "topk_group": 1}),
])
def test_deepseek_mla_and_moe_layout_match_transformers(cls, extra):
    """Parameters (MLA projections, routed + shared experts, dense first layer, V3's router bias)
    and the KV cache (MLA caches one latent + the rotary key per token and layer)."""
    torch.manual_seed(0)
    config = getattr(tf, cls)(**(dict(hidden_size=256, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                                      intermediate_size=704, moe_intermediate_size=128, n_routed_experts=8,
                                      n_shared_experts=2, num_experts_per_tok=2, first_k_dense_replace=1,
                                      kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
                                      vocab_size=8000) | extra))
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    spec = from_hf_config(json.loads(config.to_json_string()) | {"model_type": config.model_type})
    assert spec.params == sum(p.numel() for p in model.parameters())
    seq = 40
    with torch.no_grad():
        cache = model(torch.randint(0, 8000, (1, seq)), use_cache=True).past_key_values
    measured = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert spec.kv_bytes_for_context(seq, 4) == measured
