"""MPT, BLOOM and Falcon read from their own config.json field names, against the published
parameter counts; encoder-decoders (T5) refused in one sentence; the new catalog cards."""

from __future__ import annotations

import json

import pytest

from gpulens.cli.main import main
from gpulens.errors import BadInputError
from gpulens.plan import UnsupportedPrecisionError, find_gpu, from_hf_config, load_model
from gpulens.plan.models import UnknownModelTypeError, supported_model_types

# The config.json fields of the published checkpoints (Hugging Face Hub, as published; fields the
# planner does not read, such as init_config or the token ids, left out).
MPT_7B = {
    "_name_or_path": "mosaicml/mpt-7b", "model_type": "mpt", "architectures": ["MPTForCausalLM"],
    "attn_config": {"alibi": True, "alibi_bias_max": 8, "attn_impl": "torch", "attn_pdrop": 0,
                    "attn_type": "multihead_attention", "attn_uses_sequence_id": False, "clip_qkv": None,
                    "prefix_lm": False, "qk_ln": False, "softmax_scale": None},
    "d_model": 4096, "emb_pdrop": 0, "embedding_fraction": 1.0, "expansion_ratio": 4, "learned_pos_emb": True,
    "logit_scale": None, "max_seq_len": 2048, "n_heads": 32, "n_layers": 32, "no_bias": True,
    "norm_type": "low_precision_layernorm", "resid_pdrop": 0, "vocab_size": 50432,
}
MPT_30B = MPT_7B | {"_name_or_path": "mosaicml/mpt-30b", "d_model": 7168, "n_heads": 64, "n_layers": 48,
                    "max_seq_len": 8192}
BLOOM_560M = {
    "model_type": "bloom", "architectures": ["BloomForCausalLM"], "apply_residual_connection_post_layernorm": False,
    "attention_dropout": 0.0, "hidden_dropout": 0.0, "n_embed": 1024, "n_layer": 24, "num_attention_heads": 16,
    "n_inner": None, "layer_norm_epsilon": 1e-05, "offset_alibi": 100, "pretraining_tp": 1, "vocab_size": 250880,
}
BLOOM_7B1 = BLOOM_560M | {"n_embed": 4096, "n_layer": 30, "num_attention_heads": 32}
FALCON_7B = {
    "model_type": "falcon", "architectures": ["FalconForCausalLM"], "alibi": False,
    "apply_residual_connection_post_layernorm": False, "attention_dropout": 0.0, "bias": False, "hidden_dropout": 0.0,
    "hidden_size": 4544, "multi_query": True, "new_decoder_architecture": False, "num_attention_heads": 71,
    "num_hidden_layers": 32, "parallel_attn": True, "vocab_size": 65024,
}
FALCON_40B = {
    "model_type": "falcon", "architectures": ["FalconForCausalLM"], "alibi": False,
    "apply_residual_connection_post_layernorm": False, "attention_dropout": 0.0, "bias": False, "hidden_dropout": 0.0,
    "hidden_size": 8192, "new_decoder_architecture": True, "num_attention_heads": 128, "num_hidden_layers": 60,
    "num_kv_heads": 8, "parallel_attn": True, "vocab_size": 65024,
}
# the first, remote-code configs of the same checkpoints
FALCON_7B_RW = {"model_type": "RefinedWebModel", "hidden_size": 4544, "n_head": 71, "n_layer": 32, "multi_query": True,
                "parallel_attn": True, "bias": False, "alibi": False, "vocab_size": 65024}
FALCON_40B_RW = {"model_type": "RefinedWeb", "hidden_size": 8192, "n_head": 128, "n_head_kv": 8, "n_layer": 60,
                 "parallel_attn": True, "bias": False, "alibi": False, "vocab_size": 65024}

# Published totals. bloom-560m and bloom-7b1: their model cards ("559,214,592" and "7,069,016,064"
# parameters). mpt-7b: model card "6.7B"; mpt-30b: model card "29.95B". falcon-7b / falcon-40b:
# the model as transformers (and vLLM) load it, head tied to the embedding as the configs leave it
# (FalconConfig's tie_word_embeddings defaults to true); the Hub's ~7.22 B / ~41.8 B safetensors
# totals count the stored lm_head tensor again (+ 65,024 x hidden; checked below).
EXACT = [
    ("mpt-7b", MPT_7B, 6_649_286_656),
    ("mpt-30b", MPT_30B, 29_957_200_896),
    ("bloom-560m", BLOOM_560M, 559_214_592),
    ("bloom-7b1", BLOOM_7B1, 7_069_016_064),
    ("falcon-7b", FALCON_7B, 6_921_720_704),
    ("falcon-40b", FALCON_40B, 41_303_293_952),
    ("falcon-7b (RefinedWebModel)", FALCON_7B_RW, 6_921_720_704),
    ("falcon-40b (RefinedWeb)", FALCON_40B_RW, 41_303_293_952),
]


@pytest.mark.parametrize("name,cfg,published", EXACT, ids=[e[0] for e in EXACT])
def test_parameter_count_matches_the_published_model(name, cfg, published):
    assert from_hf_config(cfg).params == published


def test_model_cards_rounded_figures():
    assert from_hf_config(MPT_7B).params == pytest.approx(6.7e9, rel=0.01)
    assert from_hf_config(MPT_30B).params == pytest.approx(29.95e9, rel=0.001)


def test_falcon_untied_head_is_the_hubs_larger_total():
    tied = from_hf_config(FALCON_40B)
    untied = from_hf_config(FALCON_40B | {"tie_word_embeddings": False})
    assert untied.params - tied.params == 65024 * 8192
    assert untied.params == pytest.approx(41.8e9, rel=0.001)


def test_shapes_and_traits_as_the_checkpoints_have_them():
    mpt = from_hf_config(MPT_7B)
    assert (mpt.num_kv_heads, mpt.intermediate_size, mpt.max_positions) == (32, 16384, 2048)
    assert not mpt.learned_positions and not mpt.bias and not mpt.norm_bias and mpt.tie_word_embeddings
    assert mpt.attention_impl == "eager"  # transformers' MptAttention adds ALiBi to explicit scores
    bloom = from_hf_config(BLOOM_7B1)
    assert bloom.intermediate_size == 4 * 4096 and bloom.max_positions is None  # ALiBi: no table, no limit
    assert bloom.embedding_norm and bloom.bias and bloom.attention_impl == "eager"
    f7, f40 = from_hf_config(FALCON_7B), from_hf_config(FALCON_40B)
    assert (f7.num_kv_heads, f7.head_dim, f7.norms_per_layer, f7.parallel_residual) == (1, 64, 1, True)
    assert (f40.num_kv_heads, f40.head_dim, f40.norms_per_layer) == (8, 64, 2)
    # the cache of one token: 2 (K, V) x layers x kv heads x head_dim x 2 bytes
    assert f7.kv_bytes_per_token(2) == 2 * 32 * 1 * 64 * 2
    assert f40.kv_bytes_per_token(2) == 2 * 60 * 8 * 64 * 2
    assert from_hf_config(MPT_7B).kv_bytes_per_token(2) == 2 * 32 * 4096 * 2


def test_mpt_options_change_the_count_as_they_should():
    base = from_hf_config(MPT_7B)
    h, layers = 4096, 32
    learned = from_hf_config(MPT_7B | {"attn_config": {"alibi": False}})
    assert learned.params - base.params == 2048 * h and learned.learned_positions
    rope = from_hf_config(MPT_7B | {"attn_config": {"alibi": False, "rope": True}})
    assert rope.params == base.params and not rope.learned_positions
    biased = from_hf_config(MPT_7B | {"no_bias": False})
    # Wqkv 3h + out_proj h + up 4h + down h, and the two LayerNorms' biases, per layer; norm_f's bias
    assert biased.params - base.params == layers * (3 * h + h + 4 * h + h + 2 * h) + h
    gqa = from_hf_config(MPT_7B | {"attn_config": {"alibi": True, "attn_type": "grouped_query_attention",
                                                   "kv_n_heads": 8}})
    assert gqa.num_kv_heads == 8
    assert base.params - gqa.params == layers * 2 * h * (h - 8 * 128)
    glu = from_hf_config(MPT_7B | {"ffn_config": {"ffn_type": "mptglu", "ffn_hidden_size": 11008}})
    assert glu.mlp == "gated" and glu.intermediate_size == 11008


@pytest.mark.parametrize("cfg,field", [
    (MPT_7B | {"no_bias": "yes"}, "no_bias"),
    (MPT_7B | {"attn_config": "alibi"}, "attn_config"),
    (MPT_7B | {"attn_config": {"alibi": "true"}}, "attn_config.alibi"),
    (MPT_7B | {"attn_config": {"attn_type": "grouped_query_attention"}}, "kv_n_heads"),
    (MPT_7B | {"attn_config": {"qk_ln": True}}, "qk_ln"),
    (MPT_7B | {"ffn_config": {"ffn_type": "te_ln_mlp"}}, "te_ln_mlp"),
    (MPT_7B | {"expansion_ratio": 0}, "expansion_ratio"),
    ({k: v for k, v in MPT_7B.items() if k != "d_model"}, "d_model"),
    (FALCON_7B | {"bias": "no"}, "bias"),
    (FALCON_7B | {"multi_query": 1}, "multi_query"),
    (FALCON_40B | {"num_kv_heads": 7}, "num_key_value_heads"),
    ({k: v for k, v in BLOOM_560M.items() if k != "n_embed"}, "hidden_size"),
])
def test_bad_family_fields_are_one_sentence_naming_the_field(cfg, field):
    with pytest.raises(BadInputError) as e:
        from_hf_config(cfg, where="config.json")
    assert field in str(e.value) and e.value.exit_code == 2
    assert e.value.args[0].count(". ") == 0  # one sentence (the hint apart)


T5_SMALL = {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "d_ff": 2048, "d_kv": 64,
            "d_model": 512, "is_encoder_decoder": True, "n_positions": 512, "num_heads": 8, "num_layers": 6,
            "relative_attention_num_buckets": 32, "vocab_size": 32128}


@pytest.mark.parametrize("cfg", [T5_SMALL, {"model_type": "bart", "d_model": 768, "vocab_size": 50265},
                                 {"model_type": "acme_seq2seq", "is_encoder_decoder": True}])
@pytest.mark.parametrize("assume_dense", [False, True])
def test_encoder_decoders_are_refused_even_with_assume_dense(cfg, assume_dense):
    with pytest.raises(UnknownModelTypeError) as e:
        from_hf_config(cfg, where="config.json", assume_dense=assume_dense)
    assert "encoder-decoder" in str(e.value) and e.value.exit_code == 2
    assert e.value.args[0].count(". ") == 0


def test_new_families_are_listed_as_supported():
    assert {"mpt", "bloom", "falcon", "refinedweb", "refinedwebmodel"} <= set(supported_model_types())
    assert "t5" not in supported_model_types()


# ---------------------------------------------------------------- against transformers' own modules


def _transformers_count(cfg_cls, **kw) -> int:
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = tf.AutoModelForCausalLM.from_config(getattr(tf, cfg_cls)(**kw))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("kw", [
    {"alibi": True, "bias": True, "parallel_attn": False, "multi_query": False},  # falcon-rw-1b's layout
    {"alibi": False, "bias": True, "parallel_attn": True, "multi_query": True},
    {"new_decoder_architecture": True, "num_kv_heads": 2, "num_ln_in_parallel_attn": 1},
    {"new_decoder_architecture": True, "num_kv_heads": 4, "bias": True, "ffn_hidden_size": 300},
])
def test_falcon_variants_match_transformers(kw):
    base = {"hidden_size": 128, "num_attention_heads": 8, "num_hidden_layers": 2, "vocab_size": 1000}
    ours = from_hf_config({"model_type": "falcon"} | base | kw).params
    assert ours == _transformers_count("FalconConfig", **base, **kw)


def test_mpt_and_bloom_match_transformers():
    # transformers' MptForCausalLM builds every Linear and LayerNorm without a bias and a 4 x d_model
    # MLP whatever no_bias and expansion_ratio say; the checkpoints' own code (llm-foundry, with
    # trust_remote_code) and vLLM follow them, as the planner does (test_mpt_options_... above)
    mpt = {"d_model": 128, "n_heads": 4, "n_layers": 2, "expansion_ratio": 4, "max_seq_len": 256,
           "vocab_size": 1000, "no_bias": True}
    assert from_hf_config({"model_type": "mpt"} | mpt).params == _transformers_count("MptConfig", **mpt)
    bloom = {"hidden_size": 128, "n_layer": 2, "n_head": 4, "vocab_size": 1000}
    assert from_hf_config({"model_type": "bloom"} | bloom).params == _transformers_count("BloomConfig", **bloom)


# ---------------------------------------------------------------- the new cards, as a user runs them


@pytest.mark.parametrize("name,expected", [
    ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB"), ("v100-16gb", "V100-SXM2-16GB"),
    ("NVIDIA A800-SXM4-80GB", "A800-80GB"), ("NVIDIA H800", "H800-SXM"), ("h800", "H800-SXM"),
    ("NVIDIA RTX A6000", "RTX-A6000"), ("a6000", "RTX-A6000"),
])
def test_new_cards_by_name_alias_and_nvml_name(name, expected):
    assert find_gpu(name).name == expected


def test_new_cards_figures():
    v100 = find_gpu("v100-sxm2-32gb")
    assert v100.bf16_dense_flops is None and v100.fp16_dense_flops == pytest.approx(125e12)
    assert v100.interconnect_bytes_per_second == pytest.approx(300e9)
    a800, a100 = find_gpu("a800-80gb"), find_gpu("a100-80gb")
    assert a800.interconnect_bytes_per_second == pytest.approx(400e9)  # the A100's 600 cut to 400
    assert (a800.bf16_dense_flops, a800.memory_bandwidth_bytes_per_second, a800.memory_bytes) == (
        a100.bf16_dense_flops, a100.memory_bandwidth_bytes_per_second, a100.memory_bytes)
    h800, h100 = find_gpu("h800"), find_gpu("h100-sxm")
    assert h800.interconnect_bytes_per_second == pytest.approx(400e9)
    assert h800.bf16_dense_flops == h100.bf16_dense_flops and h800.fp8_dense_flops == h100.fp8_dense_flops
    a6000 = find_gpu("rtx-a6000")
    assert a6000.bf16_dense_flops == pytest.approx(154.8e12) and a6000.memory_bandwidth_bytes_per_second == 768e9


@pytest.mark.parametrize("name,mib,source", [
    ("a800-80gb", 81_920, "nvidia-smi memory.total"), ("v100-sxm2-16gb", 16_160, "nvidia-smi memory.total"),
    ("v100-sxm2-32gb", 32_768, "datasheet size read as GiB"), ("h800", 81_920, "datasheet size read as GiB"),
    ("rtx-a6000", 49_152, "datasheet size read as GiB"),
])
def test_new_cards_capacity_and_where_it_comes_from(name, mib, source):
    g = find_gpu(name)
    assert g.memory_bytes == mib << 20 and g.memory_source == source


def test_v100_refuses_bf16_and_plans_fp16():
    with pytest.raises(UnsupportedPrecisionError, match="BF16"):
        find_gpu("v100-sxm2-32gb").peak_flops("bf16")
    assert find_gpu("v100-sxm2-32gb").peak_flops("fp16") == pytest.approx(125e12)


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["plan", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("flag", [("--dtype", "bf16", "--workload", "infer"),
                                  ("--precision", "bf16", "--workload", "train", "--seq", "1024")])
def test_cli_v100_bf16_is_one_sentence_exit_2(tmp_path, capsys, flag):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(MPT_7B))
    rc, out, err = _cli(capsys, "--model", str(p), "--gpu", "V100-SXM2-32GB", *flag)
    assert rc == 2 and "no BF16" in err and "Traceback" not in out + err


def test_cli_plans_each_family_on_the_new_cards(tmp_path, capsys):
    for cfg, gpu, dtype in [(MPT_7B, "V100-SXM2-32GB", "fp16"), (BLOOM_7B1, "A800-80GB", "bf16"),
                            (FALCON_7B, "RTX-A6000", "bf16"), (FALCON_40B_RW, "H800-SXM", "fp8")]:
        p = tmp_path / "config.json"
        p.write_text(json.dumps(cfg))
        rc, out, err = _cli(capsys, "--model", str(p), "--gpu", gpu, "--gpus", "2" if cfg is FALCON_40B_RW else "1",
                            "--tp", "2" if cfg is FALCON_40B_RW else "1", "--workload", "infer", "--dtype", dtype,
                            "--prompt", "512", "--new-tokens", "128", "--format", "json")
        assert rc == 0, err
        d = json.loads(out)
        assert d["model"]["params"] == from_hf_config(cfg).params and d["gpu"]["name"] == gpu
    rc, out, err = _cli(capsys, "--model", str(p), "--gpu", "h100", "--workload", "train", "--seq", "2048")
    assert rc == 0 and "Traceback" not in out + err


def test_cli_t5_is_refused_in_one_sentence(tmp_path, capsys):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(T5_SMALL))
    for extra in ((), ("--assume-dense",)):
        rc, out, err = _cli(capsys, "--model", str(p), "--gpu", "h100", "--workload", "infer", *extra)
        assert rc == 2 and "encoder-decoder" in err and "Traceback" not in out + err


def test_a_family_config_is_named_by_its_name_or_path(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(MPT_7B))
    assert load_model(p).name == "mosaicml/mpt-7b"
    p.write_text(json.dumps(FALCON_7B))
    assert load_model(p).name == str(p)


def test_nemotron_is_a_plain_mlp_with_layernorm_and_untied_head():
    # Nemotron-4's shapes as NVIDIA's NeMo 8B recipe gives them, written as a transformers NemotronConfig
    cfg = {"model_type": "nemotron", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 32, "intermediate_size": 16384, "vocab_size": 256000, "hidden_act": "relu2",
           "partial_rotary_factor": 0.5, "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False}
    m = from_hf_config(cfg, name="nemotron-8b")
    h, layers, vocab, ffn = 4096, 32, 256000, 16384
    # embedding + head, per layer q/k/v/o + up/down + two LayerNorm1P (weight and bias), the final norm
    assert m.params == 2 * vocab * h + layers * (4 * h * h + 2 * h * ffn + 2 * 2 * h) + 2 * h
    assert (m.mlp, m.act, m.norm) == ("plain", "relu2", "layernorm")
