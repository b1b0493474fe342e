"""Speculative decoding (plan/speculative.py): Leviathan et al. 2023's expected tokens per step,
the draft and verification steps priced by serving_speed, the draft's memory, and the refusals."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gpulens.cli.main import main
from gpulens.plan import ServeSetup, find_gpu, plan_serving, preset
from gpulens.plan.serve import serving_memory, serving_speed, vllm_concurrency
from gpulens.plan.speculative import SpeculativeSetup, expected_tokens_per_step
from gpulens.plan.speed import Efficiency

EFF = Efficiency()
H200 = find_gpu("h200")
TARGET = preset("llama-3-70b")
DRAFT = preset("llama-3.2-1b")  # same 128,256-token vocabulary


def _setup(batch: int = 1, *, alpha: float = 0.8, k: int = 4, draft: bool = True) -> ServeSetup:
    spec = SpeculativeSetup(draft=DRAFT, acceptance_ratio=alpha, tokens=k) if draft else None
    return ServeSetup(batch=batch, runtime="vllm", tensor_parallel=4, speculative=spec)


def test_expected_tokens_per_step_matches_hand_values():
    assert expected_tokens_per_step(0.8, 4) == pytest.approx(3.3616, abs=1e-12)  # 1 + .8 + .64 + .512 + .4096
    assert expected_tokens_per_step(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens_per_step(0.6, 3) == pytest.approx((1 - 0.6**4) / 0.4)
    assert expected_tokens_per_step(1e-9, 5) == pytest.approx(1.0)  # nothing accepted: the target's own token


def test_tpot_is_the_step_over_the_expected_tokens():
    s = serving_speed(TARGET, _setup(), H200, EFF)
    sd = s.speculative
    assert sd is not None and sd.expected_new_tokens == pytest.approx(3.3616)
    assert sd.step_seconds == pytest.approx(4 * sd.draft_step_seconds + sd.verify_seconds)
    assert s.tpot_seconds == pytest.approx(sd.step_seconds / 3.3616)
    plain = serving_speed(TARGET, _setup(draft=False), H200, EFF)
    assert sd.plain_tpot_seconds == pytest.approx(plain.tpot_seconds)
    # the draft's step is the draft model's own decode step, the TTFT adds the draft's prefill
    assert sd.draft_step_seconds == pytest.approx(serving_speed(DRAFT, _setup(draft=False), H200, EFF).tpot_seconds)
    assert s.ttft_seconds == pytest.approx(plain.ttft_seconds + sd.draft_prefill_seconds)
    assert s.output_tokens_per_second > plain.output_tokens_per_second


def test_verification_costs_about_one_decode_step_at_batch_1():
    sd = serving_speed(TARGET, _setup(), H200, EFF).speculative
    assert sd is not None and sd.verify_bound == "memory"
    assert 1.0 <= sd.verify_seconds / sd.plain_tpot_seconds < 1.1


def test_speedup_above_1_at_batch_1_for_70b_with_a_1b_draft():
    sd = serving_speed(TARGET, _setup(), H200, EFF).speculative
    assert sd is not None
    assert sd.speedup_ratio > 1.5
    # the paper's bound: never more than E = 3.36 even with a free draft
    assert sd.speedup_ratio < expected_tokens_per_step(0.8, 4)


def test_speedup_shrinks_with_batch_and_drops_below_1_at_large_batch():
    ratios = {b: serving_speed(TARGET, _setup(b), H200, EFF).speculative.speedup_ratio  # type: ignore[union-attr]
              for b in (1, 4, 16, 64, 256, 1024)}
    values = list(ratios.values())
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))
    assert ratios[1] > 1 and ratios[1024] < 1
    big = serving_speed(TARGET, _setup(1024), H200, EFF).speculative
    assert big is not None and big.verify_bound == "compute"


def test_a_lower_acceptance_rate_speeds_up_less():
    lo = serving_speed(TARGET, _setup(alpha=0.5), H200, EFF).speculative
    hi = serving_speed(TARGET, _setup(alpha=0.9), H200, EFF).speculative
    assert lo is not None and hi is not None and lo.speedup_ratio < hi.speedup_ratio


def test_draft_weights_and_kv_cache_count_in_the_memory():
    plain = serving_memory(TARGET, _setup(draft=False), capacity_bytes=H200.memory_bytes, eff=EFF)
    spec = serving_memory(TARGET, _setup(), capacity_bytes=H200.memory_bytes, eff=EFF)
    assert "draft_weights" not in plain.breakdown
    assert spec.breakdown["draft_weights"] == pytest.approx(DRAFT.params * 2 / 4, rel=1e-6)  # bf16 over TP 4
    assert spec.breakdown["kv_cache"] == plain.breakdown["kv_cache"] - spec.breakdown["draft_weights"]
    # each sequence holds the draft's cache too (and K lookahead slots): fewer of them fit
    assert vllm_concurrency(TARGET, _setup(), H200.memory_bytes, EFF) < vllm_concurrency(
        TARGET, _setup(draft=False), H200.memory_bytes, EFF)


def test_a_draft_can_tip_the_fit_verdict():
    # llama-3-8b on an L4 (24 GB): its 16 GB of weights leave a small KV pool, and a 3B draft's
    # 6.4 GB of weights take all of it
    l4 = find_gpu("l4")
    base = ServeSetup(batch=1, runtime="vllm", prompt_tokens=4000, new_tokens=100)
    assert plan_serving(preset("llama-3-8b"), base, l4, EFF).memory.fits
    spec = replace(base, speculative=SpeculativeSetup(draft=preset("llama-3.2-3b"), acceptance_ratio=0.8))
    big = plan_serving(preset("llama-3-8b"), spec, l4, EFF).memory
    assert big.breakdown["draft_weights"] > 6e9 and not big.fits


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["plan", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


BASE = ("--model", "llama-3-70b", "--workload", "infer", "--gpu", "h200", "--gpus", "4", "--runtime", "vllm")


def test_json_carries_the_speculative_figures(capsys):
    rc, out, _ = run(capsys, *BASE, "--draft-model", "llama-3.2-1b", "--acceptance-rate", "0.8", "--format", "json")
    assert rc == 0
    d = json.loads(out)
    sd = d["speed"]["speculative"]
    assert sd["draft_model"] == "llama-3.2-1b" and sd["speculative_tokens"] == 4 and sd["acceptance_ratio"] == 0.8
    assert sd["expected_new_tokens"] == pytest.approx(3.3616) and sd["speedup_ratio"] > 1
    assert d["speed"]["tpot_seconds"] == pytest.approx(sd["tpot_seconds"])
    assert all("speculative_speedup_ratio" in r for r in d["speed"]["by_batch"])
    assert d["memory"]["breakdown"]["draft_weights"] > 0
    assert d["setup"]["draft_model"] == "llama-3.2-1b" and d["setup"]["acceptance_rate"] == 0.8
    assert any("acceptance rate of 0.8" in a["text"] and "compute-bound" in a["text"] for a in d["advice"])
    rc, out, _ = run(capsys, *BASE, "--format", "json")
    assert rc == 0 and "speculative" not in json.loads(out)["speed"]


def test_text_says_what_it_assumed(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    rc, out, err = run(capsys, *BASE, "--draft-model", "llama-3.2-1b", "--acceptance-rate", "0.7",
                       "--speculative-tokens", "5")
    assert rc == 0 and "Traceback" not in out + err
    assert "speculative decoding" in out and "K = 5" in out and "acceptance 0.7 (assumed)" in out
    assert "draft weights" in out and "speculation speed-up" in out


@pytest.mark.parametrize("extra,needle", [
    (["--speculative-tokens", "4"], "--speculative-tokens describes speculative decoding, and no --draft-model"),
    (["--acceptance-rate", "0.7"], "--acceptance-rate describes speculative decoding, and no --draft-model"),
    (["--draft-model", "llama-3.2-1b"], "--draft-model needs --acceptance-rate"),
    (["--draft-model", "llama-3.2-1b", "--acceptance-rate", "1"], "strictly between 0 and 1"),
    (["--draft-model", "llama-3.2-1b", "--acceptance-rate", "0"], "strictly between 0 and 1"),
    (["--draft-model", "llama-3.2-1b", "--acceptance-rate", "nan"], "--acceptance-rate"),
    (["--draft-model", "llama-3.2-1b", "--acceptance-rate", "0.7", "--speculative-tokens", "0"],
     "--speculative-tokens must be between 1 and 32"),
    (["--draft-model", "llama-2-7b", "--acceptance-rate", "0.7"], "vocabulary"),
    (["--draft-model", "llama-3.1-405b", "--acceptance-rate", "0.7"], "is not smaller than llama-3-70b"),
    (["--draft-model", "not-a-model", "--acceptance-rate", "0.7"], "--draft-model: Unknown model"),
    (["--draft-model", "llama-3.2-1b", "--acceptance-rate", "0.7", "--runtime", "hf"], "not hf"),
    (["--draft-model", "llama-3.2-1b", "--acceptance-rate", "0.7", "--runtime", "tgi"], "not tgi"),
    (["--draft-model", "llama-3.2-3b", "--acceptance-rate", "0.7", "--gpus", "16"],
     "The draft runs at the target's tensor parallelism 16"),
])
def test_bad_speculation_is_one_sentence_and_exit_2(capsys, extra, needle):
    rc, out, err = run(capsys, *BASE, *extra)
    assert rc == 2
    assert needle in err and "Traceback" not in err + out


def test_speculation_is_a_serving_option(capsys):
    rc, _, err = run(capsys, "--model", "llama-3-8b", "--gpu", "h100", "--draft-model", "llama-3.2-1b")
    assert rc == 2 and "--draft-model is a serving option" in err
