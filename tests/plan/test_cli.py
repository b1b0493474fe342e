"""`gpulens plan …` end to end: JSON keys, the text a beginner reads, and every bad input as one
sentence with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpulens.cli.main import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["plan", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_has_the_agreed_keys(capsys):
    rc, out, _ = run(capsys, "--model", "llama-3-8b", "--workload", "train", "--gpu", "H100-SXM", "--batch", "1",
                     "--seq", "2048", "--grad-ckpt", "--precision", "bf16", "--format", "json")
    assert rc == 0
    d = json.loads(out)
    assert isinstance(d["fits"], bool)
    assert d["memory"]["peak_bytes"] == sum(d["memory"]["breakdown"].values())
    assert {"step_seconds", "tokens_per_second", "mfu_ratio"} <= set(d["speed"])
    assert isinstance(d["advice"], list)
    assert d["gpu"]["name"] == "H100-SXM" and d["model"]["params"] == 8_030_261_248


def test_json_for_serving(capsys):
    rc, out, _ = run(capsys, "--model", "qwen2.5-7b", "--workload", "infer", "--gpu", "l40s", "--prompt", "1000",
                     "--new-tokens", "200", "--runtime", "vllm", "--batch", "8", "--tpot-target", "40ms", "--format", "json")
    assert rc == 0
    d = json.loads(out)
    assert {"prefill_seconds", "ttft_seconds", "tpot_seconds", "output_tokens_per_second", "max_concurrency"} <= set(d["speed"])
    assert d["memory"]["breakdown"]["kv_cache"] > 0
    rc, out, _ = run(capsys, "--model", "llama-3-70b", "--workload", "infer", "--gpu", "h100", "--gpus", "4",
                     "--runtime", "vllm", "--format", "json")
    assert rc == 0 and json.loads(out)["setup"]["tensor_parallel"] == 4 and json.loads(out)["fits"]


def test_text_is_a_readable_table_with_a_bar(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    rc, out, _ = run(capsys, "--model", "llama-3-8b", "--gpu", "h100", "--batch", "4", "--seq", "4096")
    assert rc == 0
    assert "Does not fit" in out and "Memory" in out and "█" in out and "┃" in out
    assert "weights" in out and "activations" in out and "What to do" in out and "checkpointing" in out


def test_compare_and_listings(capsys):
    rc, out, _ = run(capsys, "compare", "--model", "llama-3.2-3b", "--gpu", "a100-80gb,h100-sxm", "--gpu", "l4",
                     "--batch", "2", "--seq", "1024", "--format", "json")
    assert rc == 0
    assert [r["gpu"]["name"] for r in json.loads(out)["results"]] == ["A100-80GB", "H100-SXM", "L4"]
    rc, out, _ = run(capsys, "compare", "--model", "llama-3.2-3b", "--gpu", "a100-80gb", "--gpu", "h200")
    assert rc == 0 and "A100-80GB" in out and "H200" in out
    rc, out, _ = run(capsys, "gpus", "--format", "json")
    assert rc == 0 and all(g["sources"] for g in json.loads(out))
    rc, out, _ = run(capsys, "models")
    assert rc == 0 and "mixtral-8x7b" in out


def test_calibrate_dry_run_reports_errors(capsys):
    rc, out, _ = run(capsys, "calibrate", "--measurements", "bundled", "--dry-run", "--format", "json")
    assert rc == 0
    (g,) = json.loads(out)["gpus"]
    assert g["gpu"] == "H200" and g["runs"] == 18
    assert max(abs(e) for e in g["errors_after"]["train_step"]) < 0.3


@pytest.mark.parametrize("argv,needle", [
    (["--model", "llama-3-8b", "--gpu", "h10"], "Unknown GPU 'h10'"),
    (["--model", "llama-3-8b", "--gpu", "h100", "--batch", "0"], "--batch must be between 1 and"),
    (["--model", "llama-3-8b", "--gpu", "h100", "--seq", "-5"], "--seq must be between 1 and"),
    (["--model", "llama-3-8b", "--gpu", "a100-80gb", "--workload", "infer", "--dtype", "fp8"], "no FP8"),
    (["--model", "llama-3-8b", "--gpu", "t4", "--precision", "bf16"], "no BF16"),
    (["--model", "llama-3-8b", "--gpu", "h100", "--precision", "fp64"], "Unknown precision"),
    (["--model", "not-a-model", "--gpu", "h100"], "Unknown model"),
])
def test_bad_input_is_one_sentence_and_exit_2(capsys, argv, needle):
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    assert needle in err and "Traceback" not in err + out


def test_config_missing_a_field_names_it(capsys, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32,
                               "num_attention_heads": 32, "intermediate_size": 14336}))
    rc, _, err = run(capsys, "--model", str(cfg), "--gpu", "h100")
    assert rc == 2 and "vocab_size" in err


def test_real_process_exit_code_and_suggestion():
    p = subprocess.run([sys.executable, "-m", "gpulens.cli.main", "plan", "--model", "llama-3-8b", "--gpu", "H1OO-SXM"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "H100-SXM" in p.stderr and "Traceback" not in p.stderr
