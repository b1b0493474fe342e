"""An engine's replica plan under load (plan/scheduling.py): continuous batching with chunked
prefill, the M/D/1 prefill queue, and the filed case (8 x L40S planned where two serve)."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from dataclasses import replace

import pytest

from gpulens.cli.main import main
from gpulens.plan.advice import BATCH_PREFILL, replica_options
from gpulens.plan.catalog import find_gpu
from gpulens.plan.models import preset
from gpulens.plan.scheduling import StepCosts, engine_step_costs, replica_capacity, under_load
from gpulens.plan.serve import VLLM_MAX_BATCHED_TOKENS, ServeSetup, max_batch_that_fits, serving_speed
from gpulens.plan.speed import Efficiency

M = "llama-3-8b"
SETUP = ServeSetup(prompt_tokens=2000, new_tokens=256, runtime="vllm")


def _costs(setup: ServeSetup = SETUP, gpu: str = "l40s") -> StepCosts:
    return engine_step_costs(preset(M), setup, find_gpu(gpu), Efficiency())


def _load(rate: float, costs: StepCosts | None = None, *, budget: int = VLLM_MAX_BATCHED_TOKENS, prompt: int = 2000):
    return under_load(costs or _costs(), prompt_tokens=prompt, new_tokens=256, arrival_rate_per_second=rate,
                      step_budget_tokens=budget)


def test_at_near_zero_load_ttft_is_one_requests_prefill_and_tpot_the_batch_1_step():
    g = find_gpu("l40s")
    alone = serving_speed(preset(M), SETUP, g, Efficiency())
    r = _load(1e-9)
    assert r.stable and r.prefill_steps == 1 and r.queue_wait_seconds < 1e-9
    assert r.ttft_seconds == pytest.approx(alone.ttft_seconds, rel=1e-6)
    assert r.tpot_seconds == pytest.approx(alone.tpot_seconds, rel=1e-6)


def test_a_prompt_longer_than_the_budget_is_prefilled_in_chunks():
    """ceil(P / budget) steps, each paying the forward's fixed cost once, plus the prompt's compute."""
    c = _costs()
    r = _load(1e-9, budget=512)
    assert r.prefill_steps == math.ceil(2000 / 512) == 4
    chunked = 4 * c.step_fixed_seconds + 2000 * c.prefill_seconds_per_token
    assert r.ttft_seconds == pytest.approx(chunked, rel=1e-6)
    assert r.ttft_seconds > _load(1e-9).ttft_seconds


def test_ttft_grows_with_the_rate_and_diverges_toward_utilization_1():
    c = _costs()
    cap = replica_capacity(c, prompt_tokens=2000, new_tokens=256, step_budget_tokens=VLLM_MAX_BATCHED_TOKENS,
                           ttft_slo_s=None, tpot_slo_s=None, max_concurrent=math.inf)
    assert cap.bound_by == "utilization" and cap.at_capacity.utilization_ratio > 0.98
    rates = [cap.requests_per_second * f for f in (0.01, 0.2, 0.4, 0.6, 0.8, 0.95, 0.999)]
    runs = [_load(x, c) for x in rates]
    assert all(r.stable for r in runs)
    for a, b in itertools.pairwise(runs):
        assert b.ttft_seconds > a.ttft_seconds and b.utilization_ratio > a.utilization_ratio
        assert b.tpot_seconds >= a.tpot_seconds and b.concurrent_requests > a.concurrent_requests
    # toward rho -> 1 the M/D/1 wait, rho S / 2 (1 - rho), diverges: it dwarfs the request's own prefill
    assert runs[-1].queue_wait_seconds > 50 * runs[4].queue_wait_seconds
    edge = cap.at_capacity
    assert edge.stable and edge.queue_wait_seconds > 100 * edge.prefill_seconds
    beyond = _load(cap.requests_per_second * 1.05, c)
    assert not beyond.stable and math.isinf(beyond.ttft_seconds) and beyond.unstable_reason


def test_the_queue_wait_is_m_d_1():
    """With a decode step that does not grow with the batch, the fixed point is closed-form: check
    the mixed step, rho and the Pollaczek-Khinchine wait for deterministic service by hand."""
    c = StepCosts(decode_step_seconds=lambda b: 0.02, prefill_seconds_per_token=1e-4, step_fixed_seconds=0.005)
    lam, p, k, budget = 3.0, 1000, 100, 4096
    r = under_load(c, prompt_tokens=p, new_tokens=k, arrival_rate_per_second=lam, step_budget_tokens=budget)
    step = 0.02 / (1 - lam * p * 1e-4)
    assert r.tpot_seconds == pytest.approx(step)
    decoding = lam * (k - 1) * step
    assert r.decoding_sequences == pytest.approx(decoding)
    service = p / (budget - decoding) * (0.02 + (budget - decoding) * 1e-4)
    rho = lam * service
    assert r.utilization_ratio == pytest.approx(rho)
    assert r.queue_wait_seconds == pytest.approx(rho * service / (2 * (1 - rho)))


def test_the_filed_case_llama_3_8b_on_l40s_needs_two_gpus_not_eight():
    """4 requests/s of 2,000-token prompts and 256 new tokens, TTFT <= 1 s, on vLLM: the static-batch
    model (every batch prefilled at once, gpulens at 85df188) planned 8 x TP1 = 8 L40S; with
    continuous batching one L40S serves ~2.6 requests/s within the target, so 2 x TP1 = 2."""
    opts = replica_options(preset(M), SETUP, [find_gpu("l40s")], {}, target_rps=4, tpot_slo_s=None, ttft_slo_s=1.0)
    best = min(opts, key=lambda o: o.gpus)
    assert (best.replicas, best.tensor_parallel, best.gpus) == (2, 1, 2)
    assert best.ttft_seconds <= 1.0 and best.replicas * best.requests_per_second_per_replica >= 4
    assert 0 < best.utilization_ratio < 1
    assert "continuous batching, chunked prefill budget 8,192 tokens, M/D/1 queue, utilization" in best.scheduling
    # the plan's mean requests in flight stay within the replica's KV pool
    g = find_gpu("l40s")
    assert best.batch <= max_batch_that_fits(preset(M), SETUP, g.memory_bytes, Efficiency())


def test_hf_replica_plans_are_unchanged():
    """hf prefills whole batches; its figures as gpulens gave them before this model (85df188), with
    NCCL moving 24 of PCIe Gen4's 32 GB/s (plan/links.py) since: TP 4 at batch 8 (TTFT 0.48 s at the
    line rate) now misses the 0.5 s target, so TP 4 runs batch 4 on 8 replicas."""
    hf = replace(SETUP, prompt_tokens=1000, new_tokens=200, runtime="hf")
    opts = replica_options(preset(M), hf, [find_gpu("l40s")], {}, target_rps=5, tpot_slo_s=None, ttft_slo_s=0.5)
    got = [(o.replicas, o.tensor_parallel, o.gpus, o.batch, o.bound_by, round(o.ttft_seconds, 6)) for o in opts]
    assert got == [(11, 2, 22, 4, "TTFT", 0.366514), (29, 1, 29, 2, "TTFT", 0.277865), (8, 4, 32, 4, "TTFT", 0.280031),
                   (4, 8, 32, 8, "TTFT", 0.457712)]
    assert all(o.utilization_ratio is None and o.scheduling == BATCH_PREFILL for o in opts)


def test_a_smaller_budget_takes_more_steps_per_prompt_and_lowers_capacity():
    caps = [replica_capacity(_costs(), prompt_tokens=2000, new_tokens=256, step_budget_tokens=b, ttft_slo_s=1.0,
                             tpot_slo_s=None, max_concurrent=math.inf).requests_per_second for b in (256, 8192)]
    assert 0 < caps[0] < caps[1]


def test_the_plan_names_its_model_in_json_and_text(capsys):
    argv = ["plan", "compare", "--model", M, "--workload", "infer", "--runtime", "vllm", "--prompt", "2000",
            "--new-tokens", "256", "--gpu", "l40s", "--target-rps", "4", "--ttft-target", "1s",
            "--prefill-chunk-tokens", "2048"]
    assert main([*argv, "--format", "json"]) == 0
    best = json.loads(capsys.readouterr().out)["results"][0]["replicas"][0]
    assert "chunked prefill budget 2,048 tokens, M/D/1 queue" in best["scheduling"]
    assert 0 < best["utilization_ratio"] < 1 and best["queue_wait_seconds"] >= 0
    assert main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"{best['utilization_ratio'] * 100:.0f} %" in text and "M/D/1 queue" in text


@pytest.mark.parametrize(("extra", "says"), [
    (("--runtime", "vllm", "--prefill-chunk-tokens", "0"), "--prefill-chunk-tokens must be between 1"),
    (("--runtime", "vllm", "--prefill-chunk-tokens", "-512"), "--prefill-chunk-tokens must be between 1"),
    (("--prefill-chunk-tokens", "512"), "--runtime hf prefills whole batches"),
])
def test_a_bad_chunk_budget_is_one_sentence_and_exit_2(extra, says):
    r = subprocess.run([sys.executable, "-m", "gpulens", "plan", "--model", M, "--workload", "infer", "--gpu", "l40s",
                        "--target-rps", "4", *extra], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and says in r.stderr
