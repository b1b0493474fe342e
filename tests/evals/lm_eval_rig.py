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



def trained_adder_model(folder: Path, steps: int = 200, seed: int = 0) -> Path:
    """A small Llama trained on CPU until it answers "a + b =" with (a + b) mod 10 for every pair of
    digits (it needs its attention and MLPs for that, so damaging their weights shows), saved as a
    Hugging Face folder with its word-level tokenizer."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{str(i): i + 3 for i in range(10)}, "+": 13, "=": 14}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                            pad_token="</s>").save_pretrained(folder)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=16,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = LlamaForCausalLM(cfg)
    pairs = [(a, b) for a in range(10) for b in range(10)]
    x = torch.tensor([[vocab[str(a)], vocab["+"], vocab[str(b)], vocab["="]] for a, b in pairs])
    y = torch.tensor([vocab[str((a + b) % 10)] for a, b in pairs])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x).logits[:, -1, :], y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(x).logits[:, -1, :].argmax(-1) == y).float().mean().item()
    assert acc == 1.0, f"the tiny model learned only {acc:.0%} of the task"
    model.save_pretrained(folder)
    return folder


def adder_task(folder: Path) -> Path:
    """An lm-eval multiple-choice task over a local JSONL: the last digit of a + b, for all 100 pairs."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "adder.jsonl"
    data.write_text("".join(json.dumps({"a": a, "b": b, "label": (a + b) % 10}) + "\n" for a in range(10) for b in range(10)))
    (folder / "adder.yaml").write_text(
        "task: adder\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "{{a}} + {{b}} ="\n'
        "doc_to_choice: ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9']\n"
        "doc_to_target: label\n"
        "metric_list:\n  - metric: acc\n"
    )
    return folder
