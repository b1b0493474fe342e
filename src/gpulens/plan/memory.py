"""Training memory from mechanisms: what PyTorch holds at each candidate peak of a step.

The model follows what autograd saves in transformers' eager implementations (SDPA attention):
- weights, gradients and optimizer states in the dtype each precision mode keeps them in;
- activations: every tensor a layer saves for backward, per token and per layer, for the family's
  blocks (norm internals, each Linear's input, q/k/v/out of the attention kernel, the MLP's
  intermediates); under autocast every Linear saves its *own* 16-bit cast of an fp32 input, and
  autocast caches a 16-bit copy of each Linear weight;
- the loss: transformers upcasts logits to fp32 over the whole sequence; at the start of the
  backward the log-softmax output, its gradient and the logits' gradient are alive (12 bytes per
  token per vocabulary entry);
- the optimizer step: weights + gradients + states + the step's temporaries (foreach AdamW makes
  one parameter-sized temporary);
- a cuBLAS workspace inside the allocator and the CUDA context outside it.
The peak is the largest of: the start of the backward, the recompute of a checkpointed layer, the
optimizer step. Validated against tests/plan/test_memory_calibration.py (real H200 measurements).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpulens.errors import BadInputError
from gpulens.plan import expert_parallel as ep_mod
from gpulens.plan import interleaved
from gpulens.plan import offload as offload_mod
from gpulens.plan.activations import (  # noqa: F401 - re-exported: tests and speed.py read them here
    _head_bytes_per_token,
    _loss_bytes,
    _Mode,
    _mode,
    activation_bytes_full,
    attention_kernel,
    layer_activation_bytes,
    recomputed_attention_bytes,
)
from gpulens.plan.context_parallel import check_context_parallel
from gpulens.plan.fp8 import apply_fp8_memory, check_fp8_training
from gpulens.plan.fp8_megatron import fp8_layer_items, fp8_static_bytes
from gpulens.plan.links import DEFAULT_GPUS_PER_NODE, DEFAULT_INTER_NODE_BYTES_PER_SECOND
from gpulens.plan.lora import (
    FINETUNE,
    LoraSetup,
)
from gpulens.plan.lora_memory import _lora_memory, lora_layer_and_head_bytes  # noqa: F401 - re-exported
from gpulens.plan.megatron import llama_layer_items, model_state_bytes_per_param
from gpulens.plan.memory_estimate import FIT_MARGIN_RATIO, MemoryEstimate, fits_in, peak_of  # noqa: F401 - re-exported
from gpulens.plan.models import ModelSpec
from gpulens.plan.nemo_optim import (
    APEX_LAYOUTS,
    VOCAB_PARALLEL_LOSS,
    apex_adam_states,
    apex_grad_sync_bytes,
    check_nemo_options,
)
from gpulens.plan.zero import check_layout, check_zero3_collectives, largest_module_params, zero_states

MiB = 1 << 20
GiB = 1 << 30

LOSSES = ("torch", "fused", VOCAB_PARALLEL_LOSS)  # vocab-parallel: Megatron-Core's (plan/nemo_optim.py)
PRECISIONS = ("fp32", "amp_bf16", "amp_fp16", "bf16", "fp16", "fp8")  # fp8: plan/fp8.py
OPTIMIZERS = ("adamw", "sgd", "sgd-momentum", "adafactor", "adamw8bit")

# cuBLAS/cuBLASLt workspaces live inside the caching allocator (measured: 64 MiB on the H200).
DEFAULT_WORKSPACE_BYTES = 64 * MiB
# The CUDA context lives outside the allocator; on Hopper with lazy module loading ~0.5 GiB.
DEFAULT_CUDA_CONTEXT_BYTES = 512 * MiB
# Reserved / allocated: the caching allocator keeps freed blocks; the H200 runs show 1.03–1.29.
DEFAULT_RESERVED_RATIO = 1.10


@dataclass(frozen=True)
class TrainSetup:
    precision: str = "amp_bf16"
    optimizer: str = "adamw"
    micro_batch: int = 1
    seq_len: int = 2048
    grad_accum: int = 1
    grad_ckpt: bool = False  # full recomputation: each layer keeps its input
    zero_stage: int = 0
    num_gpus: int = 1
    zero_layout: str = "fsdp"  # fsdp | deepspeed | fsdp-bf16: what --zero shards under amp (plan/zero.py)
    # (Megatron plans also: apex-distributed-adam[-bf16], NeMo's distributed Adam: plan/nemo_optim.py)
    tensor_parallel: int = 1  # Megatron-style model parallelism inside --gpus (gpus = dp x tp x pp)
    pipeline_parallel: int = 1
    sequence_parallel: bool = False
    virtual_stages: int = 1  # interleaved 1F1B: model chunks per pipeline stage (plan/interleaved.py)
    context_parallel: int = 1  # ring attention over the sequence, inside --gpus (plan/context_parallel.py)
    finetune: str = "full"  # full | lora | qlora
    loss: str = "torch"  # torch (transformers: fp32 logits) | fused (in-place 16-bit cross-entropy kernel)
    lora_rank: int = 16
    lora_targets: str = "all"
    lora_dtype: str = "fp32"  # adapters (peft's default); bf16 = get_peft_model(..., autocast_adapter_dtype=False)
    lora_optimizer_dtype: str | None = None  # the adapters' AdamW moments; None = the adapters' dtype
    lora_engine: str = "peft"  # peft (+ transformers) | litgpt (finetune/lora.py): plan/lora_litgpt.py
    qlora_double_quant: bool = True  # QLoRA's NF4 with double quantization (the QLoRA paper's set-up)
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    inter_node_bytes_per_second: float = DEFAULT_INTER_NODE_BYTES_PER_SECOND  # per GPU, one direction
    selective_recompute: bool = False  # Korthikanti et al.: only the attention core is recomputed
    attention_kernel: str = "auto"  # auto | flash3 | cudnn | flash2 | flash1 | triton | eager: what prices the attention (plan/kernels.py)
    expert_parallel: int = 1  # MoE: experts split over groups of N data-parallel GPUs (plan/expert_parallel.py)
    offload: str = "none"  # none | optimizer: ZeRO-Offload's fp32 master + Adam states on the CPU (plan/offload.py)
    backward_prefetch: str = "pre"  # ZeRO-3 / FSDP: pre | post | none (speed.zero3_exposed_seconds)
    reduce_dtype: str | None = None  # gradients reduced in fp32 | bf16: ZeRO-3's reduce-scatter (None: fp32 under amp)
    # or NeMo's distributed Adam's grad_sync_dtype (None: its optimizer dtype; plan/nemo_optim.py)
    megatron_core: bool = False  # a Megatron-Core run even at TP 1 x PP 1 x CP 1 (--megatron-core)

    def run_model(self, m: ModelSpec) -> ModelSpec:
        """The model as this run executes it: `--attention-kernel eager` runs its attention unfused,
        the S x S scores in memory (what `attention_impl="eager"` plans), whatever its family's default."""
        return replace(m, attention_impl="eager") if self.attention_kernel == "eager" else m

    @property
    def recompute(self) -> str:
        """none, selective (the attention core) or full (the whole layer: --grad-ckpt)."""
        return "full" if self.grad_ckpt else "selective" if self.selective_recompute else "none"

    @property
    def deepspeed_amp(self) -> bool:
        """DeepSpeed's mixed precision: the module runs in 16-bit (no autocast), the fp32 master
        weights live with the optimizer states."""
        return self.zero_layout == "deepspeed" and self.precision in ("amp_bf16", "amp_fp16")

    @property
    def low_precision_module(self) -> bool:
        """The module computes in 16-bit without autocast (DeepSpeed; FSDP MixedPrecision)."""
        return self.zero_layout in ("deepspeed", "fsdp-bf16") and self.precision in ("amp_bf16", "amp_fp16")

    @property
    def activation_precision(self) -> str:
        if self.precision == "fp8":  # TE's FP8 Linears inside bf16 autocast (plan/fp8.py)
            return "amp_bf16"
        if self.low_precision_module:
            return "bf16" if self.precision == "amp_bf16" else "fp16"
        return self.precision

    def validate(self) -> None:
        if self.precision not in PRECISIONS:
            raise BadInputError(f"Unknown precision {self.precision!r}.", hint=f"Use one of {', '.join(PRECISIONS)}.")
        if self.optimizer not in OPTIMIZERS:
            raise BadInputError(f"Unknown optimizer {self.optimizer!r}.", hint=f"Use one of {', '.join(OPTIMIZERS)}.")
        for what, v in (("batch", self.micro_batch), ("sequence length", self.seq_len),
                         ("gradient accumulation", self.grad_accum), ("number of GPUs", self.num_gpus)):
            if v <= 0:
                raise BadInputError(f"The {what} must be at least 1, not {v}.", hint=f"Pass a positive {what}.")
        if self.zero_stage not in (0, 1, 2, 3):
            raise BadInputError(f"ZeRO stage {self.zero_stage} does not exist.", hint="Use 0 (none), 1, 2 or 3 (FSDP).")
        if self.zero_layout not in APEX_LAYOUTS:
            check_layout(self.zero_layout)
        check_nemo_options(layout=self.zero_layout, loss=self.loss, zero_stage=self.zero_stage, precision=self.precision,
                           megatron=self.megatron)
        if self.megatron and self.optimizer != "adamw":  # the plan would price Adam whatever --optimizer said
            raise BadInputError(f"A Megatron-Core plan prices Megatron's Adam (its own table of bytes per parameter), "
                                f"not --optimizer {self.optimizer}.",
                                hint="Use --optimizer adamw with --tp/--pp/--cp or --megatron-core, or plan the other "
                                     "optimizer without them.")
        if self.zero_layout == "fsdp-bf16" and self.precision != "amp_bf16":
            raise BadInputError(f"--zero-layout fsdp-bf16 is bf16 mixed precision over fp32 shards, not {self.precision}.",
                                hint="Use --precision amp_bf16 with it, or another layout.")
        if self.loss not in LOSSES:
            raise BadInputError(f"Unknown loss kernel {self.loss!r}.", hint="Use --loss torch, fused or vocab-parallel.")
        if self.tensor_parallel < 1 or self.pipeline_parallel < 1:
            raise BadInputError("Tensor and pipeline parallel degrees must be at least 1.", hint="Pass --tp 1 or more.")
        check_context_parallel(self.context_parallel, self.seq_len)
        interleaved.check_schedule(self.virtual_stages, self.pipeline_parallel, self.grad_accum)
        if self.num_gpus % (self.model_parallel * self.context_parallel):
            cp = f" x --cp {self.context_parallel}" if self.context_parallel > 1 else ""
            raise BadInputError(f"--gpus {self.num_gpus} is not a multiple of --tp {self.tensor_parallel} x --pp "
                                f"{self.pipeline_parallel}{cp}.", hint="GPUs = data parallel x tensor parallel x pipeline "
                                                                   "parallel (x context parallel): pick degrees whose "
                                                                   "product divides --gpus.")
        if self.sequence_parallel and self.tensor_parallel == 1:
            raise BadInputError("Sequence parallelism splits along the tensor-parallel group.", hint="Use it with --tp 2 or more.")
        if self.grad_ckpt and self.selective_recompute:
            raise BadInputError("Full checkpointing (--grad-ckpt) and selective recomputation are two different "
                                "amounts of recomputation, not one.", hint="Pick --recompute selective or full.")
        if self.finetune not in FINETUNE:
            raise BadInputError(f"Unknown fine-tuning method {self.finetune!r}.", hint="Use --finetune full, lora or qlora.")
        check_zero3_collectives(self.backward_prefetch, self.reduce_dtype)
        offload_mod.check_offload(self.offload, zero_stage=self.zero_stage, layout=self.zero_layout,
                                  precision=self.precision, optimizer=self.optimizer, lora=self.finetune != "full",
                                  megatron=self.megatron)

    @property
    def model_parallel(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def megatron(self) -> bool:
        return self.model_parallel > 1 or self.context_parallel > 1 or self.megatron_core

    @property
    def data_parallel(self) -> int:
        """Replicas that see different samples (context-parallel ranks share theirs)."""
        return self.num_gpus // (self.model_parallel * self.context_parallel)

    @property
    def gradient_group(self) -> int:
        """Ranks that hold the same weights and all-reduce their gradients: data x context parallel
        (Megatron's data_parallel_group_with_cp; the distributed optimizer shards over it too)."""
        return self.data_parallel * self.context_parallel

    @property
    def lora(self) -> LoraSetup | None:
        return None if self.finetune == "full" else LoraSetup(self.finetune, self.lora_rank, self.lora_targets,
                                                              self.lora_dtype, self.lora_optimizer_dtype,
                                                              self.lora_engine, self.qlora_double_quant)


def _optimizer_bytes(m: ModelSpec, optimizer: str, state_bytes: int) -> tuple[int, int, str]:
    """(states, step temporaries, note) for the whole model."""
    n = m.params
    if optimizer == "adamw":
        # foreach AdamW: exp_avg + exp_avg_sq, and one parameter-sized temporary (sqrt of exp_avg_sq)
        return 2 * state_bytes * n, state_bytes * n, ""
    if optimizer == "sgd":
        return 0, 0, ""
    if optimizer == "sgd-momentum":
        return state_bytes * n, 0, ""
    if optimizer == "adamw8bit":
        # bitsandbytes: 1 byte per state + an fp32 absmax per 256-element block, per-tensor kernels
        return int(n * (2 + 2 * 4 / 256)), 0, "adamw8bit: bitsandbytes' 8-bit AdamW (1 byte per moment + block scales)"
    # Adafactor (transformers): factored second moment (rows + columns per matrix), no momentum;
    # per-parameter temporaries of a few fp32 copies of the largest matrix
    h = m.hidden_size
    mats = [m.vocab_size * h, h * max(m.intermediate_size, m.moe_intermediate_size or 0), h * m.q_size]
    largest = max(mats)
    factored = m.num_layers * 4 * (h + max(m.q_size, m.intermediate_size)) * 4 + 2 * (m.vocab_size + h) * 4
    return factored, 3 * 4 * largest, "adafactor: transformers' Adafactor defaults (factored second moment, no momentum)"


def training_memory(
    m: ModelSpec,
    setup: TrainSetup,
    *,
    capacity_bytes: int,
    workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
    cuda_context_bytes: int = DEFAULT_CUDA_CONTEXT_BYTES,
    reserved_ratio: float = DEFAULT_RESERVED_RATIO,
    activation_scale: float = 1.0,
) -> MemoryEstimate:
    """Itemized peak memory of one GPU for one training step."""
    setup.validate()
    m = setup.run_model(m)
    if setup.precision == "fp8":
        check_fp8_training(m, finetune=setup.finetune, megatron=setup.megatron,
                           zero_layout=setup.zero_layout, zero_stage=setup.zero_stage)
    if m.is_mla:
        raise BadInputError(f"{m.name} uses multi-head latent attention, whose training activations gpulens does not "
                            "model yet.", hint="Plan serving it (--workload infer), or pass a config of another family.")
    ep_mod.check_expert_parallel(m, setup.expert_parallel, data_parallel=setup.data_parallel,
                                 zero_stage=setup.zero_stage if setup.num_gpus > 1 else 0,
                                 megatron=setup.megatron, lora=setup.lora is not None)
    if setup.megatron:
        if setup.lora is not None:
            raise BadInputError("LoRA is planned with data parallelism only.", hint="Drop --tp/--pp/--cp for LoRA.")
        return _megatron_memory(m, setup, capacity_bytes=capacity_bytes, workspace_bytes=workspace_bytes,
                                cuda_context_bytes=cuda_context_bytes, reserved_ratio=reserved_ratio)
    if setup.lora is not None:
        if setup.zero_stage:  # was accepted, shown in the header, and planned as plain replicas
            raise BadInputError("LoRA is planned with plain data parallelism (each GPU holds the frozen base); "
                                "ZeRO / FSDP sharding of a LoRA run is not modelled.", hint="Drop --zero for LoRA.")
        return _lora_memory(m, setup, capacity_bytes=capacity_bytes, workspace_bytes=workspace_bytes,
                            cuda_context_bytes=cuda_context_bytes, reserved_ratio=reserved_ratio,
                            activation_scale=activation_scale)
    mode = _mode(setup.activation_precision)
    state_bytes = 4 if _mode(setup.precision).weight == 4 else 2
    n, gpus = m.params, setup.num_gpus
    b, s = setup.micro_batch, setup.seq_len
    tokens = b * s
    notes: list[str] = []

    states, step_tmp, opt_note = _optimizer_bytes(m, setup.optimizer, state_bytes)
    if opt_note:
        notes.append(opt_note)
    zero = setup.zero_stage if gpus > 1 else 0
    if setup.zero_stage and gpus == 1:
        notes.append("ZeRO/FSDP shards across GPUs: with --gpus 1 it changes nothing")
    shard_weight = _mode(setup.precision).weight if setup.zero_layout == "fsdp-bf16" else mode.weight
    zs = zero_states(n, stage=zero, gpus=gpus, layout=setup.zero_layout, weight_bytes=shard_weight,  # fp32 shards
                     state_bytes_per_param=states / n, amp=setup.deepspeed_amp,
                     largest_module_params=largest_module_params(m))
    mechanisms: dict[str, dict] = {}
    linear = m.linear_params
    if setup.expert_parallel > 1:  # plan/expert_parallel.py: each part sharded over its own gradient group
        zs, mechanisms["expert_parallel"], linear, ep_note = ep_mod.expert_parallel_memory(
            m, setup.expert_parallel, setup.data_parallel, stage=zero, layout=setup.zero_layout,
            weight_bytes=shard_weight, state_bytes_per_param=states / n, amp=setup.deepspeed_amp)
        notes.append(ep_note)
    weights, grads, states = int(zs.weights), int(zs.gradients), int(zs.optimizer_states)
    fp32_partition = int(zs.fp32_gradient_partition)
    part = ep_mod.partition_params(m, ep=setup.expert_parallel, data_parallel=gpus, zero_stage=zero)
    if setup.deepspeed_amp:
        step_tmp = 0  # DeepSpeed's fused Adam updates in place
    elif setup.expert_parallel > 1:
        step_tmp = int(step_tmp * part / n)
    elif zero >= 1:
        step_tmp //= gpus
    if setup.offload == "optimizer":  # plan/offload.py: master weights, moments, fp32 gradients on the host
        mechanisms["optimizer_offload"], off_note = offload_mod.offload_memory(
            part, min(gpus, setup.gpus_per_node), states + fp32_partition)
        notes.append(off_note)
        states, fp32_partition, step_tmp = 0, 0, 0
    gathered = 0
    if zero >= 3:
        # FSDP: the layer being computed + the prefetched one; DeepSpeed: the largest module
        gathered = int(zs.gathered_largest_module) or 2 * m.layer_params() * mode.weight
    ddp_buckets = grads if (gpus > 1 and zero == 0) else 0  # DDP copies gradients into its buckets

    layer = layer_activation_bytes(m, setup.activation_precision, b, s, recompute=setup.recompute)
    per_layer = layer["attention"] + layer["mlp"] + layer["norms"]
    if setup.attention_kernel == "eager":
        notes.append("--attention-kernel eager: unfused attention, so every layer keeps its S x S scores")
    elif attention_kernel(m, setup.activation_precision) == "eager":
        notes.append(f"{m.family}: transformers runs eager attention (no SDPA), so every layer keeps its S x S scores")
    if layer["kernel_math"]:
        notes.append("fp32 with grouped-query attention: SDPA falls back to the math kernel (S x S scores in memory)")
    head = tokens * _head_bytes_per_token(m, mode)
    embed_dropout = tokens * m.hidden_size if m.dropout > 0 else 0
    if setup.grad_ckpt:
        saved = m.num_layers * tokens * m.hidden_size * mode.residual + head + embed_dropout  # each layer's input
    else:
        saved = m.num_layers * per_layer + head + embed_dropout
    saved = int(saved * activation_scale)
    loss = _loss_bytes(m, setup.activation_precision, tokens, setup.loss)
    # autocast keeps a 16-bit copy of each Linear weight while the layers that saved it wait for
    # their backward (freed after the forward when the layers are checkpointed)
    cast_cache = 2 * linear if (mode.amp and not setup.grad_ckpt) else 0
    if zero >= 3:
        cast_cache //= gpus
    # gradients already exist during the forward when they accumulate over micro-batches
    live_grads = grads if setup.grad_accum > 1 else 0

    static = {"weights": weights, "optimizer_states": states, "cuda_workspace": workspace_bytes}
    if gathered:
        static["zero3_gathered_params"] = gathered
    if ddp_buckets:
        static["ddp_gradient_buckets"] = ddp_buckets

    cands: dict[str, dict[str, int]] = {}
    cands["backward start"] = static | {
        "gradients": live_grads,
        "autocast_weight_copies": cast_cache,
        "activations": saved,
        "logits_and_loss": loss,
    }
    # the end of the forward: the loss is computed inside autocast, so the 16-bit weight copies are
    # still cached even when checkpointed layers saved nothing; logits (16-bit), their fp32 copy and
    # the log-softmax output are alive
    mode_c = mode.compute
    fwd_logits = loss if setup.loss == "fused" else tokens * m.vocab_size * ((mode_c + 4 + 4) if mode_c != 4 else 8)
    cands["forward end"] = static | {
        "gradients": live_grads,
        "autocast_weight_copies": 2 * linear // (gpus if zero >= 3 else 1) if mode.amp else 0,
        "activations": saved,
        "logits_and_loss": fwd_logits,
    }
    # the top layer's backward: the output head's gradient exists, an fp32 gradient flows through the
    # residual stream, every saved activation is still alive (and so are autocast's weight copies);
    # recomputing, the top layer's full activations (or its attention core's insides) are back too
    head_grad = m.vocab_size * m.hidden_size * mode.weight
    back = (per_layer if setup.grad_ckpt else
            recomputed_attention_bytes(m, setup.activation_precision, b, s) if setup.selective_recompute else 0)
    top = "layer recompute" if setup.grad_ckpt else "attention recompute" if setup.selective_recompute else "top layer backward"
    cands[top] = static | {
        "gradients": max(live_grads, head_grad),
        "autocast_weight_copies": cast_cache,
        "activations": saved + int(back * activation_scale),
        "logits_and_loss": tokens * m.hidden_size * 4,
    }
    cands["optimizer step"] = static | {"gradients": 0 if zs.gradients_freed_at_step else grads,
                                        "optimizer_step_temporaries": step_tmp,
                                        "fp32_gradient_partition": fp32_partition}
    if setup.precision == "fp8":
        apply_fp8_memory(cands, m, tokens=tokens, grad_ckpt=setup.grad_ckpt, zero3_gpus=gpus if zero >= 3 else 1,
                         activation_scale=activation_scale, notes=notes, selective_recompute=setup.selective_recompute)

    return peak_of(cands, notes, reserved_ratio=reserved_ratio, cuda_context_bytes=cuda_context_bytes,
                   capacity_bytes=capacity_bytes, mechanisms=mechanisms)


def megatron_stage_params(m: ModelSpec, setup: TrainSetup) -> float:
    """Parameters on one GPU: a pipeline stage's layers (the first also holds the embedding, the
    last the output head: the larger of the two) split over the tensor-parallel group."""
    stage = m.block_params / setup.pipeline_parallel
    ends = m.vocab_size * m.hidden_size  # embedding or (untied) head, on its stage
    if setup.pipeline_parallel == 1:
        ends = m.embedding_params + m.lm_head_params
    return (stage + ends) / setup.tensor_parallel


def megatron_layer_items(m: ModelSpec, setup: TrainSetup) -> dict[str, float]:
    """One layer's saved tensors on one GPU, Korthikanti et al.'s accounting for a LLaMA-like layer
    in bf16 (FP8's changes: plan/fp8_megatron.py)."""
    m = setup.run_model(m)
    return llama_layer_items(seq=setup.seq_len // setup.context_parallel, micro_batch=setup.micro_batch,
                             hidden=m.hidden_size, heads=m.num_heads, kv_heads=m.num_kv_heads, head_dim=m.head_dim,
                             intermediate=m.moe_intermediate_size or m.intermediate_size,
                             tensor_parallel=setup.tensor_parallel, sequence_parallel=setup.sequence_parallel,
                             recompute=setup.recompute,
                             flash=attention_kernel(m, setup.activation_precision) not in ("eager", "math"),
                             gated=m.mlp == "gated", dropout=m.dropout > 0)


def megatron_activation_bytes(m: ModelSpec, setup: TrainSetup) -> float:
    """What the first pipeline stage holds: its L/p layers for every micro-batch in flight (1F1B:
    up to p of them), Korthikanti et al.'s per-layer accounting for a LLaMA-like layer."""
    items = megatron_layer_items(m, setup)
    if setup.precision == "fp8":  # TE saves the Linears' inputs in FP8 (plan/fp8_megatron.py)
        items = fp8_layer_items(items, m, setup)
    layers = interleaved.first_stage_layers_in_flight(m.num_layers, setup.pipeline_parallel, setup.virtual_stages,
                                                      setup.grad_accum)
    return layers * sum(items.values())


def _last_over_first(m: ModelSpec, setup: TrainSetup) -> float:
    """The last stage's activations (while it computes the loss) over the first stage's peak."""
    args = (m.num_layers, setup.pipeline_parallel, setup.virtual_stages, setup.grad_accum)
    return interleaved.last_stage_layers_in_flight(*args) / interleaved.first_stage_layers_in_flight(*args)


def _megatron_memory(m: ModelSpec, setup: TrainSetup, *, capacity_bytes: int, workspace_bytes: int,
                     cuda_context_bytes: int, reserved_ratio: float) -> MemoryEstimate:
    """Megatron-style tensor/pipeline(/sequence) parallelism inside --gpus, data parallel over the
    rest; --zero 1 or more = the distributed optimizer (states sharded over the data-parallel ranks)."""
    if m.is_moe:
        raise BadInputError("Tensor/pipeline parallel plans cover dense models; a MoE is planned with data "
                            "parallelism (--gpus, --zero) and expert parallelism (--ep).",
                            hint="Drop --tp/--pp and plan the MoE with --gpus, --zero and --ep.")
    if m.num_heads % setup.tensor_parallel or (m.num_kv_heads % setup.tensor_parallel
                                               and setup.tensor_parallel % m.num_kv_heads):
        raise BadInputError(f"--tp {setup.tensor_parallel} does not split {m.name}'s {m.num_heads} attention / "
                            f"{m.num_kv_heads} KV heads evenly.", hint="Pick a degree that divides the heads.")
    if m.num_layers % setup.pipeline_parallel:
        raise BadInputError(f"--pp {setup.pipeline_parallel} does not split {m.name}'s {m.num_layers} layers evenly.",
                            hint="Pick a degree that divides the number of layers.")
    interleaved.check_layers(m.num_layers, setup.pipeline_parallel, setup.virtual_stages, m.name)
    params = megatron_stage_params(m, setup)
    per_param = model_state_bytes_per_param(setup.precision, setup.gradient_group, setup.zero_stage >= 1)
    weights = params * (4 if setup.precision == "fp32" else 2)
    grads = params * 4  # Megatron accumulates gradients in fp32 (main_grad)
    states = params * per_param - weights - grads
    if setup.zero_layout in APEX_LAYOUTS:  # NeMo's distributed Adam (plan/nemo_optim.py)
        ends = m.vocab_size * m.hidden_size if setup.pipeline_parallel > 1 else m.embedding_params + m.lm_head_params
        apex = apex_adam_states(params, layout=setup.zero_layout, group=setup.gradient_group,
                                fp32_grad_params=ends / setup.tensor_parallel,
                                grad_sync_bytes=apex_grad_sync_bytes(setup.zero_layout, setup.reduce_dtype))
        weights, grads, states = apex.weights_bytes, apex.gradients_bytes, apex.optimizer_states_bytes
        per_param = (weights + grads + states) / params
    act = megatron_activation_bytes(m, setup)
    tokens = setup.micro_batch * setup.seq_len // setup.context_parallel  # this GPU's share of the sequence
    loss = VOCAB_PARALLEL_LOSS if setup.loss == VOCAB_PARALLEL_LOSS else "torch"  # fused: not Megatron's kernel
    logits = _loss_bytes(m, "bf16", tokens, loss) / setup.tensor_parallel  # vocab-parallel cross-entropy, last stage
    static = {"weights": int(weights), "gradients": int(grads), "optimizer_states": int(states),
              "cuda_workspace": workspace_bytes}
    if setup.precision == "fp8":  # TE's cached FP8 weights and scaling state (plan/fp8_megatron.py)
        static |= fp8_static_bytes(m, setup)
    cands = {"backward start": static | {"activations": int(act)},
             "last stage loss": static | {"activations": int(act * _last_over_first(m, setup)),
                                          "logits_and_loss": int(logits)}}
    notes = [f"Megatron-style: TP {setup.tensor_parallel} x PP {setup.pipeline_parallel}"
             + (f" x CP {setup.context_parallel}" if setup.context_parallel > 1 else "") + f" x DP {setup.data_parallel}"
             + (" with sequence parallelism" if setup.sequence_parallel else "")
             + (f", interleaved 1F1B with {setup.virtual_stages} model chunks per stage" if setup.virtual_stages > 1 else "")
             + f"; {per_param:.3g} bytes of model state per parameter ("
             + ("NeMo's distributed Adam, " + setup.zero_layout if setup.zero_layout in APEX_LAYOUTS else "Megatron's table"
                + (", distributed optimizer" if setup.zero_stage >= 1 else "")) + "); flash attention, Megatron's own "
               "kernels (not transformers')"]
    if setup.precision == "fp8":
        notes.append("FP8 (Transformer Engine under Megatron-Core): bf16 module weights cast to FP8 once per step and "
                     "cached with their transposes (2 bytes per local TE Linear parameter); the Linears save their "
                     "inputs in FP8; the output layer, attention and loss stay bf16")
    return peak_of(cands, notes, reserved_ratio=reserved_ratio, cuda_context_bytes=cuda_context_bytes,
                   capacity_bytes=capacity_bytes)
