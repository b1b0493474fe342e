"""The planner's one entry point: a request in, a typed plan out (memory, speed, cost, advice)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from gpulens.errors import BadInputError, shown
from gpulens.plan.accuracy import PUBLISHED_ACCURACY, PublishedAccuracy
from gpulens.plan.advice import (
    Fix,
    ReplicaMiss,
    ReplicaOption,
    cross_node_tensor_parallel_tip,
    replica_options,
    serving_fixes,
    training_fixes,
    training_tips,
)
from gpulens.plan.calibration import load_efficiency
from gpulens.plan.catalog import GpuSpec, UnsupportedPrecisionError, UserConfig, find_gpu, load_user_config
from gpulens.plan.cost import Cost, ElectricityCost, electricity_cost, serving_cost, training_cost
from gpulens.plan.fp8 import check_fp8_gpu
from gpulens.plan.kernels import check_attention_kernel, check_attention_kernel_gpu
from gpulens.plan.links import DEFAULT_GPUS_PER_NODE, DEFAULT_INTER_NODE_BYTES_PER_SECOND
from gpulens.plan.megatron import RECOMPUTE
from gpulens.plan.memory import DEFAULT_CUDA_CONTEXT_BYTES, MemoryEstimate, TrainSetup, training_memory
from gpulens.plan.models import ModelSpec, load_model
from gpulens.plan.nemo_optim import apex_grad_sync_bytes
from gpulens.plan.overlap import overlap_compute_slowdown
from gpulens.plan.serve import INT4_GROUP, ServeSetup, plan_serving
from gpulens.plan.serve_engine_rules import with_engine_defaults
from gpulens.plan.speculative import DEFAULT_SPECULATIVE_TOKENS, SpeculativeSetup, break_even_batch
from gpulens.plan.speed import Efficiency, training_speed
from gpulens.plan.zero import BACKWARD_PREFETCH
from gpulens.units import format_seconds

Workload = Literal["train", "infer"]


@dataclass(frozen=True)
class PlanRequest:
    model: str  # config.json path, preset name, or a parameter count such as "7b"
    workload: Workload = "train"
    gpu: str = "h100-sxm"
    gpus: int = 1
    # training
    precision: str = "amp_bf16"
    optimizer: str = "adamw"
    batch: int = 8  # micro-batch per GPU (training) / concurrent sequences (serving)
    seq: int = 2048
    grad_accum: int = 1
    grad_ckpt: bool = False
    recompute: str = "none"  # none | selective | full (= grad_ckpt); plan/memory.py TrainSetup.recompute
    lora_dtype: str = "fp32"  # LoRA adapters' weights and gradients (peft's default fp32)
    lora_optimizer_dtype: str | None = None  # their AdamW moments (None: the adapters' dtype)
    lora_engine: str = "peft"  # peft (+ transformers) | litgpt (finetune/lora.py); plan/lora_litgpt.py
    qlora_double_quant: bool = True  # QLoRA's NF4 with double quantization
    zero: int = 0
    zero_layout: str = "fsdp"  # fsdp | deepspeed | fsdp-bf16 (see plan/zero.py)
    loss: str = "torch"  # torch (transformers' fp32 logits) | fused (in-place 16-bit cross-entropy kernel)
    finetune: str = "full"  # full | lora | qlora (see plan/lora.py)
    lora_rank: int = 16
    lora_targets: str = "all"
    pipeline_parallel: int = 1  # training: inside gpus; serving: stages per replica (plan/serve_pipeline.py)
    sequence_parallel: bool = False
    virtual_stages: int = 1  # interleaved 1F1B: model chunks per pipeline stage (plan/interleaved.py)
    context_parallel: int = 1  # ring attention over the sequence (plan/context_parallel.py)
    attention_kernel: str = "auto"  # auto | flash3 | cudnn | flash2 | flash1 | triton | eager (plan/kernels.py)
    expert_parallel: int = 1  # MoE training: experts split over groups of N GPUs (plan/expert_parallel.py)
    offload: str = "none"  # none | optimizer: ZeRO-Offload (plan/offload.py)
    backward_prefetch: str = "pre"  # ZeRO-3 / FSDP: pre | post | none (plan/zero.py BACKWARD_PREFETCH)
    reduce_dtype: str | None = None  # ZeRO-3's gradient reduce-scatter: fp32 | bf16 (None: fp32 under amp)
    megatron_core: bool = False  # plan a TP 1 x PP 1 x CP 1 run as Megatron-Core (plan/memory.py TrainSetup)
    # serving
    dtype: str = "bf16"
    kv_dtype: str | None = None
    prompt: int = 512
    new_tokens: int = 128
    runtime: str = "hf"
    runtime_defaulted: bool = False  # --runtime not given: hf on one GPU, vllm for a sharded replica (plan/request.py)
    tensor_parallel: int = 1
    max_num_batched_tokens: int | None = None  # an engine's profiling forward (None: the engine's default, serve_engine_rules)
    nccl_record_streams: bool = False  # engine at TP > 1: all-reduced activations held through the profiling forward
    tp_shards_head: bool = True  # serving: the output head split over the TP group (vLLM); gpt-fast replicates it
    quantize_head: bool = False  # serving: int8/int4/fp8 quantize the output head too (gpt-fast)
    draft_model: str | None = None  # serving: speculative decoding's draft (plan/speculative.py), resolved like model
    speculative_tokens: int = DEFAULT_SPECULATIVE_TOKENS  # K: guesses the draft proposes per step
    acceptance_rate: float | None = None  # alpha: per-token acceptance probability (required with a draft)
    int4_group_size: int = INT4_GROUP  # serving, int4: weights per fp16 scale + zero point (gpt-fast's figures: 32)
    nccl_communicators: int = 1  # serving, engine at TP > 1: NCCL communicators per GPU (vLLM 0.2.x: 2)
    prefill_chunk_tokens: int | None = None  # serving, engine: the scheduler's per-step budget (None: max_num_batched_tokens)
    prefix_hit_ratio: float = 0.0  # serving, engine: share of each prompt in the prefix cache (plan/serve_engines.py)
    fp8_activations: str = "dynamic"  # serving, --dtype fp8: dynamic or static activation scales (plan/serve_quant.py)
    tpot_target_seconds: float | None = None
    ttft_target_seconds: float | None = None
    target_requests_per_second: float | None = None
    assume_dense: bool = False  # plan an unknown model_type as a dense LLaMA-like decoder
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    inter_node_bytes_per_second: float = DEFAULT_INTER_NODE_BYTES_PER_SECOND  # per GPU, one direction
    # electricity (plan/cost.py: an estimate from TDP)
    electricity_usd_per_kwh: float | None = None
    power_fraction: float = 1.0  # the share of TDP the GPUs draw on average
    pue: float = 1.0  # the site's power usage effectiveness

    @property
    def replica_gpus(self) -> int:
        """Serving: one replica's GPUs, tensor x pipeline parallel."""
        return self.tensor_parallel * self.pipeline_parallel

    def validate(self) -> None:
        if self.workload not in ("train", "infer"):
            raise BadInputError(f"Unknown workload {self.workload!r}.", hint="Use --workload train or --workload infer.")
        for what, v in (("number of GPUs", self.gpus), ("number of GPUs per node", self.gpus_per_node)):
            if v <= 0:
                raise BadInputError(f"The {what} must be at least 1, not {v}.", hint="Pass --gpus 1 or more.")
        for what, v in (("TPOT target", self.tpot_target_seconds), ("TTFT target", self.ttft_target_seconds),
                        ("target request rate", self.target_requests_per_second)):
            if v is not None and v <= 0:
                raise BadInputError(f"The {what} must be above zero, not {v}.", hint="Give a positive value.")


@dataclass
class Advice:
    kind: str  # "fix" (makes it fit), "tip" (it fits; do better), "note"
    text: str
    why: str = ""
    peak_bytes: int | None = None
    fits: bool | None = None
    change: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_fix(cls, f: Fix) -> Advice:
        return cls("fix", f.action, f.why, f.peak_bytes, f.fits, f.change)


@dataclass
class PlanResult:
    request: PlanRequest
    model: ModelSpec
    gpu: GpuSpec
    fits: bool
    memory: MemoryEstimate
    speed: dict[str, Any]
    advice: list[Advice]
    efficiency: Efficiency
    cost: Cost | None = None
    replicas: list[ReplicaOption] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    cost_basis: str = ""  # "at batch N (why that batch)": what the cost per token is priced at
    electricity: ElectricityCost | None = None  # with --electricity-usd-per-kwh
    replica_misses: list[ReplicaMiss] = field(default_factory=list)  # why a GPU has no replica layout
    accuracy: list[PublishedAccuracy] = field(default_factory=list)  # how such predictions fared on published figures

    def to_dict(self) -> dict[str, Any]:
        r = self.request
        return {
            "fits": self.fits,
            "workload": r.workload,
            "model": self.model.to_dict() | {"source": self.model.source},
            "gpu": {"name": self.gpu.name, "count": r.gpus if r.workload == "train" else r.replica_gpus,
                    "memory_bytes": self.gpu.memory_bytes, "sources": list(self.gpu.sources)},
            "setup": asdict(r),
            "memory": self.memory.to_dict(),
            "speed": dict(self.speed),
            "cost": self.cost.to_dict() if self.cost else None,
            "electricity": self.electricity.to_dict() if self.electricity else None,
            "advice": [asdict(a) for a in self.advice],
            "replicas": [o.to_dict() for o in self.replicas],
            "replica_misses": [x.to_dict() for x in self.replica_misses],
            "replica_targets": replica_targets(r),
            "calibration": {"calibrated": self.efficiency.calibrated, "source": self.efficiency.source,
                            "factors": {k: v for k, v in self.efficiency.to_dict().items() if k not in ("source", "extra")}},
            "rough": self.model.rough,
            "notes": list(self.notes),
            "cost_basis": self.cost_basis,
            "accuracy": [a.to_dict() for a in self.accuracy],
        }


def _check_context(model: ModelSpec, req: PlanRequest) -> None:
    """A sequence longer than the model's positions (with RoPE scaling) is not a plan but an error."""
    limit = model.max_context
    tokens = req.seq if req.workload == "train" else req.prompt + req.new_tokens
    if limit and tokens > limit:
        what = "--seq" if req.workload == "train" else "--prompt + --new-tokens"
        raise BadInputError(f"{model.name} takes at most {limit:,} positions (max_position_embeddings"
                            f"{' with RoPE scaling' if limit != model.max_positions else ''}), not {tokens:,}.",
                            hint=f"Pass {what} of {limit:,} or less, or a model with a longer context.")


def _check_precision(gpu: GpuSpec, req: PlanRequest) -> None:
    if req.workload == "train":
        fmt = {"amp_bf16": "bf16", "bf16": "bf16", "amp_fp16": "fp16", "fp16": "fp16", "fp32": "fp32"}.get(req.precision)
        if fmt:
            gpu.peak_flops(fmt)
        elif req.precision == "fp8":
            check_fp8_gpu(gpu)


def _target_model(req: PlanRequest) -> ModelSpec:
    """The model to plan; --assume-dense on one whose family is modelled would be silently ignored, so it is refused."""
    model = load_model(req.model, assume_dense=req.assume_dense)
    if req.assume_dense and not model.assumed_dense:
        raise BadInputError(f"--assume-dense plans a model_type the planner does not model as a dense decoder, and "
                            f"{model.name} ({model.family}) is one it models.", hint="Drop --assume-dense.")
    return model


def plan(req: PlanRequest, *, model: ModelSpec | None = None, user: UserConfig | None = None,
         calibration_path: Path | None = None) -> PlanResult:
    """Plan one model on one GPU type for training or serving."""
    req.validate()
    user = user if user is not None else load_user_config()
    gpu = find_gpu(req.gpu, user=user)
    model = model or _target_model(req)
    _check_precision(gpu, req)
    _check_context(model, req)
    eff = load_efficiency(gpu, path=calibration_path)
    ctx = DEFAULT_CUDA_CONTEXT_BYTES
    notes: list[str] = []
    if model.assumed_dense:
        notes.append(f"Warning: model_type {model.family!r} is not a family the planner models; planned as a dense "
                     "LLaMA-like decoder (--assume-dense). Its MoE, MLA or sliding-window layout, if any, is ignored: "
                     "parameter and KV-cache figures may be far off.")
    if model.untyped:
        notes.append("The config names no model_type: planned as a dense LLaMA-like decoder (its fields read by "
                     "their Hugging Face names). Add the model's model_type if it is a family with another layout.")
    if model.rough:
        notes.append("Rough answer: only a parameter count was given, so the shapes are guessed (LLaMA-like). "
                     "Pass a config.json or a preset for a real one.")
    notes.append(f"Efficiency factors: {eff.source}." + ("" if eff.calibrated else
                 " Run `gpulens plan calibrate --measurements FILE --gpu NAME` with measured runs to fit them."))
    if req.workload == "train":
        res = _plan_train(req, model, gpu, eff, ctx, user, notes)
    else:
        res = _plan_serve(req, model, gpu, eff, ctx, user, notes)
    res.accuracy = [PUBLISHED_ACCURACY[k] for k in accuracy_kinds(req, model, calibrated=eff.calibrated)]
    return _with_electricity(res)


def accuracy_kinds(req: PlanRequest, model: ModelSpec, *, calibrated: bool) -> list[str]:
    """The kinds of published figure that answer for this plan's numbers (plan/accuracy.py). The
    speed figures were predicted with the default efficiency factors: a calibrated plan answers to
    its own calibration's leave-one-out check instead."""
    if req.workload == "train":
        speed, memory = "training_time", ("lora_memory" if req.finetune in ("lora", "qlora") else None)
    else:
        speed, memory = ("moe" if model.is_moe else "serving_speed"), "serving_memory"
    return [k for k in ((None if calibrated else speed), memory) if k]


def _with_electricity(res: PlanResult) -> PlanResult:
    """The electricity cost at --electricity-usd-per-kwh, from the GPUs' TDP (an estimate, said so)."""
    req = res.request
    if req.electricity_usd_per_kwh is None:
        return res
    train = req.workload == "train"
    gpus = req.gpus if train else req.replica_gpus
    tps = res.speed.get("tokens_per_second" if train else "output_tokens_per_second") or 0.0
    res.electricity = electricity_cost(res.gpu.tdp_watts, gpus, float(tps), req.electricity_usd_per_kwh,
                                       power_fraction=req.power_fraction, pue=req.pue)
    if res.electricity is None:
        res.notes.append(f"No TDP for {res.gpu.name} in the catalog: add tdp_watts to it in your config to see the electricity cost.")
    return res


def _plan_train(req: PlanRequest, model: ModelSpec, gpu: GpuSpec, eff: Efficiency, ctx: int, user: UserConfig,
                notes: list[str]) -> PlanResult:
    if req.recompute not in RECOMPUTE:
        raise BadInputError(f"Unknown recomputation {req.recompute!r}.", hint="Use --recompute none, selective or full.")
    setup = TrainSetup(req.precision, req.optimizer, req.batch, req.seq, req.grad_accum,
                       req.grad_ckpt or req.recompute == "full", req.zero, req.gpus,
                       selective_recompute=req.recompute == "selective",
                       zero_layout=req.zero_layout, finetune=req.finetune, lora_rank=req.lora_rank,
                       lora_targets=req.lora_targets, gpus_per_node=req.gpus_per_node,
                       lora_dtype=req.lora_dtype, lora_optimizer_dtype=req.lora_optimizer_dtype,
                       lora_engine=req.lora_engine, qlora_double_quant=req.qlora_double_quant,
                       tensor_parallel=req.tensor_parallel, pipeline_parallel=req.pipeline_parallel,
                       sequence_parallel=req.sequence_parallel, loss=req.loss,
                       virtual_stages=req.virtual_stages, context_parallel=req.context_parallel,
                       inter_node_bytes_per_second=req.inter_node_bytes_per_second,
                       attention_kernel=check_attention_kernel(req.attention_kernel),
                       expert_parallel=req.expert_parallel, offload=req.offload,
                       backward_prefetch=req.backward_prefetch, reduce_dtype=req.reduce_dtype,
                       megatron_core=req.megatron_core)
    setup.validate()
    check_attention_kernel_gpu(setup.attention_kernel, gpu, setup.activation_precision)  # flash3 / cudnn: Hopper
    if req.zero and req.gpus > 1:
        notes.append(f"ZeRO-{req.zero}, {req.zero_layout} layout: " + (
            "16-bit weights and gradients in the module, the fp32 master copy sharded with the Adam moments "
            "(DeepSpeed, ZeRO paper)." if setup.deepspeed_amp else
            "NeMo's distributed Adam (Apex DistributedFusedAdam): bf16 module, the whole gradient buffer "
            f"({'fp32' if apex_grad_sync_bytes(req.zero_layout, req.reduce_dtype) == 4 else 'bf16'}, its grad_sync_dtype), "
            "gradient shards and Adam states sharded; the gradients reduce-scattered and the bf16 parameters "
            "all-gathered (plan/nemo_optim.py)." if req.zero_layout.startswith("apex") else
            "fp32 shards of weights, gradients and moments; each unit gathered and computed in bf16 without "
            "autocast (FSDP MixedPrecision, as Composer / llm-foundry run it)." if req.zero_layout == "fsdp-bf16" else
            "weights and gradients in the precision's storage dtype (fp32 under amp), as PyTorch FSDP keeps them."))
        if req.zero == 3 and (req.backward_prefetch != "pre" or req.reduce_dtype):
            notes.append(f"Backward prefetch {req.backward_prefetch}: {BACKWARD_PREFETCH[req.backward_prefetch]}"
                         + (f"; gradients reduce-scattered in {req.reduce_dtype}." if req.reduce_dtype else "."))
    mem = training_memory(model, setup, capacity_bytes=gpu.memory_bytes, workspace_bytes=eff.workspace_bytes,
                          cuda_context_bytes=ctx, reserved_ratio=eff.reserved_ratio, activation_scale=eff.activation_scale)
    sp = training_speed(model, setup, gpu, eff)
    if setup.gradient_group > 1 and sp.communication_seconds > 0:
        notes.append(f"Collectives hidden behind compute still slow it: the compute beside a NCCL kernel takes "
                     f"{overlap_compute_slowdown(gpu):.2f}x as long on {gpu.name} (plan/overlap.py: PyTorch #143988, "
                     "NCCL #1428); communication time includes that.")
    advice: list[Advice] = []
    if mem.fits:
        advice += [Advice("tip", t) for t in training_tips(model, setup, gpu, eff, ctx, mem.peak_bytes)]
    else:
        advice += [Advice.from_fix(f) for f in training_fixes(model, setup, gpu, eff, ctx)]
    cost = training_cost(gpu.hourly_price, req.gpus, sp.tokens_per_second, currency=user.currency,
                         purchase_per_gpu=gpu.purchase_price)
    if cost is None:
        notes.append(f"No price for {gpu.name}: add one to {user.path} to see costs (gpulens invents no prices).")
    # tokens per optimizer step: tensor, pipeline and context-parallel ranks share their samples
    speed = sp.to_dict() | {"global_batch_tokens": req.batch * req.seq * req.grad_accum * setup.data_parallel}
    return PlanResult(req, model, gpu, mem.fits, mem, speed, advice, eff, cost, [], notes + mem.notes)


def _plan_serve(req: PlanRequest, model: ModelSpec, gpu: GpuSpec, eff: Efficiency, ctx: int, user: UserConfig,
                notes: list[str]) -> PlanResult:
    setup = ServeSetup(speculative=_speculation(req, model), dtype=req.dtype, kv_dtype=req.kv_dtype, batch=req.batch, prompt_tokens=req.prompt,
                       new_tokens=req.new_tokens, runtime=req.runtime, tensor_parallel=req.tensor_parallel,
                       gpus_per_node=req.gpus_per_node, inter_node_bytes_per_second=req.inter_node_bytes_per_second,
                       max_num_batched_tokens=req.max_num_batched_tokens, nccl_record_streams=req.nccl_record_streams,
                       tp_shards_head=req.tp_shards_head, quantize_head=req.quantize_head,
                       nccl_communicators=req.nccl_communicators, int4_group_size=req.int4_group_size,
                       prefill_chunk_tokens=req.prefill_chunk_tokens, pipeline_parallel=req.pipeline_parallel,
                       prefix_hit_ratio=req.prefix_hit_ratio, fp8_activations=req.fp8_activations)
    if req.runtime_defaulted and req.runtime != "hf":
        notes.append(f"No --runtime given: a replica on {req.replica_gpus} GPUs is planned as vLLM serves it "
                     "(--runtime hf plans transformers' own, eager tensor parallelism instead).")
    setup = with_engine_defaults(setup, model, gpu.memory_bytes)  # SGLang's, TGI's own token budgets (serve_engine_rules)
    sp = plan_serving(model, setup, gpu, eff, tpot_target_seconds=req.tpot_target_seconds, cuda_context_bytes=ctx)
    mem = sp.memory
    advice: list[Advice] = []
    if not mem.fits:
        advice += [Advice.from_fix(f) for f in serving_fixes(model, setup, gpu, eff, ctx)]
    else:
        if sp.max_batch_that_fits > req.batch:
            advice.append(Advice("tip", f"Memory allows up to {sp.max_batch_that_fits} concurrent sequences of "
                                        f"{setup.context_tokens} tokens."))
        if req.runtime == "hf":
            advice.append(Advice("tip", "A serving engine (--runtime vllm) computes logits for the last position only "
                                        "and pages its KV cache: far more concurrency than transformers' generate."))
        cross_node = cross_node_tensor_parallel_tip(model, setup, gpu, eff, ctx, sp.speed)
        if cross_node:
            advice.append(Advice("tip", cross_node, change={"tensor_parallel": setup.gpus_per_node}))
    if sp.max_batch_for_tpot is not None:
        advice.append(Advice("note", f"The largest batch meeting TPOT <= {req.tpot_target_seconds * 1000:.0f} ms is "
                                     f"{sp.max_batch_for_tpot}." if sp.max_batch_for_tpot else
                             f"No batch meets TPOT <= {req.tpot_target_seconds * 1000:.0f} ms on one replica."))
    s = sp.speed
    if s.speculative is not None:
        advice.append(Advice("note", _speculation_note(model, setup, gpu, eff, sp.max_batch_that_fits)))
    if s.fp8_activation_quant_seconds:
        notes.append(f"FP8 activations scaled dynamically: an amax reduction and a cast per GEMM input, "
                     f"{s.fp8_activation_quant_seconds * 1000:.2f} ms of each decode step at batch {setup.batch} "
                     "(launch floors at decode sizes; --fp8-activations static for a checkpoint with calibrated scales).")
    if setup.dtype == "fp8" and setup.batch * setup.step_tokens < 16:
        notes.append("FP8 GEMMs at fewer than 16 rows are not priced beyond their bytes: cuBLASLt's FP8 kernels want "
                     "M >= 16 (vLLM pads the batch to 17 rows for torch._scaled_mm), so a per-tensor-scaled decode "
                     "at this batch may run slower than planned.")
    speed = s.to_dict() | {"max_batch_that_fits": sp.max_batch_that_fits, "max_concurrency": sp.max_concurrency,
                           "max_batch_for_tpot_target": sp.max_batch_for_tpot, "by_batch": sp.tpot_by_batch,
                           "kv_cache_bytes_per_token": sp.kv_cache_bytes_per_token}
    cost = serving_cost(gpu.hourly_price, req.replica_gpus, s.output_tokens_per_second, s.requests_per_second,
                        currency=user.currency, purchase_per_gpu=gpu.purchase_price)
    if cost is None:
        notes.append(f"No price for {gpu.name}: add one to {user.path} to see costs (gpulens invents no prices).")
    replicas: list[ReplicaOption] = []
    misses: list[ReplicaMiss] = []
    if replica_targets(req):
        replicas = replica_options(model, setup, [gpu], {gpu.name: eff}, target_rps=req.target_requests_per_second,
                                   tpot_slo_s=req.tpot_target_seconds, ttft_slo_s=req.ttft_target_seconds,
                                   currency=user.currency, ctx=ctx, misses=misses)
        if replicas and req.target_requests_per_second:
            o = replicas[0]
            how = (f" ({o.scheduling})" if o.utilization_ratio is not None else "")
            pp = f" x PP {o.pipeline_parallel}" if o.pipeline_parallel > 1 else ""
            advice.append(Advice("note", f"For {req.target_requests_per_second:g} requests/s: {o.replicas} replica(s) x "
                                         f"TP {o.tensor_parallel}{pp} = {o.gpus} x {o.gpu} at batch {o.batch}{how}."))
        elif not replicas:
            advice.append(Advice("note", f"No replica layout on {gpu.name} meets the latency targets"
                                         + (f": {misses[0].reason}." if misses else ".")))
    res = PlanResult(req, model, gpu, mem.fits, mem, speed, advice, eff, cost, replicas, notes + mem.notes)
    res.replica_misses = misses
    return res


def _speculation(req: PlanRequest, model: ModelSpec) -> SpeculativeSetup | None:
    """The draft model and its figures (None without --draft-model); the draft is resolved as --model is."""
    if req.draft_model is None:
        return None
    if req.acceptance_rate is None:
        raise BadInputError("--draft-model needs --acceptance-rate: how often the target accepts a draft token "
                            "decides whether speculation pays, and gpulens does not guess it.",
                            hint="Measure it (vLLM logs the draft acceptance rate) or pass e.g. --acceptance-rate 0.7.")
    try:
        draft = load_model(req.draft_model, assume_dense=req.assume_dense)
    except BadInputError as e:  # say which of the two models it is about
        raise BadInputError(f"--draft-model: {e.message}", hint=e.hint) from None
    return SpeculativeSetup(draft=draft, acceptance_ratio=req.acceptance_rate, tokens=req.speculative_tokens)


def _speculation_note(model: ModelSpec, setup: ServeSetup, gpu: GpuSpec, eff: Efficiency, max_fit: int) -> str:
    """Where speculation stops paying on this GPU: the verification of K + 1 tokens per sequence
    turns compute-bound as the batch grows."""
    spec = setup.speculative
    assert spec is not None
    at = break_even_batch(model, setup, gpu, eff)
    head = (f"Speculative decoding assumes K = {spec.tokens} guesses of {spec.draft.name} per step and an acceptance "
            f"rate of {spec.acceptance_ratio:g} per token (an input: measure it on your prompts). ")
    if at is None:
        return head + "It speeds decoding up at every batch up to 4,096 on this GPU."
    if at == 1:
        return head + ("It does not speed decoding up even at batch 1 here: the draft's steps cost more than the "
                       "accepted tokens save. Drop --draft-model, or use a smaller draft or a smaller K.")
    beyond = f" (more than the {max_fit} that fit here)" if at > max_fit else ""
    return head + (f"It pays at small batch (memory-bound steps) and slows decoding from about batch {at} on{beyond}: "
                   f"the verification of {spec.tokens + 1} tokens per sequence turns compute-bound. Turn it off for "
                   "large batches (vLLM's speculative_disable_by_batch_size).")


def replica_targets(req: PlanRequest) -> str:
    """The targets a replica plan is made for, in words ("" when none is given: no replica plan)."""
    parts = [f"{req.target_requests_per_second:g} requests/s"] if req.target_requests_per_second else []
    parts += [f"{n} <= {format_seconds(v)}" for n, v in (("TTFT", req.ttft_target_seconds),
                                                          ("TPOT", req.tpot_target_seconds)) if v]
    return ", ".join(parts)


@dataclass
class LeftOutGpu:
    """A GPU a comparison could not price, and why (one sentence)."""

    gpu: str
    reason: str


@dataclass
class Comparison:
    """The same plan on several GPUs: one result per GPU that can run it, and the GPUs left out
    (a card without the number format asked for: FP8 on an A100) with the reason."""

    results: list[PlanResult]
    left_out: list[LeftOutGpu] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"results": [r.to_dict() for r in self.results],
                "left_out": [{"gpu": x.gpu, "reason": x.reason} for x in self.left_out]}


def compare(req: PlanRequest, gpu_names: list[str], *, user: UserConfig | None = None,
            calibration_path: Path | None = None, batch_given: bool = True) -> Comparison:
    """The same plan on several GPUs, side by side. A GPU that lacks the requested number format
    is left out with its reason; only when none of them has it does the comparison refuse.

    Serving without a batch the user chose is priced at each GPU's throughput-optimal batch that
    fits (and meets the TPOT target, if any): batch 1 would price a card by its idlest use."""
    if not gpu_names:
        raise BadInputError("No GPUs to compare.", hint="Pass --gpu several times, e.g. --gpu h100-sxm --gpu h200.")
    user = user if user is not None else load_user_config()
    seen: dict[str, str] = {}
    for name in gpu_names:  # one card under two names (h100-sxm, H100-SXM) was compared with itself
        card = find_gpu(name, user=user).name
        if card in seen:
            raise BadInputError(f"--gpu names {card} twice ({shown(seen[card])} and {shown(name)}).",
                                hint="Give each GPU to compare once.")
        seen[card] = name
    model = _target_model(req)
    results: list[PlanResult] = []
    left_out: list[LeftOutGpu] = []
    refusals: list[UnsupportedPrecisionError] = []
    for name in gpu_names:
        one = PlanRequest(**(asdict(req) | {"gpu": name}))
        try:
            res = plan(one, model=model, user=user, calibration_path=calibration_path)
        except UnsupportedPrecisionError as e:
            refusals.append(e)
            left_out.append(LeftOutGpu(find_gpu(name, user=user).name, e.message))
            continue
        what = "micro-batch" if req.workload == "train" else "batch"
        res.cost_basis = f"at {what} {req.batch} ({'--batch' if batch_given else 'the default'})"
        if req.workload == "infer" and not batch_given and res.fits:
            res = _at_best_batch(one, res, model, user, calibration_path)
        results.append(res)
    if not results:  # no card has the format: the first refusal says what to do
        raise refusals[0]
    return Comparison(results, left_out)


def _at_best_batch(req: PlanRequest, res: PlanResult, model: ModelSpec, user: UserConfig,
                   calibration_path: Path | None) -> PlanResult:
    limit = res.speed["max_batch_that_fits"]
    why = "the throughput-optimal batch that fits"
    if res.speed.get("max_batch_for_tpot_target") is not None:
        limit = min(limit, res.speed["max_batch_for_tpot_target"])
        why = "the throughput-optimal batch that fits and meets the TPOT target"
    if limit < 1:
        res.cost_basis = f"at batch {req.batch} (no batch meets the TPOT target)"
        return res
    rows = [r for r in res.speed.get("by_batch", []) if r["batch"] <= limit]
    candidates = {int(max(rows, key=lambda r: r["output_tokens_per_second"])["batch"]) if rows else 1, int(limit)}

    def at(b: int) -> PlanResult:
        return plan(PlanRequest(**(asdict(req) | {"batch": b})), model=model, user=user, calibration_path=calibration_path)

    tried = []
    for b in sorted(candidates):
        r = at(b)
        # an engine's activations grow with the batch, so the pool at batch b can hold a little
        # less than it held at batch 1: step down to what it holds there
        while not r.fits and 1 <= r.speed["max_batch_that_fits"] < r.request.batch:
            r = at(r.speed["max_batch_that_fits"])
        tried.append(r)
    best = max((r for r in tried if r.fits), key=lambda r: r.speed["output_tokens_per_second"], default=res)
    best.cost_basis = f"at batch {best.request.batch} ({why})"
    return best
