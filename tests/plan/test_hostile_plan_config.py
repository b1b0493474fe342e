"""A user's plan.yaml with values a card cannot have (a hostile-input pass over `gpulens plan`):
one sentence naming the field, exit 2, never a traceback or a plan on an impossible card."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _plan(tmp_path, yaml_text: str, *args: str) -> subprocess.CompletedProcess:
    cfg = tmp_path / "plan.yaml"
    cfg.write_text(yaml_text)
    return subprocess.run([sys.executable, "-m", "gpulens", "plan", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "GPULENS_PLAN_CONFIG": str(cfg)})


@pytest.mark.parametrize("figure", [
    "memory_gb: 1e308, bandwidth_gbps: 900",  # int(inf): an OverflowError traceback before
    "memory_mib: 1e300, bandwidth_gbps: 900",  # a card of 1e300 MiB, planned as fitting
    "memory_gb: 48, bandwidth_gbps: 1.0e+308",  # a memory-bound decode of 0 s
])
def test_a_card_figure_beyond_any_card_is_refused(tmp_path, figure):
    r = _plan(tmp_path, f"gpus:\n  - {{name: mycard, bf16_tflops: 100, {figure}}}\n",
              "--model", "llama-3-8b", "--workload", "infer", "--gpu", "mycard")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "beyond any card's figure" in r.stderr


@pytest.mark.parametrize("field", ["aliases", "sources", "nvml_names"])
def test_a_card_name_list_that_is_a_number_is_refused(tmp_path, field):
    # a TypeError traceback ('int' object is not iterable) before
    r = _plan(tmp_path, f"gpus:\n  - {{name: mycard, memory_gb: 48, bandwidth_gbps: 900, bf16_tflops: 100, {field}: 5}}\n",
              "--model", "llama-3-8b", "--gpu", "mycard")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and f"'{field}'" in r.stderr and "not a list of names" in r.stderr


def test_one_alias_written_as_a_string_is_one_name(tmp_path):
    # `aliases: my-card` was split into the aliases m, y, -, c, a, r, d
    r = _plan(tmp_path, "gpus:\n  - {name: mycard, memory_gb: 48, bandwidth_gbps: 900, bf16_tflops: 100, aliases: my-card}\n",
              "--model", "llama-3-8b", "--gpu", "my-card")
    assert r.returncode == 0, r.stdout + r.stderr
    r = _plan(tmp_path, "gpus:\n  - {name: mycard, memory_gb: 48, bandwidth_gbps: 900, bf16_tflops: 100, aliases: my-card}\n",
              "--model", "llama-3-8b", "--gpu", "y")
    assert r.returncode == 2 and "Unknown GPU 'y'" in r.stderr, r.stdout + r.stderr


def test_a_price_key_that_is_neither_hourly_nor_purchase_is_refused(tmp_path):
    # `hourli: 2` was dropped without a word and the plan said the card had no price
    r = _plan(tmp_path, "prices:\n  h100-sxm: {hourli: 2}\n", "--model", "llama-3-8b", "--gpu", "h100-sxm")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "'hourli'" in r.stderr


@pytest.mark.parametrize("yaml_text", [
    "gpus:\n  - {name: mycard, memory_gb: 48, bandwidth_gbps: 900, bf16_tflops: 100}\n"
    "  - {name: MyCard, memory_gb: 8, bandwidth_gbps: 900, bf16_tflops: 100}\n",
    "prices:\n  h100-sxm: 2\n  H100 SXM: 5\n",
])
def test_one_name_given_twice_is_refused(tmp_path, yaml_text):
    # the last card or price under a name won without a word
    r = _plan(tmp_path, yaml_text, "--model", "llama-3-8b", "--gpu", "h100-sxm")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "twice" in r.stderr


@pytest.mark.parametrize(("entry", "says"), [
    ("h100", "is 'h100', not a card's fields"),  # was "has a non-numeric size or bandwidth"
    ("null", "is empty, not a card's fields"),
    ("{name: '', memory_gb: 48, bandwidth_gbps: 900, bf16_tflops: 100}", "has the name ''"),  # a card named ''
    ("{name: [1, 2], memory_gb: 48, bandwidth_gbps: 900, bf16_tflops: 100}", "has the name '[1, 2]'"),  # named "[1, 2]"
])
def test_a_card_entry_that_is_no_card_is_refused_for_what_it_is(tmp_path, entry, says):
    r = _plan(tmp_path, f"gpus:\n  - {entry}\n", "gpus")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and says in r.stderr


@pytest.mark.parametrize("value", ["[1]", "5", "''", "a-currency-name-too-long"])
def test_a_currency_that_is_no_short_name_is_refused(tmp_path, value):
    # [1] had been shown beside every price as text
    r = _plan(tmp_path, f"currency: {value}\nprices: {{h100-sxm: 2.49}}\n", "--model", "llama-3-8b", "--gpu", "h100")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "currency" in r.stderr


def test_a_currency_name_is_shown_beside_the_price(tmp_path):
    r = _plan(tmp_path, "currency: EUR\nprices: {h100-sxm: 2.49}\n", "--model", "llama-3-8b", "--gpu", "h100",
              "--format", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert '"EUR"' in r.stdout


def test_a_price_written_with_an_exponent_is_a_number(tmp_path):
    # YAML 1.1 (PyYAML) reads 3e4 as text: such a price was refused as "not a number"
    r = _plan(tmp_path, "prices:\n  h100-sxm: {hourly: 2.5e0, purchase: 3e4}\n", "--model", "llama-3-8b", "--gpu", "h100",
              "--format", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert '"purchase_per_gpu": 30000.0' in r.stdout and '"hourly_per_gpu": 2.5' in r.stdout
