"""gpulens's planner beside llm-analysis on the same published figures (issue 25: "print the table in
`make bench` beside llm-analysis's figures where it installs").

llm-analysis (github.com/cli99/llm-analysis, 0.2.2 from PyPI) is the open planner the issue measured
gpulens against. It runs in its own venv, .venv-llm-analysis, from the hashed lock
benchmarks/llm_analysis/requirements.txt, through benchmarks/llm_analysis/predict.py; where it does not
install (no index reachable), the comparison says so and is skipped, and nothing else in `make bench`
changes.

How each figure is put to llm-analysis, the same way for every figure:
- its efficiencies: llm-analysis needs a FLOPS and an HBM efficiency (1.0 by default, "the lower
  bound of latency"), so it is run at every setting its own guidance names, and each statistic is
  compared with its best setting, the one most favourable to it. Training: FLOPS 0.5 ("literature
  reports up to 0.5 for large scale model training", its README) with HBM 0.9 ("an aggressive
  target"). Inference: FLOPS 0.7 ("up to 0.7 for inference") with HBM 0.9, 0.7 or 0.6 (infer()'s
  warning: "benchmarks show closer to 0.6-0.7 hbm_memory_efficiency in inference workloads");
- its own GPU catalog (A100 SXM 40/80 GB, H100 SXM), or, for a card outside it, a GPUConfig from the
  figure's gpu_spec (NVLink one way = half the bidirectional figure, as its H100 entry has it);
- the model's shapes from gpulens's reading of the figure's config; a gated MLP's three matrices as
  one FFN of 1.5x the intermediate width, as llm-analysis's own Llama configs carry them (its MLP
  FLOPs are 16 b s h^2 whatever the width, so this sets only the weights it reads);
- the figure's GPUs, micro-batch, accumulation, sequence, tensor / pipeline / sequence parallelism,
  ZeRO stage (FSDP FULL_SHARD = 3), recomputation (full / selective / none) and optimizer bytes
  (Composer's PURE bf16: no fp32 master copy, bf16 moments; else fp32 master weights and moments); weights int8 / int4 as w8a16 / w4a16, FP8 dynamic as w8a8;
- predicted figures in the figure's unit exactly as gpulens's (published.py): tokens/s/GPU from the
  step time; generate() tokens/s over prefill + decode for gpt-fast and LitGPT, else 1 / decode time.
Figures that need what llm-analysis has no input for are left out and counted, by reason: context
parallelism, an interleaved pipeline schedule, FP8 training. Both planners' errors are over the same
figures, so the medians compare like with like. gpulens runs at its defaults, uncalibrated.
Per-figure answers: benchmarks/out/llm_analysis.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENV = ROOT / ".venv-llm-analysis"
LOCK = HERE / "llm_analysis" / "requirements.txt"
PREDICT = HERE / "llm_analysis" / "predict.py"
OUT = HERE / "out" / "llm_analysis.json"

KINDS = ("training_time", "serving_speed", "moe")
# the settings llm-analysis's guidance names (module docstring), by workload
EFFICIENCIES = {"train": ({"flops": 0.5, "hbm": 0.9},),
                "infer": ({"flops": 0.7, "hbm": 0.9}, {"flops": 0.7, "hbm": 0.7}, {"flops": 0.7, "hbm": 0.6})}
CATALOG = {"a100-40gb": "a100-sxm-40gb", "a100-80gb": "a100-sxm-80gb", "h100-sxm": "h100-sxm-80gb"}
DTYPES = {"bf16": "w16a16e16", "fp16": "w16a16e16", "int8": "w8a16e16", "int4": "w4a16e16", "fp8": "w8a8e16"}
RECOMPUTE = {"none": 0, "selective": 1, "full": 2}


def _python() -> Path | str:
    """The venv's interpreter, (re)installed when the lock changed; an error sentence when it cannot be."""
    py = VENV / "bin" / "python"
    stamp = VENV / ".lock-sha256"
    want = hashlib.sha256(LOCK.read_bytes()).hexdigest()
    if py.exists() and stamp.exists() and stamp.read_text() == want:
        return py
    steps = ([sys.executable, "-m", "venv", "--clear", str(VENV)],
             [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--require-hashes",
              "-r", str(LOCK)])
    for cmd in steps:
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"llm-analysis did not install ({e})"
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
            return f"llm-analysis did not install ({last[:160]})"
    stamp.write_text(want)
    return py


def _model_config(m) -> dict:
    ffn = (m.moe_intermediate_size or m.intermediate_size) if m.num_experts else m.intermediate_size  # Mixtral: 0 = same width
    ffn = round(ffn * 1.5) if m.mlp == "gated" else ffn
    cfg = {"name": m.name, "num_layers": m.num_layers, "n_head": m.num_heads, "hidden_dim": m.hidden_size,
           "vocab_size": m.vocab_size, "max_seq_len": m.max_context or m.max_positions,
           "num_key_value_heads": m.num_kv_heads, "ffn_embed_dim": ffn, "expansion_ratio": ffn / m.hidden_size}
    if m.num_experts:
        cfg |= {"moe_num_experts": m.num_experts, "moe_top_k": m.experts_per_token}
    return cfg


def _gpu_config(spec: dict) -> dict:
    return {"name": spec["name"], "mem_per_GPU_in_GB": spec["memory_gb"], "hbm_bandwidth_in_GB_per_sec": spec["bandwidth_gbps"],
            "intra_node_bandwidth_in_GB_per_sec": spec["interconnect_gbps"] / 2, "intra_node_min_message_latency": 8e-6,
            "peak_fp16_TFLOPS": spec["bf16_tflops"], "peak_i8_TFLOPS": spec.get("fp8_tflops") or spec.get("int8_tops")}


def _optimizer_bytes(c: dict) -> dict:
    """Adam's bytes per parameter beyond the 16-bit weight and gradient, in llm-analysis's two terms
    (other_op_bytes None means its fp32 Adam, 8 bytes). Composer's PURE bf16 keeps no fp32 master copy
    and its moments in bf16: 0 + 4; amp keeps fp32 master weights and fp32 moments: 4 + 8."""
    if c.get("mixed_precision") == "PURE":
        return {"master_weights_bytes": 0, "optimizer_state_bytes": 4}
    return {"master_weights_bytes": 4, "optimizer_state_bytes": None}


def case_for(fig: dict) -> dict | str:
    """The llm-analysis case for one figure, or why it has no input for the figure."""
    from gpulens.plan.published import _model

    c = fig["config"]
    if c.get("context_parallel", 1) not in (None, 1):
        return "context parallelism"
    if c.get("virtual_stages", 1) not in (None, 1):
        return "interleaved pipeline schedule"
    if c.get("precision") == "fp8":
        return "FP8 training"
    gpu = {"gpu_config": _gpu_config(c["gpu_spec"])} if "gpu_spec" in c else {"gpu": CATALOG.get(c["gpu"])}
    if gpu.get("gpu", True) is None:
        return f"GPU {c['gpu']} not in its catalog"
    m = _model(c, fig["id"])
    case = {"id": fig["id"], "model": _model_config(m), "gated_mlp": m.mlp == "gated", **gpu}
    if fig["kind"] == "training_time":
        tp, pp = c.get("tensor_parallel", 1), c.get("pipeline_parallel", 1)
        recompute = RECOMPUTE[c["recompute"]] if "recompute" in c else (2 if c.get("grad_ckpt") else 0)
        zero = 3 if c.get("sharding") == "FULL_SHARD" else int(c.get("zero") or 0)
        return case | {
            "workload": "train", "efficiencies": EFFICIENCIES["train"], "dtype": "w16a16e16",
            "parallel": {"tp": tp, "pp": pp, "dp": c["gpus"] // (tp * pp), "sp": tp if c.get("sequence_parallel") else 1},
            "train": {"batch": c["batch"], "grad_accum": c["grad_accum"], "seq": c["seq"], "recompute": recompute,
                      "zero": zero, **_optimizer_bytes(c)}}
    tp = c["tensor_parallel"]
    return case | {
        "workload": "infer", "efficiencies": EFFICIENCIES["infer"], "dtype": DTYPES[c["dtype"]], "parallel": {"tp": tp, "pp": 1, "dp": 1, "sp": tp},
        "infer": {"batch": c["batch"], "prompt": c["prompt"], "new_tokens": c["new_tokens"]}}


def in_figure_unit(fig: dict, case: dict, result: dict) -> float:
    """llm-analysis's answer in the figure's unit, through published.py's own rule (the one gpulens's
    predictions go through): its times stand in for a plan's speeds."""
    from gpulens.plan.published import _predicted

    if fig["kind"] == "training_time":
        p, t = case["parallel"], case["train"]
        speed = {"tokens_per_second": t["batch"] * t["grad_accum"] * p["dp"] * t["seq"] / result["step_seconds"]}
    else:
        speed = {"ttft_seconds": result["prefill_seconds"], "tpot_seconds": result["decode_seconds_per_token"]}
    return _predicted(fig, SimpleNamespace(speed=speed))


def compare() -> tuple[list[dict], dict[str, int], dict[str, str]] | str:
    """Per figure llm-analysis takes: both planners' errors; the figures left out, by reason; its refusals."""
    from gpulens.plan.published import evaluate, load_figures

    py = _python()
    if isinstance(py, str):
        return py
    figures = [f for f in load_figures() if f["kind"] in KINDS]
    cases, left_out = {}, {}
    for f in figures:
        case = case_for(f)
        if isinstance(case, str):
            left_out[case] = left_out.get(case, 0) + 1
        else:
            cases[f["id"]] = case
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run([str(py), str(PREDICT)], input=json.dumps(list(cases.values())), capture_output=True,
                          text=True, timeout=600, env=env)
    if done.returncode != 0:
        return f"llm-analysis's run failed ({(done.stderr.strip().splitlines() or ['no message'])[-1][:160]})"
    answers = json.loads(done.stdout)
    ours = {o.id: o for o in evaluate() if o.kind in KINDS}
    rows, refused = [], {}
    for f in figures:
        ans = answers.get(f["id"])
        if ans is None:
            continue
        if "error" in ans:  # e.g. its assert that TP stays inside an 8-GPU node
            left_out["refused by llm-analysis"] = left_out.get("refused by llm-analysis", 0) + 1
            refused[f["id"]] = ans["error"]
            continue
        case, o = cases[f["id"]], ours[f["id"]]
        row = {"id": f["id"], "kind": f["kind"], "held_out": f["held_out"], "ran": f["ran"], "measured": f["value"],
               "gpulens_fits": o.fits, "llm_analysis_fits": llm_analysis_fits(ans[0])}
        if row["llm_analysis_fits"] or case["workload"] == "train":  # a serving no-fit comes without times
            theirs = {_setting(e): in_figure_unit(f, case, a) for e, a in zip(case["efficiencies"], ans, strict=True)}
            row |= {"gpulens": o.predicted, "gpulens_error": o.error, "llm_analysis": theirs,
                    "llm_analysis_error": {k: v / f["value"] - 1 for k, v in theirs.items()}}
        rows.append(row)
    return rows, left_out, refused


def llm_analysis_fits(answer: dict) -> bool:
    """Its verdict: serving asserts the weights, KV cache and activations into the card (a no-fit
    comes back as fits False); training reports its total per GPU without refusing, so the verdict
    is that total against the card's memory as its GPU config states it (GiB, as its own asserts)."""
    if "fits" in answer:
        return bool(answer["fits"])
    return answer["memory_bytes"] <= answer["capacity_bytes"]


def _setting(e: dict) -> str:
    return f"FLOPS {e['flops']}, HBM {e['hbm']}"


def run() -> list[dict]:
    got = compare()
    if isinstance(got, str):
        return [{"name": "beside llm-analysis: skipped", "value": 0, "unit": "figures", "goal": got, "met": None}]
    rows, left_out, refused = got
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({"figures": rows, "left_out": left_out, "refused": refused}, indent=1))
    out = []
    for kind in KINDS:
        for part, keep in (("all", lambda r: True), ("held-out", lambda r: r["held_out"])):
            sel = [r for r in rows if r["kind"] == kind and keep(r) and "llm_analysis_error" in r]
            if not sel:
                continue
            for stat, fn in (("median", statistics.median), ("worst", max)):
                ours = fn(abs(r["gpulens_error"]) for r in sel)
                best, theirs = min(((k, fn(abs(r["llm_analysis_error"][k]) for r in sel))
                                    for k in sel[0]["llm_analysis_error"]), key=lambda kv: kv[1])
                out.append({"name": f"published figures ({part}): {kind} {stat} |error|, {len(sel)} figures both take",
                            "value": ours * 100, "unit": "%", "reference": f"llm-analysis 0.2.2 at {best}",
                            "reference_value": theirs * 100, "ratio": ours / theirs if theirs else None,
                            "goal": "<= llm-analysis's at its best setting", "met": ours <= theirs})
    for part, keep in (("all", lambda r: True), ("held-out", lambda r: r["held_out"])):
        ran = [r for r in rows if r["ran"] and keep(r)]
        ours, theirs = (sum(not r[k] for r in ran) for k in ("gpulens_fits", "llm_analysis_fits"))
        out.append({"name": f"published figures ({part}): runs that ran but are said not to fit, of {len(ran)} both take",
                    "value": ours, "unit": "figures", "reference": "llm-analysis 0.2.2", "reference_value": theirs,
                    "ratio": None, "goal": "none, and <= llm-analysis's", "met": ours == 0 and ours <= theirs})
    skipped = ", ".join(f"{n} {why}" for why, n in sorted(left_out.items()))
    out.append({"name": "published figures llm-analysis has no input for (left out of both columns)",
                "value": sum(left_out.values()), "unit": "figures", "goal": skipped or "none", "met": None})
    return out


if __name__ == "__main__":
    for r in run():
        print(r)
