"""Parameter counts per family against published totals, and config.json parsing."""

from __future__ import annotations

import json

import pytest

from gpulens.errors import BadInputError
from gpulens.plan import from_hf_config, load_model, preset, preset_names

# Published totals (model cards / Hugging Face parameter counts), one or more per family.
PUBLISHED = {
    "llama-3-8b": 8_030_261_248,  # LLaMA-3-8B ≈ 8.03 B
    "llama-2-7b": 6_738_415_616,
    "llama-3.2-1b": 1_235_814_400,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-0.5b": 494_032_768,
    "qwen3-8b": 8_190_735_360,
    "qwen3-30b-a3b": 30_532_122_624,
    "gemma-2b": 2_506_172_416,
    "gemma-7b": 8_537_680_896,
    "gemma-2-9b": 9_241_705_984,
    "phi-3-mini": 3_821_079_552,
    "gpt2": 124_439_808,
    "gpt2-xl": 1_557_611_200,
    "pythia-1.4b": 1_414_647_808,
    "gpt-neox-20b": 20_554_567_680,
    "bert-base-uncased": 109_482_240,
    "bert-large-uncased": 335_141_888,
    "roberta-base": 124_645_632,
    "mpt-7b": 6_649_286_656,  # model card "6.7B"; exact: transformers' MptForCausalLM on its config
    "bloom-560m": 559_214_592,  # model card
    "bloom-7b1": 7_069_016_064,  # model card
    "falcon-7b": 6_921_720_704,  # FalconForCausalLM on its config (tied head); tests/plan/test_families.py
}


@pytest.mark.parametrize("name,published", sorted(PUBLISHED.items()))
def test_parameter_count_matches_published_total(name, published):
    assert preset(name).params == pytest.approx(published, rel=0.005)


def test_every_family_is_covered():
    families = {preset(n).family for n in PUBLISHED}
    assert {"llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gpt2", "gpt_neox", "bert", "mpt", "bloom",
            "falcon"} <= families


def test_presets_are_a_few_dozen_and_carry_their_source():
    names = preset_names()
    assert len(names) >= 30
    for n in names:
        assert preset(n).source.startswith("preset ")


def test_moe_total_versus_active():
    mixtral = preset("mixtral-8x7b")
    assert mixtral.active_params == pytest.approx(12.9e9, rel=0.01)  # "12.9 B active" per Mistral
    qwen = preset("qwen3-30b-a3b")
    assert qwen.active_params == pytest.approx(3.3e9, rel=0.03)  # "A3B": 3.3 B activated


def test_hf_config_with_gqa_explicit_head_dim_and_tied_embeddings(tmp_path):
    cfg = {"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
           "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936,
           "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = load_model(tmp_path)  # a folder holding config.json
    assert m.head_dim == 128 and m.q_size == 2048  # not hidden / heads = 64
    assert m.kv_size == 1024
    assert m.params == 596_049_920  # Qwen3-0.6B
    untied = from_hf_config(cfg | {"tie_word_embeddings": False})
    assert untied.params - m.params == 151936 * 1024


def test_gpt2_field_names_are_understood():
    m = from_hf_config({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024})
    assert m.params == 124_439_808
    assert m.intermediate_size == 3072 and m.mlp == "plain" and m.tie_word_embeddings


def test_missing_field_is_named():
    with pytest.raises(BadInputError) as e:
        from_hf_config({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                        "vocab_size": 32000}, name="x")
    assert "intermediate_size" in str(e.value)


def test_bad_head_counts_and_non_positive_fields():
    with pytest.raises(BadInputError, match="multiple"):
        from_hf_config({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 4,
                        "intermediate_size": 128, "vocab_size": 100})
    with pytest.raises(BadInputError, match="above zero"):
        from_hf_config({"hidden_size": 0, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 8, "vocab_size": 10})


def test_bare_parameter_count_is_rough():
    m = load_model("7b")
    assert m.rough
    assert m.params == pytest.approx(7e9, rel=0.05)
    assert m.num_heads % m.num_kv_heads == 0


def test_unknown_model_suggests_presets():
    with pytest.raises(BadInputError) as e:
        load_model("llama-3-8")
    assert "llama-3-8b" in str(e.value)


def test_preset_accepts_hub_repo_names():
    assert load_model("meta-llama/Meta-Llama-3-8B").params == 8_030_261_248


def test_a_preset_is_planned_under_the_name_asked_for():
    """`plan compare --model qwen2.5-7b` (its help's own example) planned and printed `qwen2-7b`: the
    preset was Qwen2.5-7B's config under the older name. Both names work; each plans as itself."""
    from gpulens.plan.models import preset

    assert preset("qwen2.5-7b").name == "qwen2.5-7b"
    assert preset("Qwen/Qwen2.5-7B").name == "qwen2.5-7b"
    assert preset("qwen2-7b").params == preset("qwen2.5-7b").params  # Qwen2-7B has the same shape
