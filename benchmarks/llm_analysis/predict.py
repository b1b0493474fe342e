"""llm-analysis's predictions for cases written by benchmarks/bench_llm_analysis.py.

Runs inside .venv-llm-analysis (llm-analysis and fire only, from requirements.txt here), never in
gpulens's venv: reads a JSON list of cases on stdin and writes {case id: results} on stdout, where
results are the times llm-analysis's own API returns, one per efficiency setting the case lists, or
{"error": "..."} for a case it refuses.
It calls LLMAnalysis directly (the library API its CLI wraps) so a figure's model, a GPU outside its
catalog and the parallel layout go in as values rather than files.
"""

from __future__ import annotations

import json
import logging
import sys


def _result(case: dict, efficiency: dict) -> dict:
    from llm_analysis.analysis import ActivationRecomputation, DSZeRO, LLMAnalysis
    from llm_analysis.config import (
        GPUConfig,
        ModelConfig,
        ParallelismConfig,
        get_dtype_config_by_name,
        get_gpu_config_by_name,
    )

    gpu = GPUConfig(**case["gpu_config"]) if "gpu_config" in case else get_gpu_config_by_name(case["gpu"])
    par = case["parallel"]
    analysis = LLMAnalysis(ModelConfig(**case["model"]), gpu, get_dtype_config_by_name(case["dtype"]),
                           ParallelismConfig(tp_size=par["tp"], pp_size=par["pp"], dp_size=par["dp"], sp_size=par["sp"]),
                           flops_efficiency=efficiency["flops"], hbm_memory_efficiency=efficiency["hbm"])
    if case["workload"] == "train":
        t = case["train"]
        s = analysis.training(batch_size_per_gpu=t["batch"], gradient_accumulation_steps=t["grad_accum"],
                              global_batch_size=t["batch"] * t["grad_accum"] * par["dp"], seq_len=t["seq"],
                              activation_recomputation=ActivationRecomputation(t["recompute"]), ds_zero=DSZeRO(t["zero"]),
                              master_weights_dtype_bytes=t["master_weights_bytes"],
                              other_op_bytes=t["optimizer_state_bytes"], flash_attn=True,
                              mlp_gated_linear_units=case["gated_mlp"])
        # it does not refuse a training run that exceeds the card; its verdict is its total against the card
        return {"step_seconds": s["latency_per_iter"], "memory_bytes": s["(weight+op_state+grad+act)_memory_per_gpu"],
                "capacity_bytes": gpu.mem_per_GPU_in_GB * 1024**3}
    i = case["infer"]
    try:
        s = analysis.inference(batch_size_per_gpu=i["batch"], seq_len=i["prompt"], num_tokens_to_generate=i["new_tokens"])
    except AssertionError as e:  # its no-fit verdict: "... too large to fit in GPU memory"
        if "fit" in str(e):
            return {"fits": False, "why": str(e)}
        raise
    return {"prefill_seconds": s["prefill_latency"], "decode_seconds_per_token": s["decode_latency"], "fits": True}


def main() -> int:
    from llm_analysis.logger import logger

    logger.setLevel(logging.ERROR)  # its INFO summaries go to stderr; the answer is stdout's JSON
    out = {}
    for case in json.load(sys.stdin):
        try:
            out[case["id"]] = [_result(case, e) for e in case["efficiencies"]]
        except Exception as e:  # noqa: BLE001 - a case llm-analysis refuses (an assert, a ValueError) is reported
            out[case["id"]] = {"error": f"{type(e).__name__}: {e}".strip()}
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
