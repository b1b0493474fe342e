"""The options of `gpulens plan` and `plan compare`, declared once: the CLI generates its flags
from these fields (so the two commands cannot drift apart), and `to_request` turns the raw values
into a validated `PlanRequest` (workload aliases, defaults that depend on the workload, the
serving rule that N GPUs of one replica means tensor parallelism N, durations parsed)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from gpulens.errors import BadInputError, shown
from gpulens.plan.advice import replica_degrees
from gpulens.plan.models import load_model
from gpulens.plan.planner import PlanRequest
from gpulens.plan.serve_engines import check_engine_options
from gpulens.plan.speculative import DEFAULT_SPECULATIVE_TOKENS
from gpulens.units import parse_duration

# What each number may be: beyond these a plan means nothing (and a float must be finite).
OPTION_RANGES: dict[str, tuple[float, float]] = {
    "gpus": (1, 1 << 20), "batch": (1, 1 << 24), "seq": (1, 1 << 26), "grad_accum": (1, 1 << 20),
    "lora_rank": (1, 1 << 16), "nodes": (1, 1 << 16), "gpus_per_node": (1, 1 << 12), "inter_node_gbps": (1e-3, 1e6),
    "zero": (0, 3), "prompt": (1, 1 << 26), "new_tokens": (1, 1 << 26), "tp": (1, 1 << 12), "pp": (1, 1 << 12),
    "max_num_batched_tokens": (1, 1 << 26), "prefill_chunk_tokens": (1, 1 << 26), "nccl_communicators": (0, 64),
    "target_rps": (1e-9, 1e9), "electricity_usd_per_kwh": (0, 100), "power_fraction": (0.01, 1.5), "pue": (1, 5),
    "speculative_tokens": (1, 32), "ep": (1, 1 << 12), "virtual_stages": (1, 1 << 12), "cp": (1, 1 << 12),
    "prefix_hit_ratio": (0, 1),
}

def _num(v: float) -> str:
    return f"{int(v):,}" if v == int(v) and abs(v) >= 1 else f"{v:g}"


WORKLOAD_ALIASES = {"inference": "infer", "serve": "infer", "serving": "infer"}
DEFAULT_BATCH = {"train": 8, "infer": 1}
DEFAULT_GPUS_PER_NODE = 8
SPECULATIVE_OPTIONS = ("draft_model", "speculative_tokens", "acceptance_rate")  # serving only (plan/speculative.py)
# options of one workload, refused on a plan for the other
TRAIN_ONLY = ("precision", "optimizer", "seq", "grad_accum", "grad_ckpt", "recompute", "finetune", "zero", "zero_layout",
              "backward_prefetch", "reduce_dtype", "sp", "virtual_stages", "cp", "loss", "megatron_core", "attention_kernel",
              "lora_rank", "lora_targets", "lora_dtype", "lora_optimizer_dtype", "lora_engine", "qlora_double_quant", "ep",
              "offload")
SERVE_ONLY = ("dtype", "kv_dtype", "prompt", "new_tokens", "runtime", "tpot_target", "ttft_target", "target_rps",
              "max_num_batched_tokens", "prefill_chunk_tokens", "nccl_record_streams", "nccl_communicators", "tp_shards_head",
              "quantize_head", "int4_group_size", "prefix_hit_ratio", "fp8_activations")


def _opt(flags: tuple[str, ...], help: str, default: Any = None) -> Any:  # noqa: A002 - the CLI's word
    return field(default=default, metadata={"flags": flags, "help": help})


@dataclass(frozen=True)
class PlanOptions:
    """Raw values as a user gives them; `None` means "not given"."""

    model: str | None = _opt(("--model", "-m"), "config.json path or folder, preset name, or a size such as 7b.")
    workload: str = _opt(("--workload", "-w"), "train or infer.", "train")
    gpus: int = _opt(("--gpus",), "Training: number of GPUs (data parallel; with --zero, sharded). "
                                 "Serving: GPUs per replica (= --tp x --pp).", 1)
    precision: str | None = _opt(("--precision",), "Training: fp32, amp_bf16, amp_fp16 (fp32 weights, 16-bit "
                                                   "autocast), bf16, fp16 (weights and states in 16-bit), fp8 "
                                                   "(Transformer Engine: the blocks' Linear GEMMs in FP8, the rest as "
                                                   "amp_bf16; Hopper, Ada, Blackwell, MI300X). Default: amp_bf16; "
                                                   "bf16 with --finetune lora or qlora.")
    optimizer: str = _opt(("--optimizer",), "adamw, sgd, sgd-momentum, adafactor, adamw8bit.", "adamw")
    batch: int | None = _opt(("--batch", "-b"), "Training: micro-batch per GPU (default 8). "
                                                "Serving: concurrent sequences (default 1).")
    seq: int = _opt(("--seq", "-s"), "Training: sequence length in tokens.", 2048)
    grad_accum: int = _opt(("--grad-accum",), "Training: micro-batches per optimizer step.", 1)
    grad_ckpt: bool = _opt(("--grad-ckpt/--no-grad-ckpt",), "Training: activation checkpointing per layer "
                                                          "(= --recompute full).", False)
    recompute: str | None = _opt(("--recompute",), "Training: none, selective (recompute only the attention core: "
                                                   "Korthikanti et al. 2022) or full (= --grad-ckpt).")
    finetune: str = _opt(("--finetune",), "Training: full, lora or qlora (frozen base, fp32 adapters unless --lora-dtype; QLoRA keeps the "
                                          "base in 4-bit NF4), planned at --precision bf16 unless given.", "full")
    lora_rank: int = _opt(("--lora-rank",), "Training: LoRA rank r.", 16)
    lora_targets: str = _opt(("--lora-targets",), "Training: all (every Linear of the blocks) or qv (q_proj, v_proj).",
                             "all")
    lora_dtype: str | None = _opt(("--lora-dtype",), "Training: LoRA adapters' weights and gradients, fp32 (peft's "
                                                     "default) or bf16 (peft with autocast_adapter_dtype=False; LitGPT's "
                                                     "bf16-true, the default with --lora-engine litgpt).")
    lora_optimizer_dtype: str | None = _opt(("--lora-optimizer-dtype",), "Training: the adapters' AdamW moments, fp32 "
                                                                         "or bf16 (default: --lora-dtype; fp32 moments "
                                                                         "with bf16 adapters add an fp32 master copy).")
    lora_engine: str = _opt(("--lora-engine",), "Training: the code that runs the LoRA step: peft (peft + transformers) "
                                                "or litgpt (LitGPT's finetune/lora.py on one GPU, bf16-true: fused qkv "
                                                "adapter with dropout, bf16 RMSNorm, fp32 logits; QLoRA quantizes the "
                                                "output head too).", "peft")
    qlora_double_quant: bool = _opt(("--qlora-double-quant/--no-qlora-double-quant",), "Training, QLoRA: NF4 with "
                                    "double quantization (8-bit block scales: 0.516 bytes a weight, the QLoRA paper's "
                                    "set-up) or without (an fp32 scale per 64 weights: 0.5625).", True)
    nodes: int | None = _opt(("--nodes",), "Nodes of --gpus-per-node GPUs (sets --gpus to their product when "
                                           "--gpus is not given).")
    gpus_per_node: int = _opt(("--gpus-per-node",), "GPUs per node: collectives within a node use the GPU's "
                                                    "interconnect, across nodes the network.", DEFAULT_GPUS_PER_NODE)
    inter_node_gbps: float = _opt(("--inter-node-gbps",), "Network send rate per GPU across nodes, GB/s one way "
                                                         "(400 Gb/s InfiniBand NDR per GPU = 50; 100 GbE = 12.5).", 50.0)
    zero: int = _opt(("--zero",), "Training: ZeRO stage 0-3 across --gpus (3 = FSDP full sharding).", 0)
    zero_layout: str = _opt(("--zero-layout",), "Training: what --zero shards under amp: fsdp (PyTorch: fp32 weights "
                                                "and gradients, moments sharded) or deepspeed (16-bit weights and "
                                                "gradients, fp32 master copy sharded with the moments: ZeRO paper) "
                                                "or fsdp-bf16 (FSDP MixedPrecision, Composer/llm-foundry: fp32 shards, "
                                                "each unit gathered and computed in bf16); Megatron plans also "
                                                "apex-distributed-adam (NeMo's distributed_fused_adam: bf16 module, "
                                                "whole fp32 gradient buffer, fp32 moments, gradient shards and param "
                                                "remainders sharded: 6 + 14/d bytes; with --reduce-dtype bf16, a bf16 "
                                                "gradient buffer: 4 + 12/d) or apex-distributed-adam-bf16 "
                                                "(its optim.dtype bf16: 4 + 6/d).",
                            "fsdp")
    backward_prefetch: str = _opt(("--backward-prefetch",), "Training, --zero 3: FSDP's backward prefetch: pre "
                                  "(default: BACKWARD_PRE, as FSDP, FSDP2 and DeepSpeed prefetch), post (BACKWARD_POST, "
                                  "Composer's default; priced as pre) or none (NO_PREFETCH, the default of transformers' Trainer and HF Accelerate: the "
                                  "backward's all-gathers and reduce-scatters do not overlap its compute).", "pre")
    reduce_dtype: str | None = _opt(("--reduce-dtype",), "Training, --zero 3 or an apex-distributed-adam layout: the "
                                    "dtype gradients are reduce-scattered in: fp32 (the default under amp; FSDP "
                                    "MixedPrecision(reduce_dtype=float32), Composer DEFAULT; NeMo's distributed Adam "
                                    "with fp32 moments) or bf16 (half the bytes: Composer PURE; NeMo's "
                                    "optim.grad_sync_dtype=bf16, whose gradient buffer is then bf16 too).")
    loss: str = _opt(("--loss",), "Training: torch (transformers upcasts the logits to fp32) or fused (an in-place "
                                  "16-bit cross-entropy kernel, llm-foundry's default) or vocab-parallel (Megatron-Core's "
                                  "cross-entropy, fused or not: bf16 logits and an in-place fp32 softmax per "
                                  "tensor-parallel vocabulary shard).", "torch")
    megatron_core: bool = _opt(("--megatron-core/--no-megatron-core",), "Training: plan the run as Megatron-Core "
                               "(bf16 module with fp32 main grads, Megatron's activations, output layer and loss) even "
                               "at --tp 1 --pp 1 --cp 1, as NeMo trains; implied by --tp/--pp/--cp above 1.", False)
    dtype: str = _opt(("--dtype",), "Serving: weight format fp32, bf16, fp16, fp8, int8, int4.", "bf16")
    kv_dtype: str | None = _opt(("--kv-dtype",), "Serving: KV-cache format (default: the compute dtype; fp8 halves it).")
    prompt: int = _opt(("--prompt",), "Serving: prompt tokens per request.", 512)
    new_tokens: int = _opt(("--new-tokens",), "Serving: generated tokens per request.", 128)
    runtime: str | None = _opt(("--runtime",), "Serving: hf (transformers generate), or an engine: vllm, sglang, tgi, "
                                                 "trtllm (CUDA graphs, preallocated paged KV cache; trtllm: 90 % of the "
                                                 "memory left free, 64-token blocks). Default: hf on one GPU, vllm for a "
                                                 "replica on several (--tp, --pp or --gpus above 1).")
    max_num_batched_tokens: int | None = _opt(("--max-num-batched-tokens",), "Serving, engine: tokens of the "
                                              "profiling forward whose activation peak the KV pool leaves room for "
                                              "(vLLM's and trtllm's default 8,192; vLLM 0.2.x used max(max_model_len, "
                                              "2048); tgi: its warmup, --max-batch-prefill-tokens, default "
                                              "min(max_position_embeddings, 4096) + 49; refused with sglang, which "
                                              "profiles none).")
    prefill_chunk_tokens: int | None = _opt(("--prefill-chunk-tokens",), "Serving, engine, replica plans: the "
                                            "scheduler's per-step token budget that running decodes and chunked "
                                            "prompts share (default: the engine's own; vllm, trtllm "
                                            "--max-num-batched-tokens, which sets both; tgi "
                                            "--max-batch-prefill-tokens, likewise; sglang --chunked-prefill-size, "
                                            "2048 on a GPU under 25,000 MiB, else 8192).")
    nccl_record_streams: bool = _opt(("--nccl-record-streams/--no-nccl-record-streams",), "Serving, engine at TP > 1: "
                                     "PyTorch's NCCL process group marks all-reduced tensors with record_stream, so the "
                                     "profiling forward keeps every one reserved (vLLM <= 0.2.6; "
                                     "TORCH_NCCL_AVOID_RECORD_STREAMS=1 turns it off).", False)
    nccl_communicators: int = _opt(("--nccl-communicators",), "Serving, engine at TP > 1: NCCL communicators on "
                                   "each GPU when the engine sizes its KV pool, ~688 MB each (vLLM 0.2.x made 2: a "
                                   "warm-up on the default group, then the TP group).", 1)
    tp_shards_head: bool = _opt(("--tp-shards-head/--no-tp-shards-head",), "Serving at TP > 1: the output head is "
                                "split over the TP group (vLLM, SGLang, TGI); --no-tp-shards-head for an engine that "
                                "splits only the transformer blocks (gpt-fast), where every GPU reads the whole head "
                                "each step.", True)
    quantize_head: bool = _opt(("--quantize-head/--no-quantize-head",), "Serving with --dtype int8/int4/fp8: the "
                               "output head is quantized too (gpt-fast quantizes every Linear); by default it stays "
                               "16-bit, as GPTQ/AWQ/FP8 checkpoints ship it.", False)
    int4_group_size: int = _opt(("--int4-group-size",), "Serving with --dtype int4: weights per fp16 scale and "
                                "zero point (4 bytes a group: GPTQ/AWQ 128, the default; gpt-fast's int4 benchmarks "
                                "32, which adds 0.125 bytes per weight).", 128)
    tp: int | None = _opt(("--tp",), "Serving: tensor-parallel GPUs per replica (default --gpus). Training: "
                                      "Megatron-style tensor parallelism inside --gpus (GPUs = data x tensor x "
                                      "pipeline parallel; default 1).")
    pp: int = _opt(("--pp",), "Training: pipeline-parallel stages (1F1B schedule) inside --gpus. Serving, engine "
                              "(vllm, sglang, trtllm): pipeline stages per replica, layers/N each (GPUs per replica = "
                              "--tp x --pp).", 1)
    fp8_activations: str = _opt(("--fp8-activations",), "Serving, --dtype fp8: dynamic (default: each GEMM input "
                                "scaled at run time, an amax reduction and a cast per input every step: vLLM's online "
                                "fp8, torchao) or static (calibrated scales in the checkpoint: TensorRT-LLM / ModelOpt).",
                                "dynamic")
    prefix_hit_ratio: float = _opt(("--prefix-hit-ratio",), "Serving, engine: share of each prompt's tokens found in "
                                   "the prefix cache, 0 <= R < 1 (vLLM automatic prefix caching, SGLang RadixAttention): "
                                   "the prefill computes the other (1 - R) of them.", 0.0)
    sp: bool = _opt(("--sp/--no-sp",), "Training: sequence parallelism along the tensor-parallel group.", False)
    ep: int = _opt(("--ep",), "Training, MoE: expert parallelism inside --gpus: each GPU holds 1/N of every MoE "
                              "layer's experts, two all-to-alls per layer forward and two backward (GShard).", 1)
    offload: str = _opt(("--offload",), "Training: none, or optimizer (ZeRO-Offload: fp32 master weights and Adam "
                                        "states in CPU memory, the Adam step on the CPU; with --zero 1-3 and "
                                        "--zero-layout deepspeed).", "none")
    virtual_stages: int = _opt(("--virtual-stages",), "Training, with --pp: model chunks per pipeline stage; 2 or "
                                                      "more = Megatron's interleaved 1F1B schedule (bubble / V, "
                                                      "stage-to-stage traffic x V). Default 1: plain 1F1B.", 1)
    cp: int = _opt(("--cp",), "Training: context-parallel GPUs inside --gpus (GPUs = data x tensor x context x "
                              "pipeline parallel): each holds 1/cp of the sequence, attention as ring attention "
                              "(Megatron-Core). Default 1.", 1)
    attention_kernel: str = _opt(("--attention-kernel",), "Training: the attention kernel, priced at its measured "
                                                          "speed on A100 / H100: auto (what PyTorch SDPA picks: "
                                                          "FlashAttention-2 in 16-bit), flash3 (FlashAttention-3, "
                                                          "H100/H200 only), cudnn (cuDNN's fused attention as "
                                                          "Transformer Engine runs it, H100/H200 only), flash2, flash1, triton "
                                                          "(FlashAttention's Triton port, llm-foundry's attn_impl: triton), "
                                                          "or eager (unfused: the S x S scores in memory, as transformers' "
                                                          "eager attention and Megatron-LM before FlashAttention).",
                                 "auto")
    draft_model: str | None = _opt(("--draft-model",), "Serving, engine: speculative decoding with this draft model "
                                   "(config.json path or folder, or preset name, as --model; same vocabulary, smaller): "
                                   "it proposes --speculative-tokens guesses a step, the target verifies them in one "
                                   "forward (Leviathan et al. 2023).")
    speculative_tokens: int | None = _opt(("--speculative-tokens",), "Serving, with --draft-model: K, the draft's guesses "
                                          "per step (default 4).")
    acceptance_rate: float | None = _opt(("--acceptance-rate",), "Serving, with --draft-model (required): alpha, the "
                                         "probability that the target accepts one draft token, 0 < alpha < 1 "
                                         "(vLLM logs it as the draft acceptance rate).")
    tpot_target: str | None = _opt(("--tpot-target",), "Serving: per-token latency target, e.g. 50ms.")
    ttft_target: str | None = _opt(("--ttft-target",), "Serving: first-token latency target, e.g. 2s.")
    target_rps: float | None = _opt(("--target-rps",), "Serving: requests per second to plan replicas for.")
    electricity_usd_per_kwh: float | None = _opt(("--electricity-usd-per-kwh",), "Electricity price: adds the GPUs' "
                                                 "electricity cost, estimated from their TDP (see --power-fraction, --pue).")
    power_fraction: float = _opt(("--power-fraction",), "With --electricity-usd-per-kwh: the share of TDP the GPUs "
                                 "draw on average (default 1: TDP, an upper bound for most runs).", 1.0)
    pue: float = _opt(("--pue",), "With --electricity-usd-per-kwh: the site's power usage effectiveness (facility "
                      "power over IT power; default 1: the GPUs only).", 1.0)
    assume_dense: bool = _opt(("--assume-dense/--no-assume-dense",), "Plan a config whose model_type is not a "
                                                                      "supported family as a dense LLaMA-like model "
                                                                      "(the plan warns).", False)
    # Not an option: the options the user set, as the CLI saw them (so `--seq 2048` on a serving plan
    # is refused although 2048 is --seq's default); None (from Python) judges by the value instead.
    given: frozenset[str] | None = field(default=None, repr=False)

    @classmethod
    def names(cls) -> list[str]:
        """The options (every field but `given`)."""
        return [f.name for f in fields(cls) if "flags" in f.metadata]

    def flag(self, name: str) -> str:
        """Option `name` as typed: `--no-grad-ckpt` for a switch set off, else its long flag."""
        flags = next(f.metadata["flags"][0] for f in fields(self) if f.name == name)
        on, _, off = flags.partition("/")
        return off if off and getattr(self, name) is False else on

    def is_given(self, name: str) -> bool:
        """Whether the user set option `name`: typed on the command line, even at its default value;
        without the CLI's record, set away from its default."""
        if self.given is not None:
            return name in self.given
        return bool(getattr(self, name) != next(f.default for f in fields(self) if f.name == name))

    @property
    def workload_name(self) -> str:
        w = WORKLOAD_ALIASES.get(self.workload, self.workload)
        if w not in ("train", "infer"):
            raise BadInputError(f"Unknown workload {self.workload!r}.", hint="Use --workload train or --workload infer.")
        return w

    @property
    def precision_name(self) -> str:
        """--precision, or its default: amp_bf16 for full training; bf16 for LoRA / QLoRA, whose frozen base
        is stored in 16-bit, not cast under autocast (peft's and LitGPT's usual set-up)."""
        if self.precision is not None:
            return self.precision.lower()
        return "bf16" if self.finetune.lower() in ("lora", "qlora") else "amp_bf16"

    @property
    def batch_given(self) -> bool:
        return self.batch is not None

    def check_ranges(self) -> None:
        """Every number the user typed, finite and within what a plan can mean (one sentence, exit 2)."""
        for name, (lo, hi) in OPTION_RANGES.items():
            v = getattr(self, name, None)
            if v is None:
                continue
            if not math.isfinite(v) or not lo <= v <= hi:
                flag = self.flag(name)
                raise BadInputError(f"{flag} must be between {_num(lo)} and {_num(hi)}, not {v!r}.", hint=f"Give {flag} a value in that range.")

    def check_combinations(self, workload: str, gpus: int) -> None:
        """Refuse what a plan would silently ignore: an option of the other workload given (typed on
        the command line, even at its default value: `is_given`), LoRA settings without LoRA, a ZeRO
        layout without ZeRO, and serving GPUs that are not the replica's tensor-parallel group (one
        sentence, exit 2)."""
        if self.electricity_usd_per_kwh is None:
            for name in ("power_fraction", "pue"):
                if self.is_given(name):
                    flag = self.flag(name)
                    raise BadInputError(f"{flag} shapes the electricity cost, and no --electricity-usd-per-kwh is given.",
                                        hint=f"Add --electricity-usd-per-kwh PRICE, or drop {flag}.")
        other = TRAIN_ONLY if workload == "infer" else SERVE_ONLY + SPECULATIVE_OPTIONS
        for name in other:
            if self.is_given(name):
                flag = self.flag(name)
                what, wl = ("training", "train") if workload == "infer" else ("serving", "infer")
                raise BadInputError(f"{flag} is a {what} option, and this plan is for --workload {workload}.",
                                    hint=f"Drop {flag}, or plan with --workload {wl}.")
        if workload == "train":
            if self.finetune == "full":
                for name in ("lora_rank", "lora_targets", "lora_dtype", "lora_optimizer_dtype", "lora_engine",
                             "qlora_double_quant"):
                    if self.is_given(name):
                        flag = self.flag(name)
                        raise BadInputError(f"{flag} applies to LoRA, and --finetune is full.",
                                            hint=f"Add --finetune lora (or qlora), or drop {flag}.")
            if self.lora_optimizer_dtype and self.optimizer.lower() not in ("adamw", "adamw8bit"):
                raise BadInputError(f"--lora-optimizer-dtype sets AdamW's moments, and --optimizer {self.optimizer} "
                                    "keeps none of that kind.", hint="Use --optimizer adamw, or drop --lora-optimizer-dtype.")
            if self.finetune.lower() == "lora" and self.is_given("qlora_double_quant"):
                flag = self.flag("qlora_double_quant")
                raise BadInputError(f"{flag} says how QLoRA stores the base, and --finetune is lora.",
                                    hint=f"Use --finetune qlora, or drop {flag}.")
            recompute = ("none" if self.recompute is None else self.recompute).lower()
            if recompute not in ("none", "selective", "full"):
                raise BadInputError(f"Unknown recomputation {self.recompute!r}.", hint="Use --recompute none, selective or full.")
            if self.grad_ckpt and recompute != "full" and self.recompute is not None:
                raise BadInputError(f"--grad-ckpt recomputes whole layers, and --recompute {recompute} says otherwise.",
                                    hint="Drop --grad-ckpt, or use --recompute full alone.")
            if self.is_given("zero_layout") and not self.zero:
                raise BadInputError("--zero-layout says how ZeRO shards, and --zero is 0.", hint="Add --zero 1, 2 or 3, or drop --zero-layout.")
            fsdp = (self.zero == 3 and gpus >= 2 and (self.tp or 1) == 1 and self.pp == 1 and self.cp == 1
                    and self.finetune.lower() == "full")
            apex = self.zero_layout.lower().startswith("apex")  # --reduce-dtype: its grad_sync_dtype (plan/nemo_optim.py)
            for name in ("backward_prefetch", "reduce_dtype"):
                if self.is_given(name) and not fsdp and not (apex and name == "reduce_dtype"):
                    flag = self.flag(name)
                    nemo = name == "reduce_dtype"
                    raise BadInputError(f"{flag} shapes FSDP / ZeRO-3's per-layer gathers and reduce-scatters"
                                        + (" (or NeMo's distributed Adam's gradient sync)" if nemo else "") + ", which "
                                        "this plan does not run: they need --zero 3 on 2 or more GPUs, full fine-tuning "
                                        "and no --tp, --pp or --cp.",
                                        hint="Add --zero 3 with --gpus 2 or more"
                                        + (", or --zero 1 --zero-layout apex-distributed-adam on a Megatron plan" if nemo else "")
                                        + f", or drop {flag}.")
        elif self.prefill_chunk_tokens is not None and self.resolved_runtime(workload, gpus) == "hf":
            raise BadInputError("--prefill-chunk-tokens sets a serving engine's per-step budget, and --runtime hf "
                                "prefills whole batches.", hint="Add --runtime vllm (or sglang, tgi), or drop --prefill-chunk-tokens.")
        elif self.is_given("fp8_activations") and self.dtype.lower() != "fp8":
            raise BadInputError(f"--fp8-activations says how FP8 GEMMs scale their inputs, and --dtype is {self.dtype}.",
                                hint="Add --dtype fp8, or drop --fp8-activations.")
        elif self.is_given("int4_group_size") and self.dtype.lower() != "int4":
            raise BadInputError(f"--int4-group-size says how int4 weights are scaled, and --dtype is {self.dtype}.",
                                hint="Add --dtype int4, or drop --int4-group-size.")
        elif self.pp == 1 and self.tp is not None and gpus > 1 and self.tp != gpus:
            raise BadInputError(f"--gpus {gpus} with --tp {self.tp}: serving one replica on {gpus} GPUs is tensor "
                                f"parallelism {gpus}.", hint=f"Give --tp {gpus}, or drop --gpus (plan replicas with --target-rps).")
        if workload == "infer":
            self.check_speculation()
            self.check_serving_stages(gpus)
            self.check_serving_details(gpus)
        self.check_cluster(workload, gpus)

    def check_cluster(self, workload: str, gpus: int) -> None:
        """--inter-node-gbps prices traffic between nodes, and --gpus-per-node where a node ends: each
        is refused when every GPU the plan prices sits in one node either way (one replica, or the
        widest degree a replica plan tries). --nodes always uses --gpus-per-node."""
        span = max(gpus, self.replica_tp(workload, gpus) * self.pp) if workload == "infer" else gpus
        where = "this plan runs on one GPU" if span == 1 else f"this plan's {span} GPUs fit in one node"
        if workload == "infer" and (self.tpot_target or self.ttft_target or self.target_rps):
            widest = max(replica_degrees(load_model(self.model or "", assume_dense=self.assume_dense)), default=1)
            if widest * self.pp > span:
                span = widest * self.pp
                where = f"the widest replica its replica plan tries ({span} GPUs) fits in one node"
        if self.is_given("inter_node_gbps") and span <= self.gpus_per_node:
            raise BadInputError(f"--inter-node-gbps prices the network between nodes, and {where}"
                                + (f" of {self.gpus_per_node}." if span > 1 else "."),
                                hint="Drop --inter-node-gbps, or plan more GPUs than a node holds (--nodes 2, or a "
                                     "smaller --gpus-per-node).")
        if (self.nodes is None and self.is_given("gpus_per_node")
                and span <= min(self.gpus_per_node, DEFAULT_GPUS_PER_NODE)):
            raise BadInputError(f"--gpus-per-node {self.gpus_per_node} changes nothing here: {where}"
                                + (" either way." if span > 1 else "."),
                                hint="Drop --gpus-per-node, or plan more GPUs than a node holds (--nodes 2).")

    def resolved_runtime(self, workload: str, gpus: int) -> str:
        """--runtime, or its default: transformers' generate on one GPU; vLLM for a replica on several,
        since transformers' own tensor parallelism (tp_plan="auto") is eager and its docs advise it
        within one node only (a sharded replica is what engines are for)."""
        if self.runtime is not None:
            return self.runtime.lower()
        return "vllm" if workload == "infer" and (self.replica_tp(workload, gpus) > 1 or self.pp > 1) else "hf"

    def replica_tp(self, workload: str, gpus: int) -> int:
        """--tp, or its default: serving one replica on N GPUs is TP N / --pp; training 1."""
        return self.tp if self.tp is not None else (max(1, gpus // self.pp) if workload == "infer" else 1)

    def check_serving_stages(self, gpus: int) -> None:
        """Serving --pp, --prefix-hit-ratio and --max-num-batched-tokens (not sglang): engines only; GPUs = --tp x --pp."""
        runtime = self.resolved_runtime("infer", gpus)
        if self.prefix_hit_ratio >= 1:
            raise BadInputError(f"--prefix-hit-ratio must be below 1, not {self.prefix_hit_ratio!r}: a request "
                                "computes at least its last prompt token.", hint="Give e.g. --prefix-hit-ratio 0.5.")
        if self.prefix_hit_ratio > 0 and runtime == "hf":
            raise BadInputError("--prefix-hit-ratio describes an engine's prefix cache, and --runtime hf recomputes "
                                "every prompt.", hint="Add --runtime vllm (or sglang, tgi, trtllm), or drop --prefix-hit-ratio.")
        check_engine_options(runtime, self.max_num_batched_tokens)
        if self.pp == 1:
            return
        if runtime in ("hf", "tgi"):
            what = ("transformers' generate has no pipeline schedule (device_map=\"auto\" runs its GPUs one at a time)"
                    if runtime == "hf" else "TGI shards only by tensor parallelism")
            raise BadInputError(f"--pp {self.pp} splits a model into pipeline stages, and {what}.",
                                hint="Use --runtime vllm, sglang or trtllm with --pp, or drop --pp (use --tp).")
        tp = self.replica_tp("infer", gpus)
        if gpus > 1 and tp * self.pp != gpus:
            raise BadInputError(f"--gpus {gpus} is not --tp {tp} x --pp {self.pp}: one replica's GPUs are its "
                                "tensor-parallel group times its pipeline stages.",
                                hint=f"Give --gpus {tp * self.pp}, or drop --gpus (plan replicas with --target-rps).")

    def check_serving_details(self, gpus: int) -> None:
        """Serving options that describe a part this plan does not have: an engine's profiling forward or NCCL
        set-up on transformers' generate or one GPU, a head split over a TP group of one, a 16-bit head
        "quantized", a scheduler budget with no replica plan to use it (one sentence, exit 2)."""
        runtime, tp = self.resolved_runtime("infer", gpus), self.replica_tp("infer", gpus)
        if self.kv_dtype is not None and not self.kv_dtype.strip():  # the planner reads "" as "not given"
            raise BadInputError(f"Unknown KV-cache dtype {shown(self.kv_dtype)}.", hint="Use --kv-dtype bf16, fp16, fp8 or fp32, or drop it.")
        if self.max_num_batched_tokens is not None and runtime == "hf":
            raise BadInputError("--max-num-batched-tokens sizes an engine's profiling forward, and --runtime hf "
                                "preallocates nothing.", hint="Add --runtime vllm (or trtllm, tgi), or drop --max-num-batched-tokens.")
        nccl = [f for f, given in (("--nccl-record-streams", self.nccl_record_streams),
                                   ("--nccl-communicators", self.is_given("nccl_communicators"))) if given]
        if nccl and (runtime == "hf" or tp == 1):
            why = "--runtime hf preallocates no KV pool for it to shrink" if runtime == "hf" else "this replica runs on one GPU"
            raise BadInputError(f"{nccl[0]} describes an engine's NCCL set-up across a tensor-parallel group, and {why}.",
                                hint=f"Give --tp 2 or more with an engine runtime, or drop {nccl[0]}.")
        if self.is_given("tp_shards_head") and tp == 1:  # either way: a one-GPU replica has no group to split over
            flag = self.flag("tp_shards_head")
            raise BadInputError(f"{flag} says how the output head is read across a tensor-parallel group, and this "
                                "replica runs on one GPU.", hint=f"Give --tp 2 or more, or drop {flag}.")
        if self.quantize_head and self.dtype.lower() in ("fp32", "bf16", "fp16"):
            raise BadInputError(f"--quantize-head stores the head in the weight format, and --dtype {self.dtype} is not "
                                "a quantized one.", hint="Add --dtype int8, int4 or fp8, or drop --quantize-head.")
        if self.prefill_chunk_tokens is not None and not (self.target_rps or self.ttft_target or self.tpot_target):
            raise BadInputError("--prefill-chunk-tokens sets the scheduler budget of the replica plan's continuous "
                                "batching, and no replica plan is asked for.",
                                hint="Add --target-rps, --ttft-target or --tpot-target, or drop --prefill-chunk-tokens.")

    def check_speculation(self) -> None:
        """--speculative-tokens and --acceptance-rate describe a --draft-model (plan/speculative.py)."""
        if self.draft_model is None and (self.speculative_tokens is not None or self.acceptance_rate is not None):
            flag = "--speculative-tokens" if self.speculative_tokens is not None else "--acceptance-rate"
            raise BadInputError(f"{flag} describes speculative decoding, and no --draft-model is given.",
                                hint=f"Add --draft-model NAME (e.g. llama-3.2-1b), or drop {flag}.")
        if self.acceptance_rate is not None and not 0.0 < self.acceptance_rate < 1.0:
            raise BadInputError(f"--acceptance-rate must lie strictly between 0 and 1, not {self.acceptance_rate!r}.",
                                hint="Give the probability that the target accepts one draft token, e.g. 0.7.")

    def to_request(self, gpu: str) -> PlanRequest:
        self.check_ranges()
        if self.model is None:
            raise BadInputError("No model given.", hint="Pass --model PATH|PRESET|SIZE, e.g. --model llama-3-8b.")
        workload = self.workload_name
        gpus = self.gpus
        if self.nodes is not None:
            if self.nodes < 1:
                raise BadInputError(f"The number of nodes must be at least 1, not {self.nodes}.", hint="Pass --nodes 1 or more.")
            if gpus == 1:
                gpus = self.nodes * self.gpus_per_node
            elif gpus != self.nodes * self.gpus_per_node:
                raise BadInputError(f"--gpus {gpus} is not --nodes {self.nodes} x --gpus-per-node {self.gpus_per_node}.",
                                    hint="Give --nodes with --gpus-per-node, or --gpus alone.")
        self.check_combinations(workload, gpus)
        tp = self.replica_tp(workload, gpus)
        return PlanRequest(
            model=self.model, workload=workload, gpu=gpu, gpus=gpus, precision=self.precision_name,  # type: ignore[arg-type]
            optimizer=self.optimizer.lower(), batch=self.batch if self.batch is not None else DEFAULT_BATCH[workload],
            seq=self.seq, grad_accum=self.grad_accum, grad_ckpt=self.grad_ckpt or (self.recompute or "").lower() == "full",
            recompute=(self.recompute or ("full" if self.grad_ckpt else "none")).lower(), zero=self.zero,
            zero_layout=self.zero_layout.lower(), loss=self.loss.lower(), finetune=self.finetune.lower(), lora_rank=self.lora_rank,
            lora_targets=self.lora_targets.lower(), lora_engine=self.lora_engine.lower(),
            lora_dtype=(self.lora_dtype or ("bf16" if self.lora_engine.lower() == "litgpt" else "fp32")).lower(),
            qlora_double_quant=self.qlora_double_quant,
            lora_optimizer_dtype=self.lora_optimizer_dtype.lower() if self.lora_optimizer_dtype else None, pipeline_parallel=self.pp, sequence_parallel=self.sp,
            expert_parallel=self.ep, offload=self.offload.lower(), backward_prefetch=self.backward_prefetch.lower(),
            reduce_dtype=self.reduce_dtype.lower() if self.reduce_dtype else None, megatron_core=self.megatron_core,
            virtual_stages=self.virtual_stages, context_parallel=self.cp,
            attention_kernel=self.attention_kernel.lower(), dtype=self.dtype.lower(),
            kv_dtype=self.kv_dtype.lower() if self.kv_dtype else None, prompt=self.prompt, new_tokens=self.new_tokens,
            runtime=self.resolved_runtime(workload, gpus), runtime_defaulted=self.runtime is None, tensor_parallel=tp, max_num_batched_tokens=self.max_num_batched_tokens,
            prefill_chunk_tokens=self.prefill_chunk_tokens,
            nccl_record_streams=self.nccl_record_streams, nccl_communicators=self.nccl_communicators,
            tp_shards_head=self.tp_shards_head,
            quantize_head=self.quantize_head, int4_group_size=self.int4_group_size, draft_model=self.draft_model,
            speculative_tokens=self.speculative_tokens or DEFAULT_SPECULATIVE_TOKENS, acceptance_rate=self.acceptance_rate,
            tpot_target_seconds=parse_duration(self.tpot_target, what="TPOT target") if self.tpot_target is not None else None,
            ttft_target_seconds=parse_duration(self.ttft_target, what="TTFT target") if self.ttft_target is not None else None,
            target_requests_per_second=self.target_rps, prefix_hit_ratio=self.prefix_hit_ratio, assume_dense=self.assume_dense,
            fp8_activations=self.fp8_activations.lower(),
            gpus_per_node=self.gpus_per_node, inter_node_bytes_per_second=self.inter_node_gbps * 1e9,
            electricity_usd_per_kwh=self.electricity_usd_per_kwh, power_fraction=self.power_fraction, pue=self.pue,
        )
