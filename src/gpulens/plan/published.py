"""Published figures as a check: each measured result from a paper or an official benchmark page
(`data/published_figures.jsonl`, one per line, with its source and configuration) predicted with
the planner's library API, and the error summarized per kind.

Kinds and what is compared:
- `training_time`: tokens per second per GPU (`speed.tokens_per_second / gpus`);
- `serving_speed`, `moe`: output tokens per second of one sequence (1 / TPOT; LitGPT's figure is
  tokens over the whole call, so it includes the prefill);
- `serving_memory`: peak allocated bytes (GB = 1e9), or the KV blocks of a paged engine per GPU;
- `lora_memory`: peak allocated bytes of a LoRA / QLoRA step, planned with the figure's own set-up
  (engine, adapter dtype, NF4 with or without double quantization: LitGPT's rows run
  `--lora-engine litgpt`);
- `*_fit`: a verdict (a configuration that ran out of memory); and every figure with `ran: true`
  must be planned as fitting.
Nothing here is fitted: the planner's defaults predict every figure, with the options its
configuration's engine implies (`_engine_options`: what that engine release does, from its source
or changelog), and `held_out` ones are reported apart (they were not looked at while the
mechanisms were written).
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from gpulens.plan.catalog import UserConfig, user_gpu
from gpulens.plan.models import ModelSpec, from_hf_config, load_model
from gpulens.plan.planner import PlanRequest, PlanResult, plan
from gpulens.plan.serve import VLLM_BLOCK_TOKENS

KINDS = ("training_time", "serving_speed", "serving_memory", "lora_memory", "moe")
FIT_KINDS = ("serving_fit", "lora_fit", "moe_fit", "training_fit")
# The Done-when: (median, worst) absolute relative error per kind.
BOUNDS: dict[str, tuple[float, float]] = {
    "training_time": (0.08, 0.20), "serving_speed": (0.08, 0.25), "serving_memory": (0.05, 0.10),
    "lora_memory": (0.05, 0.10), "moe": (0.10, 0.20),
}
# Composer's FSDP mixed-precision modes as the planner expresses them (docs/plan.md).
# DEFAULT reduces gradients in fp32, PURE in bf16: the memory held is the same.
_COMPOSER_PRECISION = {("amp_bf16", "DEFAULT"): ("amp_bf16", "fsdp-bf16"), ("bf16", "PURE"): ("amp_bf16", "fsdp-bf16")}
# The reduce-scatter's dtype (docs/plan-llm-foundry-sources.md, section 1): PURE sets param, reduce
# and buffer dtypes to bf16 in every Composer release; DEFAULT's reduce_dtype is fp32 from Composer
# 0.16.4 (commit d745fcb1) and bf16 (inferred from param_dtype) in 0.13.2-0.16.3. The DEFAULT tables'
# Composer release is not public (the pin allows 0.16.3 and 0.16.4): fp32, the documented intent.
# Composer's FSDP runs BackwardPrefetch.BACKWARD_POST (priced as BACKWARD_PRE: plan/zero.py).
_COMPOSER_REDUCE_DTYPE = {"DEFAULT": "fp32", "PURE": "bf16"}


def figures_path() -> Path:
    return Path(str(resources.files("gpulens.plan") / "data" / "published_figures.jsonl"))


def load_figures(path: Path | None = None) -> list[dict[str, Any]]:
    with open(path or figures_path(), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@dataclass
class Outcome:
    id: str
    kind: str
    held_out: bool
    measured: float | bool
    predicted: float | bool
    error: float | None  # predicted / measured - 1; None for a verdict
    fits: bool  # what the plan says
    ran: bool  # the configuration was really run (so it must be said to fit)
    unit: str = ""

    @property
    def verdict_ok(self) -> bool:
        if self.kind in FIT_KINDS:
            return self.fits == bool(self.measured)
        return self.fits or not self.ran


def _model(cfg: dict[str, Any], fid: str) -> ModelSpec:
    m = cfg["model"]
    return from_hf_config(m, name=fid) if isinstance(m, dict) else load_model(m)


def _attention_kernel(fig: dict[str, Any]) -> str:
    """llm-foundry's MPT benchmark tables were run with `attn_impl: triton` (the Triton port of
    FlashAttention): scripts/train/benchmarking/submit_benchmarks.py defaults `--attn_impl` to
    'triton' and sweep.sh passes none, at b2a43a1 (2023-10-19, the commit that added the H100 and
    A100-80GB rows) and at 300cc5c (2023-05-03, the A100-40GB rows); the default became 'flash'
    only later, before the commit the figures cite. Other sources: what SDPA picks."""
    return "triton" if fig["source"].get("repo") == "mosaicml/llm-foundry" else "auto"


def _inter_node_bytes_per_second(fig: dict[str, Any]) -> float | None:
    """The network a figure's cluster had, where its source states it. llm-foundry's A100 tables
    are titled 'A100 80GB with 1600 Gbps node-node interconnect (RoCE)' and 'A100 40GB with 1600
    Gbps node-node interconnect (RoCE)' (scripts/train/benchmarking/README.md): 1600 Gb/s per
    8-GPU node (the tables' single-node runs have 8 GPUs) = 200 Gb/s = 25 GB/s per GPU, one
    direction, half the planner's 400 Gb/s-per-GPU default. The H100 table states none."""
    m = re.search(r"(\d+) Gbps node-node interconnect", str(fig["source"].get("what", "")))
    return int(m.group(1)) * 1e9 / 8 / 8 if m else None  # Gb/s per node -> bytes/s per GPU (8 per node)


def _request(fig: dict[str, Any], model: ModelSpec | None = None) -> PlanRequest:
    c = fig["config"]
    kind = fig["kind"]
    name = c["model"] if isinstance(c["model"], str) else fig["id"]
    if kind in ("training_time", "training_fit") and "tensor_parallel" in c:
        return _megatron_request(fig, name)
    if kind in ("training_time", "training_fit"):
        precision, layout = _COMPOSER_PRECISION[(c["precision"], c["mixed_precision"])]
        zero = 3 if c.get("sharding") == "FULL_SHARD" else 0
        inter = _inter_node_bytes_per_second(fig)
        net = {"inter_node_bytes_per_second": inter} if inter else {}
        fsdp = {"backward_prefetch": "post", "reduce_dtype": _COMPOSER_REDUCE_DTYPE[c["mixed_precision"]]} if zero == 3 else {}
        return PlanRequest(model=name, workload="train", gpu=c["gpu"], gpus=c["gpus"], precision=precision,
                           batch=c["batch"], seq=c["seq"], grad_accum=c["grad_accum"], grad_ckpt=c["grad_ckpt"],
                           zero=zero, zero_layout=layout, loss="fused" if c.get("loss") == "fused_crossentropy" else "torch",
                           attention_kernel=_attention_kernel(fig), **net, **fsdp)
    if kind in ("lora_memory", "lora_fit"):
        return PlanRequest(model=name, workload="train", gpu=c["gpu"], gpus=c.get("gpus", 1), precision=c["precision"],
                           batch=c["batch"], seq=c["seq"], finetune=c["finetune"], lora_rank=c["lora_rank"],
                           lora_targets=c["lora_targets"], lora_dtype=c.get("adapter_dtype", "fp32"),
                           lora_engine="litgpt" if c.get("engine", "").startswith("LitGPT") else "peft",
                           qlora_double_quant=c.get("quantization") != "bnb.nf4")
    group = {"int4_group_size": c["group_size"]} if c["dtype"] == "int4" and "group_size" in c else {}
    return PlanRequest(model=name, workload="infer", gpu=c["gpu"], dtype=c["dtype"], batch=c["batch"],
                       prompt=c["prompt"], new_tokens=c["new_tokens"], runtime=c["runtime"],
                       tensor_parallel=c["tensor_parallel"], **group, **_engine_options(c, model))


def _megatron_request(fig: dict[str, Any], name: str) -> PlanRequest:
    """A Megatron-LM figure (Korthikanti et al. 2022): tensor x pipeline (x data) parallel, the
    1F1B schedule (interleaved over `virtual_stages` chunks), context parallelism, sequence parallelism and the
    recomputation mode as the figure states them; the module in 16-bit with fp32 main weights in the
    optimizer (`zero_layout`, ZeRO 0); the cluster's network from the figure's config; `megatron_core`:
    a Megatron-Core run at TP 1 x PP 1 x CP 1 (NeMo's), planned on the Megatron path."""
    c = fig["config"]
    return PlanRequest(model=name, workload="train", gpu=c["gpu"], gpus=c["gpus"], precision=c["precision"],
                       batch=c["batch"], seq=c["seq"], grad_accum=c["grad_accum"], recompute=c["recompute"],
                       zero=c.get("zero", 0), zero_layout=c.get("zero_layout", "fsdp"), loss=c.get("loss", "torch"),
                       reduce_dtype=c.get("reduce_dtype"), tensor_parallel=c["tensor_parallel"], pipeline_parallel=c.get("pipeline_parallel", 1),
                       sequence_parallel=bool(c.get("sequence_parallel", False)),
                       virtual_stages=c.get("virtual_stages", 1), context_parallel=c.get("context_parallel", 1),
                       attention_kernel=c.get("attention_kernel", "auto"),
                       megatron_core=bool(c.get("megatron_core", False)),
                       inter_node_bytes_per_second=c["inter_node_bytes_per_second"])


def _engine_options(c: dict[str, Any], model: ModelSpec | None) -> dict[str, Any]:
    """What the engine release named in a figure's configuration did by default, as planner
    options (docs/plan.md): vLLM 0.2.x (December 2023) profiled max(max_model_len, 2048) tokens
    (`max_num_batched_tokens`'s default then) and ran PyTorch 2.1's ProcessGroupNCCL with
    record_stream (vLLM sets TORCH_NCCL_AVOID_RECORD_STREAMS=1 from 0.2.7), with two NCCL
    communicators per GPU (worker.py's warm-up all_reduce on the default group, then the TP group)."""
    engine = str(c.get("engine", ""))
    if engine == "gpt-fast":  # tp.py's apply_tp splits model.layers only: the output head is on every rank;
        return {"tp_shards_head": False, "quantize_head": True}  # quantize.py replaces every nn.Linear
    if not engine.startswith("vLLM (Dec 2023"):
        return {}
    max_len = (model.max_context or model.max_positions or 2048) if model is not None else 2048
    return {"max_num_batched_tokens": max(max_len, 2048), "nccl_record_streams": True, "nccl_communicators": 2}


def _predicted(fig: dict[str, Any], res: PlanResult) -> float:
    kind, c = fig["kind"], fig["config"]
    if kind == "training_time":
        return float(res.speed["tokens_per_second"]) / c["gpus"]
    if kind in ("serving_speed", "moe"):
        # LitGPT's and gpt-fast's generate.py (torchao's copy too) time the whole generate() call:
        # tokens generated / (prefill + decode), prefill included
        if c.get("engine", "").startswith(("LitGPT", "gpt-fast")):
            return c["new_tokens"] / (res.speed["ttft_seconds"] + c["new_tokens"] * res.speed["tpot_seconds"])
        return 1.0 / float(res.speed["tpot_seconds"])
    if kind == "serving_memory" and "block_tokens" in c:
        per_block = res.speed["kv_cache_bytes_per_token"] * VLLM_BLOCK_TOKENS / c["tensor_parallel"]
        return res.memory.breakdown.get("kv_cache", 0) / per_block
    return res.memory.peak_bytes / 1e9


def predict(fig: dict[str, Any], *, user: UserConfig | None = None) -> Outcome:
    """Plan one figure's configuration with the defaults (no calibration file, no user config)."""
    model = _model(fig["config"], fig["id"])
    req = _request(fig, model)
    if user is None and "gpu_spec" in fig["config"]:  # a card outside the catalog, described as a user would
        user = UserConfig(gpus=(user_gpu(fig["config"]["gpu_spec"], where=f"figure {fig['id']}"),))
    res = plan(req, model=model, user=user or UserConfig(),
               calibration_path=Path("/nonexistent/gpulens-calibration.json"))
    kind = fig["kind"]
    if kind in FIT_KINDS:
        return Outcome(fig["id"], kind, fig["held_out"], bool(fig["value"]), res.fits, None, res.fits, fig["ran"], "fits")
    p = _predicted(fig, res)
    return Outcome(fig["id"], kind, fig["held_out"], float(fig["value"]), p, p / float(fig["value"]) - 1, res.fits,
                   fig["ran"], fig.get("unit") or "")


@dataclass
class KindSummary:
    kind: str
    count: int
    median_abs_error: float
    worst_abs_error: float
    worst_id: str
    bounds: tuple[float, float]
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def within_bounds(self) -> bool:
        return self.median_abs_error <= self.bounds[0] and self.worst_abs_error <= self.bounds[1]


def summarize(outcomes: list[Outcome], kind: str) -> KindSummary | None:
    rows = [o for o in outcomes if o.kind == kind and o.error is not None]
    if not rows:
        return None
    errs = [abs(o.error) for o in rows if o.error is not None]
    worst = max(rows, key=lambda o: abs(o.error or 0.0))
    return KindSummary(kind, len(rows), statistics.median(errs), max(errs), worst.id, BOUNDS[kind], rows)


def evaluate(figures: list[dict[str, Any]] | None = None) -> list[Outcome]:
    return [predict(f) for f in (figures if figures is not None else load_figures())]


def table_rows(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """Per kind, all figures and the held-out ones: count, median and worst |error|, the bound."""
    rows = []
    for part, sel in (("all", outcomes), ("held-out", [o for o in outcomes if o.held_out])):
        for kind in KINDS:
            s = summarize(sel, kind)
            if s is None:
                continue
            rows.append({"part": part, "kind": kind, "figures": s.count, "median_abs_error": s.median_abs_error,
                         "worst_abs_error": s.worst_abs_error, "worst": s.worst_id,
                         "bound_median": s.bounds[0], "bound_worst": s.bounds[1], "within": s.within_bounds})
        verdicts = [o for o in sel if o.ran or o.kind in FIT_KINDS]
        wrong = [o.id for o in verdicts if not o.verdict_ok]
        rows.append({"part": part, "kind": "fit verdicts", "figures": len(verdicts), "wrong": wrong,
                     "within": not wrong})
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    out = [f"{'part':<9} {'kind':<15} {'n':>4} {'median':>8} {'worst':>8} {'bound':>11}  worst figure / wrong verdicts"]
    for r in rows:
        if r["kind"] == "fit verdicts":
            verdict = "all right" if r["within"] else f"{len(r['wrong'])} wrong"
            out.append(f"{r['part']:<9} {r['kind']:<15} {r['figures']:>4} {'':>8} {'':>8} {verdict:>11}  "
                       f"{', '.join(r['wrong']) or '-'}")
            continue
        bound = f"{r['bound_median']:.0%}/{r['bound_worst']:.0%}"
        out.append(f"{r['part']:<9} {r['kind']:<15} {r['figures']:>4} {r['median_abs_error']:>8.1%} "
                   f"{r['worst_abs_error']:>8.1%} {bound:>11}  {r['worst']}")
    return "\n".join(out)


if __name__ == "__main__":  # python -m gpulens.plan.published
    print(format_table(table_rows(evaluate())))
