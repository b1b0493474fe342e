"""`gpulens quant check` on a folder that is not a loadable model, or with a device it cannot run on:
one sentence naming the folder and what is missing or damaged, exit 2 (a GPU that is not there:
exit 3), before torch is imported and before the store is opened where that can be told from the
files. Tiny folders built here from a config; nothing is downloaded."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from gpulens.cli.main import main

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16, "intermediate_size": 32,
          "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": 64,
          "max_position_embeddings": 64}
EVAL = "true {model} {out}"


def safetensors_bytes(tensors: dict[str, int], *, cut: int = 0) -> bytes:
    """A safetensors file of F32 tensors of the given lengths, without torch; `cut` bytes short."""
    header, at = {}, 0
    for name, n in tensors.items():
        header[name] = {"dtype": "F32", "shape": [n], "data_offsets": [at, at + 4 * n]}
        at += 4 * n
    raw = json.dumps(header).encode()
    data = struct.pack("<Q", len(raw)) + raw + b"\0" * at
    return data[: len(data) - cut]


def folder(tmp_path: Path, *, weights: bytes | None = None, tokenizer: bool = True, config: str | None = None) -> Path:
    d = tmp_path / "qm"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(CONFIG) if config is None else config)
    if weights is not None:
        (d / "model.safetensors").write_bytes(weights)
    if tokenizer:
        (d / "tokenizer.json").write_text("{}")
    return d


def quant(model: Path, *extra: str, store: Path | None = None) -> list[str]:
    return ["quant", "check", "--model", str(model), "--to", "int8", "--eval-cmd", EVAL,
            *(["--store", str(store)] if store else ["--no-record"]), *extra]


def refused(capsys, args: list[str], code: int = 2) -> str:  # noqa: ANN001
    rc = main(args)
    err = " ".join(capsys.readouterr().err.split())
    assert rc == code, err
    assert err.startswith("error: ") and "Traceback" not in err, err
    return err


def test_a_folder_without_weights(tmp_path, capsys):
    d = folder(tmp_path)
    store = tmp_path / "runs.db"
    err = refused(capsys, quant(d, store=store))
    assert f"The model folder {d} has no weights (no model.safetensors or pytorch_model.bin" in err
    assert not store.exists()  # refused before the store was opened


@pytest.mark.parametrize(("weights", "said"), [
    (b"garbage\n", "has a damaged model.safetensors: it does not start with a safetensors header (8 bytes, first bytes 'garbage\\n')"),
    (b"", "has a damaged model.safetensors: it does not start with a safetensors header (0 bytes"),
    (struct.pack("<Q", 5) + b"nope!", "has a damaged model.safetensors: its header is not JSON"),
    (struct.pack("<Q", 2) + b"[]", "has a damaged model.safetensors: its header is not a JSON object"),
    (safetensors_bytes({"w": 4, "b": 4}, cut=3), "has a damaged model.safetensors: its tensors need {full:,} bytes but the "
                                                 "file holds {cut:,} (cut short)"),
    (safetensors_bytes({"w": 4}) + b"extra", "has a damaged model.safetensors: its tensors need"),
], ids=["garbage", "empty", "header-not-json", "header-a-list", "cut-short", "longer"])
def test_damaged_safetensors(tmp_path, capsys, weights, said):
    d = folder(tmp_path, weights=weights)
    err = refused(capsys, quant(d))
    full = len(safetensors_bytes({"w": 4, "b": 4}))
    said = said.format(full=full, cut=full - 3)
    assert f"The model folder {d} {said}" in err, err


def test_a_sharded_index_naming_a_missing_shard(tmp_path, capsys):
    d = folder(tmp_path)
    (d / "model-00001-of-00002.safetensors").write_bytes(safetensors_bytes({"a": 2}))
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                                                               "b": "model-00002-of-00002.safetensors"}}))
    err = refused(capsys, quant(d))
    assert f"The model folder {d} lacks the weights shard 'model-00002-of-00002.safetensors' that model.safetensors.index.json names" in err


def test_no_tokenizer_no_folder_a_file_and_a_broken_config(tmp_path, capsys):
    d = folder(tmp_path, weights=safetensors_bytes({"w": 4}), tokenizer=False)
    assert f"The model folder {d} has no tokenizer" in refused(capsys, quant(d))
    assert f"The model folder {tmp_path / 'nope'} does not exist" in refused(capsys, quant(tmp_path / "nope"))
    assert "is a file, not a Hugging Face model folder" in refused(capsys, quant(d / "config.json"))
    (d / "config.json").write_text("{not json")
    assert f"The model config {d / 'config.json'} cannot be read: it is not JSON" in refused(capsys, quant(d))
    (d / "config.json").write_text("[1]")
    assert "is not a JSON object" in refused(capsys, quant(d))


@pytest.mark.parametrize("device", ["tpu", "cuda0", "cpu:1", "mps", ""])
def test_a_device_it_cannot_run_on_is_refused_first(tmp_path, capsys, device):
    store = tmp_path / "runs.db"
    err = refused(capsys, quant(tmp_path / "not-looked-at", "--device", device, store=store))
    assert f"--device must be cpu, cuda or cuda:N, not {device!r}" in err
    assert not store.exists()


def test_the_folder_is_refused_before_torch_is_imported(tmp_path):
    d = folder(tmp_path, weights=b"garbage\n")
    code = ("import sys; from gpulens.cli.main import main; "
            f"rc = main({quant(d)!r}); "
            "print(rc, 'torch' in sys.modules, 'transformers' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.stdout.split() == ["2", "False", "False"], (p.stdout, p.stderr)
    assert "damaged model.safetensors" in p.stderr


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A whole tiny Llama folder (weights, word-level tokenizer) from lm_eval_rig, built here."""
    pytest.importorskip("transformers", reason="needs transformers (the quant extra)")
    pytest.importorskip("tokenizers", reason="needs tokenizers (the quant extra)")
    from lm_eval_rig import tiny_model

    return tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def copy_of(tiny: Path, dest: Path) -> Path:
    import shutil

    return Path(shutil.copytree(tiny, dest))


def test_what_only_transformers_can_tell_is_one_sentence_too(tiny, tmp_path, capsys):
    """Files that pass the checks on disk but that transformers cannot load: a model type it does not
    know, tensors of another shape than the config's, a tokenizer file it cannot read."""
    d = copy_of(tiny, tmp_path / "unknown-type")
    (d / "config.json").write_text(json.dumps({**json.loads((d / "config.json").read_text()), "model_type": "no-such-model"}))
    err = refused(capsys, quant(d))
    assert f"transformers cannot load the model in {d} (" in err and "Point --model at a folder written by save_pretrained" in err

    d = copy_of(tiny, tmp_path / "other-shapes")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "hidden_size": cfg["hidden_size"] * 2}))
    err = refused(capsys, quant(d))
    assert f"The weights in the model folder {d} do not fit its config.json: 21 tensors have another shape " \
           "(lm_head.weight: [26, 32] in the file, [26, 64] by the config)" in err, err

    d = copy_of(tiny, tmp_path / "other-weights")  # a whole, readable safetensors file of some other model
    (d / "model.safetensors").write_bytes(safetensors_bytes({"w": 4}))
    err = refused(capsys, quant(d))
    assert f"The weights in the model folder {d} do not fit its config.json: " in err and "21 tensors are missing (lm_head.weight, model.embed_tokens.weight, " in err, err

    d = copy_of(tiny, tmp_path / "bad-tokenizer")
    (d / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "NoSuchModel"}}')
    assert f"transformers cannot load the tokenizer in {d} (" in refused(capsys, quant(d))


def test_cuda_without_a_gpu_is_exit_3(tiny, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    err = refused(capsys, quant(tiny, "--device", "cuda"), code=3)
    assert "--device cuda was asked for but PyTorch sees no CUDA GPU" in err
