"""Advice: the fixes in order with the memory each reaches; replicas x TP; costs at the user's prices."""

from __future__ import annotations

import pytest
import yaml

from gpulens.plan import PlanRequest, compare, plan
from gpulens.plan.cost import break_even_months


def test_training_fixes_are_ordered_cumulative_and_end_fitting():
    res = plan(PlanRequest(model="llama-3-8b", workload="train", gpu="h100-sxm", batch=4, seq=4096))
    assert not res.fits
    fixes = [a for a in res.advice if a.kind == "fix"]
    assert fixes[0].change == {"grad_ckpt": True}
    peaks = [f.peak_bytes for f in fixes]
    assert peaks == sorted(peaks, reverse=True) and peaks[0] < res.memory.peak_bytes
    assert fixes[-1].fits and not any(f.fits for f in fixes[:-1])


def test_sharding_is_offered_when_one_card_cannot_hold_the_states():
    res = plan(PlanRequest(model="llama-3-70b", workload="train", gpu="h100-sxm", batch=1, seq=2048))
    fixes = [a for a in res.advice if a.kind == "fix"]
    assert any(f.change.get("zero") == 3 and f.fits for f in fixes)
    assert not any("tensor_parallel" in f.change for f in fixes if f.fits)


def test_tensor_parallelism_only_when_the_weights_do_not_fit():
    big = plan(PlanRequest(model="llama-3-70b", workload="infer", gpu="l40s", batch=1, prompt=512, new_tokens=64))
    kinds = [a.change for a in big.advice if a.kind == "fix"]
    assert kinds[0].get("dtype") in ("fp8", "int8", "int4")  # quantize first
    small = plan(PlanRequest(model="llama-3-8b", workload="infer", gpu="l4", batch=64, prompt=4096, new_tokens=256))
    assert not small.fits
    assert not any("tensor_parallel" in a.change for a in small.advice)


def test_fitting_plan_gets_tips_not_fixes():
    res = plan(PlanRequest(model="llama-3.2-1b", workload="train", gpu="h200", batch=1, seq=1024))
    assert res.fits
    assert all(a.kind != "fix" for a in res.advice)
    assert any("micro-batch up to" in a.text for a in res.advice)


def test_costs_only_with_user_prices(isolated_plan_config):
    no_price = plan(PlanRequest(model="llama-3-8b", workload="infer", gpu="h100-sxm", runtime="vllm", batch=32))
    assert no_price.cost is None and any("No price" in n for n in no_price.notes)
    isolated_plan_config.write_text(yaml.safe_dump({"prices": {"h100-sxm": {"hourly": 2.0, "purchase": 25000}}}))
    res = plan(PlanRequest(model="llama-3-8b", workload="infer", gpu="h100-sxm", runtime="vllm", batch=32))
    c = res.cost
    tps, rps = res.speed["output_tokens_per_second"], res.speed["requests_per_second"]
    assert c.per_million_tokens == pytest.approx(2.0 / 3600 / tps * 1e6)
    assert c.per_thousand_requests == pytest.approx(2.0 / 3600 / rps * 1e3)
    assert c.break_even_months == pytest.approx(25000 / (2.0 * 730))
    assert break_even_months(None, 1000) is None


def test_replicas_for_a_target_rate_under_an_slo(isolated_plan_config):
    isolated_plan_config.write_text(yaml.safe_dump({"prices": {"h100-sxm": 2.0}}))
    res = plan(PlanRequest(model="llama-3-70b", workload="infer", gpu="h100-sxm", runtime="vllm", dtype="fp8",
                           prompt=1000, new_tokens=200, target_requests_per_second=20, tpot_target_seconds=0.05))
    assert res.replicas
    best = res.replicas[0]
    assert best.gpus == best.replicas * best.tensor_parallel
    assert best.replicas * best.requests_per_second_per_replica >= 20
    assert best.tpot_seconds <= 0.05
    assert best.hourly_total == pytest.approx(2.0 * best.gpus)
    costs = [o.hourly_total for o in res.replicas]
    assert costs == sorted(costs)


def test_compare_puts_gpus_side_by_side():
    rs = compare(PlanRequest(model="qwen2.5-7b", workload="train", batch=2, seq=2048, grad_ckpt=True),
                 ["a100-80gb", "h100-sxm", "H200"]).results
    assert [r.gpu.name for r in rs] == ["A100-80GB", "H100-SXM", "H200"]
    assert rs[0].speed["tokens_per_second"] < rs[1].speed["tokens_per_second"]
    assert len({r.memory.peak_bytes for r in rs}) == 1  # same model, same setup: same bytes


def test_compare_leaves_out_a_gpu_without_the_format_and_says_why(capsys):
    """FP8 serving on an A100 and an H100: the A100 has no FP8, so it is left out with the reason
    and the H100 is still compared; with only cards lacking the format the comparison refuses."""
    from gpulens.cli.main import main

    c = compare(PlanRequest(model="llama-3-8b", workload="infer", dtype="fp8", runtime="vllm"), ["a100-80gb", "h100-sxm"])
    assert [r.gpu.name for r in c.results] == ["H100-SXM"]
    assert [x.gpu for x in c.left_out] == ["A100-80GB"] and "FP8" in c.left_out[0].reason
    assert main(["plan", "compare", "--model", "llama-3-8b", "--workload", "infer", "--dtype", "fp8",
                 "-g", "a100-80gb,h100-sxm"]) == 0
    out = capsys.readouterr().out
    assert "H100-SXM" in out and "Left out A100-80GB" in out and "FP8" in out
    assert main(["plan", "compare", "--model", "llama-3-8b", "--workload", "infer", "--dtype", "fp8",
                 "-g", "a100-80gb,a100-40gb"]) == 2
