"""config.json values that pass each field's own check but overflow the planner's arithmetic
(a hostile-input pass over `gpulens plan`): one sentence and exit 2, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

BASE = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192}


def _plan(cfg: dict, tmp_path, workload: str = "infer") -> subprocess.CompletedProcess:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return subprocess.run([sys.executable, "-m", "gpulens", "plan", "--model", str(path), "--workload", workload],
                          capture_output=True, text=True, timeout=60)


def test_an_mpt_expansion_ratio_that_overflows_is_refused(tmp_path):
    # d_model x expansion_ratio 1e300 is a finite float but an MLP width past any float product: an
    # OverflowError traceback (exit 1) before
    r = _plan({"model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32, "vocab_size": 50432,
               "expansion_ratio": 1e300}, tmp_path, "train")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "'expansion_ratio'" in r.stderr and "limit" in r.stderr


def test_a_rope_scaling_factor_that_overflows_is_refused(tmp_path):
    # 8192 x 1e308 is infinite: int(inf) raised an OverflowError traceback (exit 1) before
    r = _plan({**BASE, "rope_scaling": {"type": "linear", "factor": 1e308}}, tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "rope_scaling.factor" in r.stderr


def test_a_rope_scaling_original_length_that_is_no_number_is_refused(tmp_path):
    # int('abc') raised a ValueError traceback (exit 1) before
    r = _plan({**BASE, "rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": "abc"}},
              tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "rope_scaling.original_max_position_embeddings" in r.stderr


def test_a_hidden_size_the_heads_do_not_divide_is_refused(tmp_path):
    # 4095 over 32 heads was planned at a head width of 127 (4064 of the 4095 columns)
    r = _plan({**BASE, "hidden_size": 4095}, tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "not a multiple of num_attention_heads" in r.stderr


def test_an_explicit_head_dim_still_allows_any_hidden_size(tmp_path):
    r = _plan({**BASE, "hidden_size": 4095, "head_dim": 128}, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_zero_key_value_heads_is_refused(tmp_path):
    # num_key_value_heads 0 was read as "not given": a multi-head KV cache 4x the config's GQA one
    r = _plan({**BASE, "num_key_value_heads": 0}, tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "'num_key_value_heads'" in r.stderr


def test_a_field_given_twice_is_refused(tmp_path):
    # json keeps the last of two values: {"vocab_size": 128256, ..., "vocab_size": 1} was planned with 1
    path = tmp_path / "config.json"
    path.write_text(json.dumps(BASE)[:-1] + ', "vocab_size": 1}')
    r = subprocess.run([sys.executable, "-m", "gpulens", "plan", "--model", str(path)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "'vocab_size' twice" in r.stderr


@pytest.mark.parametrize("field", ["max_position_embeddings", "max_seq_len"])
def test_a_context_of_zero_tokens_is_refused(tmp_path, field):
    # 0 had been read as "not given": no context limit (llama) or the family's default (MPT's 2048)
    cfg = ({**BASE, field: 0} if field == "max_position_embeddings" else
           {"model_type": "mpt", "d_model": 2048, "n_heads": 16, "n_layers": 24, "vocab_size": 50432, field: 0})
    r = _plan(cfg, tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and f"'{field}'" in r.stderr and "0 tokens" in r.stderr


@pytest.mark.parametrize("factor", ["x", -2, 0, True])
def test_a_rope_scaling_factor_that_is_no_positive_number_is_refused(tmp_path, factor):
    # 'x' had been ignored: the context planned as if the config had no scaling
    r = _plan({**BASE, "rope_scaling": {"type": "linear", "factor": factor}}, tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "rope_scaling.factor" in r.stderr and "above 0" in r.stderr


def test_a_rope_scaling_without_a_factor_still_plans(tmp_path):
    r = _plan({**BASE, "rope_scaling": {"type": "dynamic"}}, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
