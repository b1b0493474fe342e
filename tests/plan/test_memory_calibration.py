"""The hard gate of issue #3: predicted peak memory against the real H200 measurements.

Every configuration of the bundled memory_calibration.jsonl (transformers eager, SDPA, one H200):
`memory.peak_bytes` within 10 % of `peak_alloc` in the median and 20 % at worst, and `fits` right
every time (status "oom" means it must not fit). No calibration is used: the defaults only.
"""

from __future__ import annotations

import json
import statistics

from gpulens.plan import PlanRequest, from_hf_config, plan


def _predict(row: dict) -> dict:
    model = from_hf_config({"model_type": "llama", **row["shapes"]}, name=row["model"])
    assert model.params == row["params"], "the parameter count must match what PyTorch counted"
    if row["kind"] == "train":
        req = PlanRequest(model=row["model"], workload="train", gpu="h200", precision=row["precision"],
                          optimizer=row["optimizer"], batch=row["batch"], seq=row["seq"], grad_ckpt=row["grad_ckpt"])
    else:
        req = PlanRequest(model=row["model"], workload="infer", gpu="h200", dtype=row["dtype"], batch=row["batch"],
                          prompt=row["prompt"], new_tokens=row["new_tokens"], runtime="hf")
    return plan(req, model=model).to_dict()


def test_peak_memory_within_10_percent_median_20_percent_worst(calibration_rows):
    errors = []
    for row in calibration_rows:
        if row["status"] != "ok":
            continue
        got = _predict(row)["memory"]["peak_bytes"]
        errors.append(abs(got / row["peak_alloc"] - 1))
    assert len(errors) >= 18
    assert statistics.median(errors) <= 0.10, errors
    assert max(errors) <= 0.20, errors


def test_fits_is_right_for_every_configuration(calibration_rows):
    for row in calibration_rows:
        fits = _predict(row)["fits"]
        assert fits is (row["status"] != "oom"), (row["model"], row.get("precision"), row["batch"])


def test_breakdown_sums_to_peak_and_names_the_mechanisms(calibration_rows):
    row = next(r for r in calibration_rows if r["kind"] == "train" and r["precision"] == "amp_bf16" and not r["grad_ckpt"])
    mem = _predict(row)["memory"]
    assert sum(mem["breakdown"].values()) == mem["peak_bytes"]
    for item in ("weights", "optimizer_states", "activations", "logits_and_loss", "autocast_weight_copies"):
        assert mem["breakdown"][item] > 0, item
    json.dumps(mem)  # plain JSON


def test_configurations_beyond_the_card_do_not_fit(calibration_rows):
    """The same shapes, pushed past 141 GB: fits must turn false (what status 'oom' would say)."""
    l8b = next(r for r in calibration_rows if r["model"] == "l8b" and r["kind"] == "train")
    big = dict(l8b, precision="amp_bf16", batch=8, seq=4096, grad_ckpt=False, status="oom")
    out = _predict(big)
    assert out["fits"] is False
    assert out["memory"]["peak_bytes"] > 150e9
    assert out["advice"] and out["advice"][0]["kind"] == "fix"
