"""A tiny Hugging Face model and a local lm-eval task, built on the spot: nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

WORDS = [str(i) for i in range(20)] + ["is", "even", "odd"]


def tiny_model(folder: Path) -> Path:
    """A 2-layer Llama with a word-level tokenizer over WORDS, saved as a Hugging Face folder."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                            pad_token="</s>").save_pretrained(folder)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


def parity_task(folder: Path, examples: int = 40) -> Path:
    """An lm-eval multiple-choice task over a local JSONL: is N even or odd?"""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "parity.jsonl"
    data.write_text("".join(json.dumps({"n": i % 20, "label": (i % 20) % 2}) + "\n" for i in range(examples)))
    (folder / "parity.yaml").write_text(
        "task: parity\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "{{n}} is"\n'
        'doc_to_choice: ["even", "odd"]\n'
        "doc_to_target: label\n"
        "metric_list:\n  - metric: acc\n"
    )
    return folder
