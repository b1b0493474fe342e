"""Planner accuracy on the recorded H200 runs, each figure beside a reference computed in the same run.

- peak memory: gpulens's median error against the usual calculator rule (weights x a per-optimizer
  multiplier, activations ignored: 16 bytes/parameter for mixed-precision Adam, 8 for bf16 Adam, 4 for
  SGD in bf16, as in the ZeRO paper's accounting);
- training tokens/s: worst leave-one-out error after calibration against the uncalibrated defaults.
"""

from __future__ import annotations

import json
import statistics


def _rows() -> list[dict]:
    from gpulens.data import bundled_trace

    path = bundled_trace() / "memory_calibration.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _naive_bytes(row: dict) -> float:
    n = row["params"]
    if row["kind"] == "infer":
        return 2 * n
    per = {("adamw", "fp32"): 16, ("adamw", "amp_bf16"): 16, ("adamw", "bf16"): 8, ("sgd", "bf16"): 4}
    return per.get((row["optimizer"], row["precision"]), 16) * n


def run() -> list[dict]:
    from gpulens.plan import PlanRequest, find_gpu, from_hf_config, plan
    from gpulens.plan.calibration import fit, load_measurements
    from gpulens.plan.speed import Efficiency, training_speed

    rows = _rows()
    ours, naive = [], []
    for r in rows:
        m = from_hf_config({"model_type": "llama", **r["shapes"]}, name=r["model"])
        if r["kind"] == "train":
            req = PlanRequest(model=r["model"], workload="train", gpu="h200", precision=r["precision"],
                              optimizer=r["optimizer"], batch=r["batch"], seq=r["seq"], grad_ckpt=r["grad_ckpt"])
        else:
            req = PlanRequest(model=r["model"], workload="infer", gpu="h200", dtype=r["dtype"], batch=r["batch"],
                              prompt=r["prompt"], new_tokens=r["new_tokens"])
        pred = plan(req, model=m).memory.peak_bytes
        ours.append(abs(pred / r["peak_alloc"] - 1))
        naive.append(abs(_naive_bytes(r) / r["peak_alloc"] - 1))
    mem_ours, mem_naive = statistics.median(ours), statistics.median(naive)

    from gpulens.data import bundled_trace

    ms = load_measurements(bundled_trace() / "memory_calibration.jsonl")
    gpu = find_gpu("h200")
    loo, default = [], []
    for held in [m for m in ms if m.kind == "train"]:
        eff = fit([m for m in ms if m is not held], gpu).efficiency
        got = training_speed(held.model, held.train_setup(), gpu, eff).tokens_per_second
        loo.append(abs(got / held.tokens_per_s - 1))
        d = training_speed(held.model, held.train_setup(), gpu, Efficiency()).tokens_per_second
        default.append(abs(d / held.tokens_per_s - 1))
    return [
        {"name": "peak memory median error (H200 runs)", "value": mem_ours * 100, "unit": "%",
         "reference": "weights x optimizer multiplier rule", "reference_value": mem_naive * 100,
         "ratio": mem_ours / mem_naive if mem_naive else None, "goal": "<= 10 % median, far below the rule",
         "met": mem_ours <= 0.10 and mem_ours < mem_naive},
        {"name": "peak memory worst error (H200 runs)", "value": max(ours) * 100, "unit": "%",
         "reference": "weights x optimizer multiplier rule", "reference_value": max(naive) * 100,
         "ratio": max(ours) / max(naive), "goal": "<= 20 % worst", "met": max(ours) <= 0.20},
        {"name": "training tokens/s worst leave-one-out error after calibration", "value": max(loo) * 100, "unit": "%",
         "reference": "uncalibrated defaults", "reference_value": max(default) * 100,
         "ratio": max(loo) / max(default), "goal": "<= 30 %", "met": max(loo) <= 0.30},
    ]


if __name__ == "__main__":
    for r in run():
        print(r)
