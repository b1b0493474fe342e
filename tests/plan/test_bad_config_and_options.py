"""Bad config.json fields and absurd plan options: one sentence and exit 2, never a traceback or a
silently wrong plan (issue: 'eight' heads, 1e400 widths, negative counts, "no" read as true)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

BASE = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192}


def _gpulens(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpulens", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("field,value", [
    ("num_key_value_heads", "eight"), ("hidden_size", 1e400), ("num_key_value_heads", -8), ("head_dim", -128),
    ("tie_word_embeddings", "no"), ("num_hidden_layers", True), ("rope_theta", "fast"), ("vocab_size", 12.5),
])
def test_a_bad_config_field_is_named_and_refused(tmp_path, field, value):
    cfg = tmp_path / "config.json"
    # json.dumps writes 1e400 as Infinity, which Python's json reads back: the case the issue measured
    cfg.write_text(json.dumps({**BASE, field: value}))
    r = _gpulens("plan", "--model", str(cfg), "--workload", "train", "--gpu", "h100-sxm", "--batch", "1", "--seq", "1024")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and field in r.stderr


@pytest.mark.parametrize(("args", "says"), [
    # past what any number option takes (cli.value_checks, issue 27): refused while parsing, naming the option
    (("--workload", "train", "--batch", "10000000000000000000000000000000000"), "'--batch' / '-b': a 35-digit number is beyond"),
    (("--workload", "infer", "--target-rps", "nan"), "'--target-rps': nan is not a finite number"),
    # the planner's own ranges
    (("--workload", "infer", "--target-rps", "-5"), "must be between"),
    (("--workload", "train", "--gpus", "0"), "must be between"),
    (("--workload", "infer", "--new-tokens", "0"), "must be between"),
    # one range, said once: 0 passed the range ("between 0 and ...") and then failed "at least 1"
    (("--workload", "infer", "--prompt", "0"), "--prompt must be between 1 and"),
])
def test_absurd_numbers_are_refused(args, says):
    r = _gpulens("plan", "--model", "llama-3-8b", "--gpu", "h100-sxm", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and says in r.stderr


def test_a_good_config_still_plans(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**BASE, "tie_word_embeddings": False}))
    r = _gpulens("plan", "--model", str(cfg), "--workload", "train", "--gpu", "h100-sxm", "--batch", "1", "--seq", "1024")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(("text", "says"), [
    ("prices: [2.49]\n", "must be a mapping of GPU name to price"),
    ("prices: {h200: {hourly: two}}\n", "The hourly price of 'h200'"),
    ("prices: {h200: -1}\n", "not a number of 0 or more"),
    ("prices: {h200: {hourly: 1, purchase: .nan}}\n", "The purchase price of 'h200'"),
    ("gpus: {name: x}\n", "must be a list of cards"),
    ("gpus: [{name: lab, memory_gb: 1e400, bandwidth_gbps: 768}]\n", "'memory_gb' of GPU 'lab'"),
    ("gpus: [{name: lab, memory_gb: 48, bandwidth_gbps: 0, bf16_tflops: 155}]\n", "'bandwidth_gbps' of GPU 'lab'"),
    ("gpus: [{name: lab, memory_gb: -48, bandwidth_gbps: 768}]\n", "'memory_gb' of GPU 'lab'"),
    ("gpus: [{name: lab, memory_gb: 48, bandwidth_gbps: 768, bf16_tflops: .nan}]\n", "'bf16_tflops' of GPU 'lab'"),
    ("gpus: [{name: lab, memory_gb: 1e-300, bandwidth_gbps: 768, bf16_tflops: 155}]\n", "less than one byte"),
])
def test_a_bad_plan_config_is_one_sentence(isolated_plan_config, text, says):
    # Each once a traceback (AttributeError, ValueError, OverflowError, ZeroDivisionError) or a card of -48 GiB.
    isolated_plan_config.write_text(text)
    for args in (("plan", "gpus"), ("plan", "--model", "llama-3-8b", "--workload", "train", "--gpu", "h200", "--batch", "1")):
        r = _gpulens(*args)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "Traceback" not in r.stderr and says in r.stderr
