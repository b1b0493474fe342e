"""A hostile-input pass over what `gpulens plan` reads from files: a config.json size of 0 that had
been read as "not given" (head_dim 0 planned as hidden / heads), a model_type null planned as a
LLaMA, sizes past any model (num_hidden_layers 1e12 planned at "tokens/s 0"), and a calibration
run with a step of 1e-300 s (fitted into errors of 10^300 %). Each is one sentence naming the field,
exit 2, never a traceback; absent fields and real models plan as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpulens.cli.main import main
from gpulens.data import bundled_trace

LLAMA = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
         "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192}
MIXTRAL = {**LLAMA, "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2}
DEEPSEEK = {"model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
            "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 102400,
            "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1,
            "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "max_position_embeddings": 163840}
FALCON = {"model_type": "falcon", "hidden_size": 8192, "num_hidden_layers": 60, "num_attention_heads": 128,
          "num_kv_heads": 8, "new_decoder_architecture": True, "vocab_size": 65024}
GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "vocab_size": 50257}
GEMMA3 = {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34,
          "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262208,
          "sliding_window": 1024, "sliding_window_pattern": 6, "max_position_embeddings": 131072}
CALIBRATION = bundled_trace() / "memory_calibration.jsonl"


def _plan(capsys: pytest.CaptureFixture[str], tmp_path: Path, cfg: dict[str, Any],
          workload: str = "infer") -> tuple[int, str]:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    rc = main(["plan", "--model", str(path), "--gpu", "h200", "--workload", workload])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, err


def _refused(capsys, tmp_path, cfg, *needles: str, workload: str = "infer") -> str:
    rc, err = _plan(capsys, tmp_path, cfg, workload)
    assert rc == 2, err
    for needle in needles:
        assert needle in err, err
    assert err.count("\n") <= 2, err  # one sentence and its hint
    return err


# ---------------------------------------------------------------- 1. a size of 0 (or no size) is refused


@pytest.mark.parametrize("workload", ["infer", "train"])
def test_a_head_dim_of_zero_is_refused_not_read_as_hidden_over_heads(capsys, tmp_path, workload):
    _refused(capsys, tmp_path, {**LLAMA, "head_dim": 0}, "'head_dim'", "above zero", workload=workload)


@pytest.mark.parametrize("value", [-128, 64.5, True, "128", [128], None])
def test_a_head_dim_that_is_no_positive_whole_number_is_refused(capsys, tmp_path, value):
    if value is None:  # null is an absent head_dim: hidden / heads, as before
        rc, err = _plan(capsys, tmp_path, {**LLAMA, "head_dim": value})
        assert rc == 0, err
        return
    _refused(capsys, tmp_path, {**LLAMA, "head_dim": value}, "'head_dim'")


def test_a_head_dim_that_is_given_is_planned(capsys, tmp_path):
    rc, err = _plan(capsys, tmp_path, {**LLAMA, "head_dim": 128})
    assert rc == 0, err


@pytest.mark.parametrize(("cfg", "field"), [
    ({**FALCON, "num_kv_heads": 0}, "num_kv_heads"),  # had been read as every head
    ({**GPT2, "n_inner": 0}, "n_inner"),  # had been read as 4 x hidden
    ({**FALCON, "ffn_hidden_size": 0}, "ffn_hidden_size"),  # had been read as 4 x hidden
    ({**DEEPSEEK, "moe_intermediate_size": 0}, "moe_intermediate_size"),  # had been read as intermediate_size
    ({**GEMMA3, "sliding_window_pattern": 0}, "sliding_window_pattern"),  # had been read as 6
    ({**DEEPSEEK, "kv_lora_rank": 0}, "kv_lora_rank"),
    ({**LLAMA, "intermediate_size": 0}, "intermediate_size"),
    ({**LLAMA, "vocab_size": 0}, "vocab_size"),
])
def test_other_sizes_of_zero_are_refused_naming_the_field(capsys, tmp_path, cfg, field):
    _refused(capsys, tmp_path, cfg, f"'{field}'", "above zero")


@pytest.mark.parametrize(("cfg", "needles"), [
    ({**MIXTRAL, "num_experts_per_tok": 0}, ("'num_experts_per_tok'", "above zero")),  # said it "lacks" the field
    ({**MIXTRAL, "num_local_experts": 0}, ("'num_local_experts'", "above zero")),
    ({**MIXTRAL, "num_experts_per_tok": 9}, ("'num_experts_per_tok'", "more than the 8 experts")),  # negative inactive
    ({**DEEPSEEK, "first_k_dense_replace": 28}, ("'first_k_dense_replace'", "27 layers")),  # negative MoE layers
])
def test_expert_counts_that_no_mixture_of_experts_has_are_refused(capsys, tmp_path, cfg, needles):
    _refused(capsys, tmp_path, cfg, *needles)


def test_the_families_sizes_as_given_still_plan(capsys, tmp_path):
    for cfg in (LLAMA, MIXTRAL, DEEPSEEK, FALCON, GPT2, GEMMA3, {k: v for k, v in LLAMA.items() if k != "model_type"}):
        rc, err = _plan(capsys, tmp_path, cfg)
        assert rc == 0, (cfg.get("model_type"), err)


# ---------------------------------------------------------------- 2. model_type null


@pytest.mark.parametrize("workload", ["infer", "train"])
@pytest.mark.parametrize("value", [None, 7, ["llama"], {"name": "llama"}, True])
def test_a_model_type_that_is_no_name_is_refused(capsys, tmp_path, value, workload):
    # null had been planned as a LLaMA, while "unicorn" was refused
    err = _refused(capsys, tmp_path, {**LLAMA, "model_type": value}, "'model_type'", "without model_type",
                   workload=workload)
    assert json.dumps(value) in err


def test_a_null_model_type_inside_text_config_is_refused(capsys, tmp_path):
    inner = {k: v for k, v in LLAMA.items() if k != "model_type"}
    _refused(capsys, tmp_path, {"model_type": "gemma3", "text_config": {**inner, "model_type": None}},
             "'text_config.model_type'")


def test_a_config_without_model_type_is_still_planned_as_before(capsys, tmp_path):
    rc, err = _plan(capsys, tmp_path, {k: v for k, v in LLAMA.items() if k != "model_type"})
    assert rc == 0, err
    rc, err = _plan(capsys, tmp_path, {**LLAMA, "model_type": "unicorn"})
    assert rc == 2 and "'unicorn'" in err


# ---------------------------------------------------------------- 3. sizes past any model


@pytest.mark.parametrize("workload", ["infer", "train"])
def test_a_trillion_layers_is_refused(capsys, tmp_path, workload):
    # planned as "tokens/s 0" on "TP across 8589934592 GPUs"
    _refused(capsys, tmp_path, {**LLAMA, "num_hidden_layers": 1_000_000_000_000},
             "'num_hidden_layers'", "1,000,000,000,000", "no model has more than 10,000 layers", workload=workload)


@pytest.mark.parametrize(("cfg", "field", "limit"), [
    ({**LLAMA, "num_hidden_layers": 1e300}, "num_hidden_layers", "10,000 layers"),
    ({**LLAMA, "hidden_size": 2_000_000, "head_dim": 128}, "hidden_size", "1,000,000"),
    ({**LLAMA, "num_attention_heads": 131_072, "num_key_value_heads": 8}, "num_attention_heads", "100,000"),
    ({**LLAMA, "num_key_value_heads": 200_000}, "num_key_value_heads", "100,000"),
    ({**LLAMA, "head_dim": 1_000_000}, "head_dim", "100,000"),
    ({**LLAMA, "intermediate_size": 100_000_000}, "intermediate_size", "10,000,000"),
    ({**LLAMA, "vocab_size": 1_000_000_000}, "vocab_size", "100,000,000"),
    ({**MIXTRAL, "num_local_experts": 100_000_000}, "num_local_experts", "10,000,000"),
    ({"model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32, "vocab_size": 50432,
      "expansion_ratio": 100_000}, "expansion_ratio", "10,000,000"),
    ({**GPT2, "n_layer": 20_000}, "n_layer", "10,000 layers"),
])
def test_a_size_past_any_model_is_refused_naming_the_field(capsys, tmp_path, cfg, field, limit):
    _refused(capsys, tmp_path, cfg, f"'{field}'", "no model has", limit)


def test_sizes_each_within_bounds_that_multiply_past_any_model_are_refused(capsys, tmp_path):
    cfg = {**LLAMA, "hidden_size": 1_000_000, "num_attention_heads": 1000, "num_key_value_heads": 1000,
           "intermediate_size": 4_000_000, "num_hidden_layers": 10_000}
    _refused(capsys, tmp_path, cfg, "parameters", "no model has more than 1,000T", workload="train")


def test_the_largest_real_shapes_are_far_inside_the_bounds(capsys, tmp_path):
    # a 405B (126 layers, hidden 16,384, MLP 53,248) and a vocabulary of 1,000,000 with 512 experts
    big = {**LLAMA, "hidden_size": 16384, "intermediate_size": 53248, "num_hidden_layers": 126,
           "num_attention_heads": 128, "vocab_size": 1_000_000}
    rc, err = _plan(capsys, tmp_path, big, "train")
    assert rc == 0, err  # planned (it does not fit one H200, which the plan says)
    rc, err = _plan(capsys, tmp_path, {**MIXTRAL, "num_local_experts": 512, "num_experts_per_tok": 10})
    assert rc == 0, err


# ---------------------------------------------------------------- 4. calibration runs no GPU measures


def _calibrate(capsys, tmp_path: Path, row: dict[str, Any]) -> tuple[int, str]:
    path = tmp_path / "runs.jsonl"
    path.write_text(CALIBRATION.read_text().rstrip("\n") + "\n" + json.dumps(row) + "\n")
    rc = main(["plan", "calibrate", "--measurements", str(path), "--gpu", "h200", "--dry-run"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, err


def _run(kind: str) -> dict[str, Any]:
    return next(d for d in map(json.loads, CALIBRATION.read_text().splitlines()) if d.get("kind") == kind)


@pytest.mark.parametrize(("kind", "field", "value"), [
    ("train", "step_s", 1e-300),  # fitted into errors of 10^300 %
    ("train", "step_s", 1e-6), ("train", "step_s", 1e6), ("train", "step_s", 1e12),
    ("train", "step_s", "0.15"), ("train", "step_s", True),  # had been read as 0.15 s and 1 s
    ("infer", "decode_token_s_median", 1e-9), ("infer", "prefill_s", 5e6),
    ("train", "peak_alloc", 0.5), ("train", "peak_alloc", 101 * 2**40), ("train", "peak_reserved", 1e300),
    ("train", "mem_after_load", -1), ("train", "tokens_per_s", 1e12), ("train", "tokens_per_s", 1e-9),
])
def test_a_figure_no_gpu_run_measures_is_refused_naming_line_and_field(capsys, tmp_path, kind, field, value):
    rc, err = _calibrate(capsys, tmp_path, {**_run(kind), field: value})
    assert rc == 2, err
    assert "runs.jsonl line 19" in err and f"'{field}'" in err, err
    assert err.count("\n") <= 2, err


@pytest.mark.parametrize(("field", "value"), [("step_s", 2e-6), ("step_s", 999_999.0), ("peak_alloc", 100 * 2**40),
                                              ("peak_alloc", 1), ("tokens_per_s", 1e-6)])
def test_figures_inside_the_bounds_are_read(capsys, tmp_path, field, value):
    rc, err = _calibrate(capsys, tmp_path, {**_run("train"), field: value})
    assert f"'{field}'" not in err, err
    assert rc in (0, 2), err  # the fit may be refused for its error, never the value


def test_a_config_without_model_type_says_how_it_was_read(tmp_path, capsys):
    """It is planned as a dense LLaMA-like decoder, and the plan says so (it did so silently)."""
    import json

    from gpulens.cli.main import main

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16,
                               "intermediate_size": 5632, "vocab_size": 32000}))
    assert main(["plan", "--model", str(cfg), "--gpu", "h200", "--workload", "infer", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert any("names no model_type" in n for n in d["notes"]) and d["model"]["untyped"] is True
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "model_type": "llama"}))
    assert main(["plan", "--model", str(cfg), "--gpu", "h200", "--workload", "infer", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert not any("model_type" in n for n in d["notes"]) and d["model"]["untyped"] is False
