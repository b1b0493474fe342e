"""Serving speed by runtime: an engine's decode is the bytes it reads (for a MoE only the experts
the batch touches) at the engine's share of the bandwidth; calibration of one runtime never
changes another's factors."""

from __future__ import annotations

import json

import pytest

from gpulens.data import bundled_trace
from gpulens.plan import PlanRequest, ServeSetup, find_gpu, plan, preset
from gpulens.plan.calibration import calibrate, fit, parse_measurement
from gpulens.plan.serve import decode_weight_bytes, expected_experts_touched, serving_speed
from gpulens.plan.speed import RUNTIME_DEFAULTS, Efficiency

CALIBRATION_FILE = bundled_trace() / "memory_calibration.jsonl"


def _vllm(model: str, batch: int = 1) -> dict:
    return plan(PlanRequest(model=model, workload="infer", gpu="h100-sxm", runtime="vllm", batch=batch)).speed


def test_llama_3_8b_on_h100_decodes_near_the_bandwidth_bound():
    tpot = _vllm("llama-3-8b")["tpot_seconds"]
    assert 0.005 <= tpot <= 0.010
    m, gpu = preset("llama-3-8b"), find_gpu("h100-sxm")
    bound = decode_weight_bytes(m, "bf16", 1) / gpu.memory_bandwidth_bytes_per_second  # 15.0 GB / 3.35 TB/s
    assert bound == pytest.approx(4.48e-3, rel=0.02)
    assert tpot > bound  # never faster than reading the weights at the datasheet bandwidth


def test_a_moe_reads_only_the_experts_its_tokens_touch():
    assert _vllm("qwen3-30b-a3b")["tpot_seconds"] < _vllm("llama-3-8b")["tpot_seconds"]
    m = preset("qwen3-30b-a3b")  # 128 experts, 8 per token
    one = decode_weight_bytes(m, "bf16", 1)
    assert one == pytest.approx(2 * m.active_params - 2 * m.vocab_size * m.hidden_size, rel=0.01)
    assert decode_weight_bytes(m, "bf16", 256) == pytest.approx(2 * m.params - 2 * m.vocab_size * m.hidden_size, rel=0.01)


def test_expected_distinct_experts():
    assert expected_experts_touched(128, 8, 1) == pytest.approx(8)
    assert expected_experts_touched(8, 2, 2) == pytest.approx(8 * (1 - 0.75 ** 2))  # Mixtral, 2 tokens: 3.5
    assert expected_experts_touched(128, 8, 10_000) == pytest.approx(128)


def test_engines_are_faster_than_eager_generate_per_token():
    m, gpu = preset("llama-3-8b"), find_gpu("h100-sxm")
    hf = serving_speed(m, ServeSetup(runtime="hf"), gpu, Efficiency())
    for rt in ("vllm", "sglang", "tgi"):
        assert serving_speed(m, ServeSetup(runtime=rt), gpu, Efficiency()).tpot_seconds < hf.tpot_seconds / 2


def test_calibrating_on_hf_runs_leaves_the_engines_alone():
    gpu = find_gpu("h200")
    before = plan(PlanRequest(model="llama-3-8b", workload="infer", gpu="h200", runtime="vllm")).speed
    calibrate(CALIBRATION_FILE, gpu_name="h200")  # HF-eager runs only
    res = plan(PlanRequest(model="llama-3-8b", workload="infer", gpu="h200", runtime="vllm"))
    assert res.efficiency.calibrated and set(res.efficiency.runtimes) == {"hf"}
    assert res.speed["tpot_seconds"] == pytest.approx(before["tpot_seconds"])
    assert res.speed["ttft_seconds"] == pytest.approx(before["ttft_seconds"])
    assert res.speed["efficiency_source"] == RUNTIME_DEFAULTS["vllm"].source
    hf = plan(PlanRequest(model="llama-3-8b", workload="infer", gpu="h200", runtime="hf"))
    assert "hf factors calibrated" in hf.speed["efficiency_source"]
    assert gpu.name == "H200"


def test_a_vllm_fit_leaves_hf_alone():
    row = json.loads(next(line for line in CALIBRATION_FILE.read_text().splitlines() if '"infer"' in line))
    m = parse_measurement(row | {"runtime": "vllm", "decode_token_s_median": 0.004, "prefill_s": 0.01}, where="t")
    eff = fit([m], find_gpu("h200")).efficiency
    assert set(eff.runtimes) == {"vllm"}
    assert eff.runtime("hf") == RUNTIME_DEFAULTS["hf"]
    assert eff.runtime("sglang") == RUNTIME_DEFAULTS["sglang"]  # another engine: not carried over either
    stored = Efficiency.from_dict(json.loads(json.dumps(eff.to_dict())))
    assert stored.runtime("vllm") == eff.runtime("vllm")


def test_compare_prices_an_engine_at_a_batch_that_fits():
    """The KV pool at batch 1 holds a few sequences more than at a large batch (the engine's
    activations grow with it): the batch compare picks must fit."""
    from gpulens.plan import compare

    (res,) = compare(PlanRequest(model="llama-3-8b", workload="infer", runtime="vllm", batch=1), ["h100-sxm"],
                     batch_given=False).results
    assert res.fits and res.request.batch > 1
    assert res.request.batch <= res.speed["max_batch_that_fits"]


def test_a_calibration_file_from_before_per_runtime_factors_still_loads(tmp_path):
    from gpulens.plan.calibration import load_efficiency

    old = {"version": 1, "gpus": {"H200": {"compute_ratio": 0.7, "decode_token_overhead_seconds": 0.05,
                                           "prefill_overhead_seconds": 0.06, "source": "calibrated long ago"}}}
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(old))
    eff = load_efficiency(find_gpu("h200"), path=path)
    assert eff.compute_ratio == 0.7 and eff.calibrated
    assert eff.runtime("hf") == RUNTIME_DEFAULTS["hf"]  # the old shared serving factors are not carried over


def test_gemma_2_9b_training_counts_its_eager_attention_scores():
    res = plan(PlanRequest(model="gemma-2-9b", workload="train", batch=1, seq=4096, gpus=8, zero=3))
    # 42 layers x 16 heads x 4096^2 scores x 8 bytes = 90 GB the SDPA reading missed
    assert res.memory.breakdown["activations"] > 90e9 and not res.fits
    assert any("eager attention" in n for n in res.notes)
