"""Planner accuracy on the recorded H200 runs, each figure beside a reference computed in the same run.

- peak memory: gpulens's median error against the usual calculator rule (weights x a per-optimizer
  multiplier, activations ignored: 16 bytes/parameter for mixed-precision Adam, 8 for bf16 Adam, 4 for
  SGD in bf16, as in the ZeRO paper's accounting);
- leave-one-out (fit on all runs but one, predict the one left out) of training step time, HF
  decode TPOT, prefill and peak memory after calibration, beside the uncalibrated defaults' errors;
- serving-engine decode: Llama-3-8B and Qwen3-30B-A3B batch 1 on H100 SXM under --runtime vllm;
- published figures (`gpulens/plan/data/published_figures.jsonl`): median and worst |error| per
  kind, all figures and the held-out ones, beside the issue's bound (`python -m
  gpulens.plan.published` prints the same table). A kind that misses its bound is a missed goal
  (`met` False, so `make bench` exits 1), also while it is a known miss (xfail in
  tests/plan/test_published_figures.py): the bench says what is true, not what is expected.
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
    from gpulens.plan.calibration import leave_one_out_by_figure, load_measurements

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
    checks = {(c.figure, c.scope): c for c in leave_one_out_by_figure(ms, gpu)}
    loo_rows = []
    # the targets for calibration on unseen runs: (median, worst) relative error
    targets = {("train_step", "train"): ("training step time", 0.08, 0.15),
               ("decode_tpot", "hf"): ("HF decode TPOT", 0.10, 0.20),
               ("prefill", "hf"): ("HF prefill time", 0.12, 0.25),
               ("peak_memory", "train"): ("training peak memory", 0.01, 0.07)}
    for key, (what, med_goal, worst_goal) in targets.items():
        c = checks.get(key)
        if c is None:
            continue
        got = c.calibrated_errors
        for stat, fn, goal in (("median", statistics.median, med_goal), ("worst", max, worst_goal)):
            v, ref = fn(got), fn(c.defaults)
            loo_rows.append({
                "name": f"{what} {stat} leave-one-out error after calibration", "value": v * 100, "unit": "%",
                "reference": "uncalibrated defaults", "reference_value": ref * 100, "ratio": v / ref if ref else None,
                "goal": f"<= {goal:.0%}" + ("" if c.used else " (fit not used: no better than the defaults)"),
                "met": v <= goal})
    rest = _engine_rows() + _published_rows()
    return [
        {"name": "peak memory median error (H200 runs)", "value": mem_ours * 100, "unit": "%",
         "reference": "weights x optimizer multiplier rule", "reference_value": mem_naive * 100,
         "ratio": mem_ours / mem_naive if mem_naive else None, "goal": "<= 10 % median, far below the rule",
         "met": mem_ours <= 0.10 and mem_ours < mem_naive},
        {"name": "peak memory worst error (H200 runs)", "value": max(ours) * 100, "unit": "%",
         "reference": "weights x optimizer multiplier rule", "reference_value": max(naive) * 100,
         "ratio": max(ours) / max(naive), "goal": "<= 20 % worst", "met": max(ours) <= 0.20},
    ] + loo_rows + rest


def _engine_rows() -> list[dict]:
    from gpulens.plan import PlanRequest, plan

    def tpot(model: str) -> float:
        req = PlanRequest(model=model, workload="infer", gpu="h100-sxm", runtime="vllm", batch=1)
        return plan(req).speed["tpot_seconds"]

    llama, moe = tpot("llama-3-8b"), tpot("qwen3-30b-a3b")
    return [
        {"name": "Llama-3-8B vllm batch-1 TPOT on H100 SXM", "value": llama * 1000, "unit": "ms",
         "reference": "bandwidth bound (15.0 GB / 3.35 TB/s)", "reference_value": 15.0e9 / 3.35e12 * 1000,
         "ratio": llama / (15.0e9 / 3.35e12), "goal": "5-10 ms", "met": 0.005 <= llama <= 0.010},
        {"name": "Qwen3-30B-A3B vllm batch-1 TPOT on H100 SXM", "value": moe * 1000, "unit": "ms",
         "reference": "Llama-3-8B, same setup", "reference_value": llama * 1000, "ratio": moe / llama,
         "goal": "faster than Llama-3-8B (a MoE reads only the experts it routes to)", "met": moe < llama},
    ]


def _published_rows() -> list[dict]:
    from gpulens.plan.published import evaluate, table_rows

    rows = []
    for r in table_rows(evaluate()):
        if r["kind"] == "fit verdicts":
            rows.append({"name": f"published figures ({r['part']}): configurations planned with the wrong fit verdict",
                         "value": len(r["wrong"]), "unit": "figures", "reference": "figures with a verdict",
                         "reference_value": r["figures"], "ratio": len(r["wrong"]) / max(1, r["figures"]),
                         "goal": "none: every configuration that ran fits, every OOM does not", "met": not r["wrong"]})
            continue
        for stat, bound in (("median", r["bound_median"]), ("worst", r["bound_worst"])):
            v = r[f"{stat}_abs_error"]
            rows.append({"name": f"published figures ({r['part']}): {r['kind']} {stat} |error| ({r['figures']} figures)",
                         "value": v * 100, "unit": "%", "reference": "issue 25's bound", "reference_value": bound * 100,
                         "ratio": v / bound, "goal": f"<= {bound:.0%}", "met": v <= bound})
    return rows


if __name__ == "__main__":
    for r in run():
        print(r)
