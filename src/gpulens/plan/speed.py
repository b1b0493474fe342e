"""Training speed from FLOPs, memory traffic and per-layer overhead, with per-GPU efficiency factors.

step time = matmul FLOPs / (peak x compute efficiency)
          + bytes the elementwise kernels and the optimizer move / (bandwidth x memory efficiency)
          + layers x per-layer overhead (kernel launches, Python)
          + exposed gradient communication across GPUs.
FLOPs per token = 6 N (+2 N with activation recomputation) + the attention term 12 L H Q S (PaLM,
appendix B). The efficiency factors default to typical values and are replaced by the ones
`gpulens plan calibrate` fits for a GPU from measured runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpulens.plan import expert_parallel as ep_mod
from gpulens.plan import grad_accumulation as grad_acc_mod
from gpulens.plan import interleaved, megatron_step
from gpulens.plan import offload as offload_mod
from gpulens.plan.activations import attention_kernel as sdpa_backend
from gpulens.plan.catalog import GpuSpec
from gpulens.plan.context_parallel import ring_attention_cost
from gpulens.plan.fp8 import Fp8Speed, check_fp8_training, fp8_speed
from gpulens.plan.fp8_megatron import megatron_fp8_speed
from gpulens.plan.kernels import MATMUL_CEILING, attention_flops_run, attention_rate, kernel_head_dim
from gpulens.plan.links import (
    collective_link,
    nodes_for,
    ring_all_reduce,
    ring_bus_bytes_per_second,
    ring_gather_or_scatter,
)
from gpulens.plan.lora import NF4_BYTES_PER_WEIGHT, adapter_params
from gpulens.plan.memory import (
    TrainSetup,
    _mode,
    activation_bytes_full,
    layer_activation_bytes,
    megatron_layer_items,
)
from gpulens.plan.models import ModelSpec
from gpulens.plan.nemo_optim import APEX_LAYOUTS, apex_grad_sync_bytes
from gpulens.plan.overlap import hidden_collective_cost_seconds
from gpulens.plan.zero import REDUCE_DTYPES


@dataclass(frozen=True)
class RuntimeSpeed:
    """The serving factors of one runtime: how much of the bandwidth a decode step gets when it
    reads the weights and the KV cache, the fixed costs per step and per layer, and the prefill's
    matmul efficiency and fixed cost. Fitted per runtime, never carried to another."""

    decode_bandwidth_ratio: float
    decode_step_overhead_seconds: float
    decode_layer_overhead_seconds: float
    prefill_overhead_seconds: float
    prefill_compute_ratio: float | None = None  # None: the GPU's matmul efficiency (compute_ratio, PyTorch eager)
    prefill_bandwidth_ratio: float | None = None  # elementwise work of the prefill; None: memory_bandwidth_ratio
    source: str = ""
    calibrated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Defaults, each with where it comes from (calibration replaces them per GPU and runtime).
HF_EAGER = RuntimeSpeed(
    # eager GEMVs reach about half the bandwidth of a fused kernel; every layer launches ~10
    # kernels from Python (~30 us each) and generate() syncs and samples once per step
    decode_bandwidth_ratio=0.5, decode_step_overhead_seconds=0.004, decode_layer_overhead_seconds=0.0003,
    prefill_overhead_seconds=0.005,
    source="defaults for transformers' eager generate (per-layer launches from Python, DynamicCache copies)")
ENGINE = RuntimeSpeed(
    # serving engines replay CUDA graphs (no per-kernel launch from Python) and reach 60-80 % of
    # the bandwidth bound at small batch (vLLM, SGLang and TGI batch-1 decode benchmarks); the
    # scheduler and sampler cost ~0.5 ms per step; prefill GEMMs of a few thousand tokens reach
    # ~60 % of the dense peak (its own figure: a training fit, PyTorch eager, does not apply)
    decode_bandwidth_ratio=0.75, decode_step_overhead_seconds=0.0005, decode_layer_overhead_seconds=0.00001,
    prefill_overhead_seconds=0.003, prefill_compute_ratio=0.6, prefill_bandwidth_ratio=0.7,  # fused norms/activations
    source="defaults for a CUDA-graph serving engine (60-80 % of the bandwidth bound at small batch)")
# TensorRT-LLM: the same engine defaults (CUDA graphs or fused plugins); no sourced figure of its own (plan/serve_engines.py)
RUNTIME_DEFAULTS: dict[str, RuntimeSpeed] = {"hf": HF_EAGER, "vllm": ENGINE, "sglang": ENGINE, "tgi": ENGINE, "trtllm": ENGINE}


@dataclass(frozen=True)
class Efficiency:
    """How close a GPU gets to its datasheet peaks, and the fixed costs on top."""

    # Defaults sit between typical published MFU figures and the bundled H200 runs (uncalibrated,
    # they predict those runs' step times within ~30 %); calibration replaces them per GPU.
    compute_ratio: float = 0.6  # 16-bit matmul throughput / dense peak
    fp32_compute_ratio: float = 0.75  # fp32 (no TF32) throughput / fp32 peak
    memory_bandwidth_ratio: float = 0.35  # achieved / datasheet bandwidth for unfused elementwise work
    layer_overhead_seconds: float = 0.0005  # per layer per training step (launches, autograd)
    activation_scale: float = 1.0  # measured / modelled activation memory
    reserved_ratio: float = 1.10  # allocator: peak reserved / peak allocated
    workspace_bytes: int = 64 << 20  # allocator-resident cuBLAS workspace
    source: str = "defaults (not calibrated)"
    calibrated: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    runtimes: dict[str, RuntimeSpeed] = field(default_factory=dict)  # fitted serving factors, by runtime

    def runtime(self, name: str) -> RuntimeSpeed:
        """The serving factors of `name`: its own fit on this GPU, else that runtime's defaults."""
        return self.runtimes.get(name) or RUNTIME_DEFAULTS[name]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Efficiency:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d and k != "runtimes"}
        rt_fields = RuntimeSpeed.__dataclass_fields__
        runtimes = {name: RuntimeSpeed(**{k: v for k, v in r.items() if k in rt_fields})
                    for name, r in (d.get("runtimes") or {}).items() if name in RUNTIME_DEFAULTS and isinstance(r, dict)}
        return cls(**known, runtimes=runtimes)


def default_efficiency(gpu: GpuSpec) -> Efficiency:
    """The uncalibrated factors of `gpu`: where its 16-bit matmul ceiling has been measured
    (plan/kernels.py, MATMUL_CEILING), the matmuls run at it, the attention core being priced at
    its own kernel's rate; elsewhere the generic default."""
    ceiling = MATMUL_CEILING.get(gpu.name)
    if ceiling is None:
        return Efficiency()
    return Efficiency(compute_ratio=ceiling, source=f"defaults (not calibrated): 16-bit matmuls at {gpu.name}'s "
                                                    f"measured matmul ceiling, {ceiling:.0%} of its peak")


@dataclass
class TrainSpeed:
    step_seconds: float
    tokens_per_second: float  # all GPUs together
    samples_per_second: float
    flops_per_token: float
    mfu_ratio: float  # model FLOPs (6N + attention) / (GPUs x dense peak)
    compute_seconds: float
    memory_seconds: float
    overhead_seconds: float
    communication_seconds: float
    efficiency_source: str
    nodes: int = 1
    communication_link: str = ""  # the bottleneck link of the gradient collectives
    communication_link_bytes_per_second: float = 0.0  # per GPU, one direction, the line rate
    communication_bus_bytes_per_second: float = 0.0  # what the gradient ring moves per GPU (plan/links.py)
    tensor_parallel_link: str = ""  # the link tensor parallelism's all-reduces run over
    pipeline_bubble_ratio: float = 0.0  # share of the step the first stage waits in the 1F1B bubble
    pipeline_bubble_over_compute_ratio: float = 0.0  # the paper's bubble fraction: (p - 1) / (V m)
    pipeline_virtual_stages: int = 1  # model chunks per stage (interleaved 1F1B when > 1)
    pipeline_p2p_seconds: float = 0.0  # of communication_seconds: the stage-to-stage sends of the step
    output_layer_last_stage_seconds: float = 0.0  # Megatron: the head and loss on the last stage, whole step
    grad_accumulation_seconds: float = 0.0  # of memory_seconds: adding micro-batches' gradients (plan/grad_accumulation.py)
    context_parallel: int = 1
    context_parallel_link: str = ""  # the link the ring attention's K/V sends run over
    context_parallel_transfer_seconds: float = 0.0  # the ring's sends over the step (mostly hidden)
    context_parallel_exposed_seconds: float = 0.0  # of communication_seconds: what the attention does not hide
    attention_kernel: str = ""  # the kernel the attention core is priced at ("": with the matmuls)
    attention_seconds: float = 0.0  # of compute_seconds: the attention core at that kernel's measured rate
    attention_source: str = ""
    mfu_peak_format: str = ""  # the dense peak mfu_ratio is taken against (fp8 runs: bf16, plan/fp8.py)
    fp8: Fp8Speed | None = None  # --precision fp8: the FP8 GEMMs and their casts (plan/fp8.py)
    expert_all_to_all_seconds: float = 0.0  # of communication_seconds: --ep's all-to-alls, the whole step
    expert_all_to_all_link: str = ""
    expert_all_to_all_count: int = 0  # per micro-batch: MoE layers x (4, or 6 with full recomputation)
    expert_all_to_all_buffer_bytes: float = 0.0  # per GPU, one all-to-all
    offload_pcie_seconds: float = 0.0  # --offload optimizer: gradients to the host, weights back
    offload_cpu_adam_seconds: float = 0.0  # --offload optimizer: the host's Adam step
    offload_host_link: str = ""
    offload_host_link_bytes_per_second: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def train_flops_per_token(m: ModelSpec, seq: int, *, recompute: bool | str = False) -> float:
    """Hardware FLOPs per trained token: 6 N + 12 L H Q S (PaLM appendix B); with full activation
    recomputation (`True` or "full") the layers' forward runs twice (8 N + 16 L H Q S, less 2 h V:
    the output head lies outside the checkpointed layers, as transformers' gradient checkpointing,
    FSDP's apply_activation_checkpointing on blocks and Megatron-LM wrap them); with selective
    recomputation (Korthikanti et al. 2022, section 5) only the attention core's forward
    (QK^T and attention over V, 4 L H Q S) runs again: 6 N + 16 L H Q S."""
    n = m.matmul_params
    attn = 12 * m.num_layers * m.num_heads * m.head_dim * seq
    if recompute is True or recompute == "full":
        head = m.vocab_size * m.hidden_size  # outside the checkpointed layers: never run again
        return 8 * (n - head) + 6 * head + attn * 4 / 3
    if recompute == "selective":
        return 6 * n + attn * 4 / 3
    return 6 * n + attn


def model_flops_per_token(m: ModelSpec, seq: int) -> float:
    """What MFU counts (never the recomputation)."""
    return train_flops_per_token(m, seq, recompute=False)


def _peak_for(gpu: GpuSpec, precision: str, eff: Efficiency) -> float:
    fmt = "fp32" if precision == "fp32" else ("fp16" if precision in ("fp16", "amp_fp16") else "bf16")
    ratio = eff.fp32_compute_ratio if fmt == "fp32" else eff.compute_ratio
    return gpu.peak_flops(fmt) * ratio


@dataclass(frozen=True)
class AttentionTime:
    seconds_per_token: float  # forward + backward (+ recomputed forward) of the attention core
    flops_per_token: float  # the PaLM-counted attention FLOPs (in train_flops_per_token) it prices
    kernel: str
    source: str


def attention_time(m: ModelSpec, setup: TrainSetup, gpu: GpuSpec, precision: str) -> AttentionTime | None:
    """The attention core priced at its kernel's measured rate (plan/kernels.py) rather than at the
    matmul efficiency: None where no benchmark covers the kernel on this GPU, or the run is fp32
    (no flash kernel), and then the attention FLOPs stay with the matmuls."""
    if precision == "fp32" or setup.activation_precision == "fp32":
        return None
    kernel = setup.attention_kernel
    if kernel == "auto":
        if sdpa_backend(m, setup.activation_precision) != "flash":
            return None
        kernel = "flash2"  # SDPA's flash backend is FlashAttention-2 (PyTorch >= 2.2)
    fmt = "fp16" if "fp16" in precision else "bf16"
    tile = kernel_head_dim(kernel, m.head_dim)  # what the kernel multiplies: its tile, padding included
    rate = attention_rate(kernel, gpu, tile, setup.seq_len, gpu.peak_flops(fmt))
    if rate is None:
        return None
    recompute = setup.grad_ckpt or setup.selective_recompute
    run = attention_flops_run(m.num_layers, m.num_heads, tile, setup.seq_len, recompute=recompute)
    palm = 12 * m.num_layers * m.num_heads * m.head_dim * setup.seq_len * (4 / 3 if recompute else 1)
    return AttentionTime(run / rate.flops_per_second, palm, kernel, rate.source)


def _optimizer_traffic_bytes(m: ModelSpec, setup: TrainSetup) -> float:
    if setup.lora is not None:  # the adapters (read/write, their gradients read) and their states only
        lo = setup.lora
        return adapter_params(m, lo) * (3 * lo.adapter_bytes + 6 * lo.state_bytes + 2 * lo.master_bytes)
    w = _mode(setup.precision).weight
    s = 4 if w == 4 else 2
    per_param = {
        "adamw": 2 * w + w + 4 * s + 2 * s,  # read/write params, read grads, read/write m and v, temporary
        "sgd": 2 * w + w,
        "sgd-momentum": 2 * w + w + 2 * s,
        "adafactor": 2 * w + w + 3 * 4,
        "adamw8bit": 2 * w + w + 4,
    }[setup.optimizer]
    if setup.offload == "optimizer":
        return 0.0  # the host runs the step (plan/offload.py)
    if setup.expert_parallel > 1:  # its replicated share and its own experts
        return per_param * ep_mod.partition_params(m, ep=setup.expert_parallel, data_parallel=setup.num_gpus,
                                                   zero_stage=setup.zero_stage)
    shard = setup.num_gpus if setup.zero_stage >= 1 and setup.num_gpus > 1 else 1
    return m.params * per_param / shard


def _gradient_ring_bytes_per_param(setup: TrainSetup) -> float:
    """What the step's gradient collective moves per parameter, priced as a ring all-reduce of that
    many bytes (2 (g - 1) / g of them per GPU). Megatron's distributed optimizer (and NeMo's
    distributed Adam) reduce-scatters the gradients in their dtype and all-gathers the updated
    16-bit parameters (Megatron-LM docs/user-guide/features/dist_optimizer.md, "Key Steps"; Apex
    distributed_fused_adam.py: the grad sync in grad_sync_dtype, the param sync in param_sync_dtype):
    half a ring of each; otherwise the gradients are all-reduced in Megatron's fp32 main_grad, or in
    the module's dtype."""
    if not setup.megatron:
        return 4 if _mode(setup.precision).weight == 4 else 2
    grad = apex_grad_sync_bytes(setup.zero_layout, setup.reduce_dtype) if setup.zero_layout in APEX_LAYOUTS else 4
    if setup.zero_stage >= 1:  # the module is 16-bit unless the run is fp32 (plan/memory.py's Megatron weights)
        return (grad + (4 if setup.precision == "fp32" else 2)) / 2
    return grad


def training_speed(m: ModelSpec, setup: TrainSetup, gpu: GpuSpec, eff: Efficiency) -> TrainSpeed:
    setup.validate()
    m = setup.run_model(m)  # --attention-kernel eager: the S x S scores in the memory traffic, the FLOPs at the matmuls' rate
    if setup.precision == "fp8":
        check_fp8_training(m, finetune=setup.finetune, megatron=setup.megatron,
                           zero_layout=setup.zero_layout, zero_stage=setup.zero_stage)
    tokens = setup.micro_batch * setup.seq_len
    lora = setup.lora
    fpt = train_flops_per_token(m, setup.seq_len, recompute=setup.recompute)
    precision = setup.precision if lora is None or lora.method == "lora" else "bf16"
    if lora is not None:
        # a frozen base computes no weight gradients: 2 N of the 6 N (adapters add 6 x their few parameters)
        fpt += 6 * adapter_params(m, lora) - 2 * m.matmul_params
    attn = attention_time(m, setup, gpu, precision)
    if attn is None:
        compute = fpt * tokens / _peak_for(gpu, precision, eff)
    else:  # the matmuls at the matmul efficiency, the attention core at its kernel's measured rate
        compute = (fpt - attn.flops_per_token) * tokens / _peak_for(gpu, precision, eff) + attn.seconds_per_token * tokens
    bw = gpu.memory_bandwidth_bytes_per_second * eff.memory_bandwidth_ratio
    # activations are written in the forward and read (and their gradients written) in the
    # backward: ~3 passes over what is saved; recomputation adds half again. The loss as the run
    # computes it: a fused cross-entropy kernel (flash-attn's xentropy, llm-foundry's default)
    # reads the 16-bit logits and writes their gradient in place, with no fp32 log-softmax copies
    traffic = 3 * activation_bytes_full(m, precision, setup.micro_batch, setup.seq_len, setup.loss)
    if setup.grad_ckpt:
        traffic *= 1.5
    elif setup.selective_recompute:  # the attention core re-reads q, k, v and rewrites its insides once more
        traffic += m.num_layers * layer_activation_bytes(m, precision, setup.micro_batch, setup.seq_len)["attention"]
    fp8 = None
    if setup.precision == "fp8":  # the block Linears' GEMMs at the FP8 peak, plus their casts, per GPU (plan/fp8.py)
        kw = dict(compute_ratio=eff.compute_ratio, ratio_source=eff.source, bandwidth_bytes_per_second=bw)
        fp8 = (megatron_fp8_speed(m, setup, gpu, megatron_layer_items(m, setup), **kw) if setup.megatron else
               fp8_speed(m, gpu, tokens=tokens, grad_ckpt=setup.grad_ckpt, selective_recompute=setup.selective_recompute,
                         **kw))
    if lora is not None and lora.method == "qlora":
        # each pass dequantizes every block weight: read 4-bit codes, write and read it in bf16
        passes = 3 if setup.grad_ckpt else 2
        traffic += passes * m.block_params * (NF4_BYTES_PER_WEIGHT + 2 + 2)
    memory = traffic / bw
    overhead = m.num_layers * eff.layer_overhead_seconds * (4 / 3 if setup.grad_ckpt else 1)
    mp = setup.model_parallel  # Megatron: each GPU computes 1/t of its stage's 1/p of the layers
    cp = setup.context_parallel  # ... for 1/cp of the sequence (plan/context_parallel.py)
    compute, memory, overhead = compute / mp / cp, memory / mp / cp, overhead / setup.pipeline_parallel
    if fp8 is not None:  # already this GPU's share
        compute += fp8.gemm_seconds - fp8.gemm_flops_per_micro_batch / _peak_for(gpu, precision, eff)
        memory += fp8.cast_seconds + 3 * fp8.saved_activation_delta_bytes / bw
    # adding each micro-batch's weight gradients into the step's (plan/grad_accumulation.py); Megatron's
    # runs inside every micro-batch's slot, the others' once per later micro-batch
    acc = grad_acc_mod.grad_accumulation(m, setup)
    acc_seconds = acc.seconds(elementwise_bytes_per_second=bw, peak_bytes_per_second=gpu.memory_bandwidth_bytes_per_second,
                              matmul_flops_per_second=_peak_for(gpu, precision, eff),
                              architecture=gpu.architecture) if acc else 0.0
    if acc and acc.every_micro_batch:
        memory += acc_seconds
    attn_micro = (attn.seconds_per_token * tokens if attn else
                  12 * m.num_layers * m.num_heads * m.head_dim * setup.seq_len * tokens
                  * (4 / 3 if setup.recompute != "none" else 1) / _peak_for(gpu, precision, eff)) / mp / cp
    ring = ring_attention_cost(m, setup, gpu, attn_micro)
    p2p = _pipeline_p2p_seconds(m, setup, gpu)
    ring_hidden = hidden_collective_cost_seconds(ring.transfer_seconds - ring.exposed_seconds, gpu)
    model_comm = _model_parallel_seconds(m, setup, gpu) + ring.exposed_seconds + ring_hidden if setup.megatron else 0.0
    if fp8 is not None:  # Megatron + --sp: TE all-gathers FP8 bytes (plan/fp8_megatron.py)
        model_comm -= fp8.tensor_parallel_all_gather_saving_seconds
    a2a = None
    if setup.expert_parallel > 1:  # not overlapped with compute (plan/expert_parallel.py)
        a2a = ep_mod.all_to_all_time(m, gpu, ep=setup.expert_parallel, tokens=tokens,
                                     activation_bytes=_mode(setup.activation_precision).compute, grad_ckpt=setup.grad_ckpt,
                                     gpus_per_node=setup.gpus_per_node,
                                     inter_node_bytes_per_second=setup.inter_node_bytes_per_second)
        model_comm += a2a.seconds_per_micro_batch
    per_micro = compute + memory + overhead + model_comm
    opt_time = _optimizer_traffic_bytes(m, setup) / bw / mp
    comm = 0.0
    dp = setup.data_parallel
    group = setup.gradient_group  # gradients are all-reduced over data x context parallel ranks
    # data-parallel ranks sit tp x pp apart: their ring leaves the node once the job does
    link = collective_link(gpu, setup.num_gpus if group > 1 else 1, gpus_per_node=setup.gpus_per_node,
                           inter_node_bytes_per_second=setup.inter_node_bytes_per_second)
    # what the gradient ring moves per GPU: Megatron's data-parallel ranks sit tp apart, so a node
    # holds gpus_per_node / tp of them (plan/links.py)
    dp_bus = ring_bus_bytes_per_second(gpu, group, gpus_per_node=setup.gpus_per_node,
                                       inter_node_bytes_per_second=setup.inter_node_bytes_per_second,
                                       ranks_per_node=max(1, setup.gpus_per_node // setup.tensor_parallel)) if group > 1 else 0.0
    if group > 1:
        grad_bytes = (adapter_params(m, lora) * lora.adapter_bytes if lora is not None else
                      m.params * _gradient_ring_bytes_per_param(setup) / mp)
        if setup.zero_stage >= 3 and lora is None and not setup.megatron:
            # every micro-batch gathers each layer's parameters in the forward and again in the
            # backward, and reduce-scatters its gradients: hidden only behind one layer's compute
            comm = setup.grad_accum * zero3_exposed_seconds(m, setup, gpu, per_micro)
        else:
            ar = 2 * (group - 1) / group * grad_bytes / dp_bus
            if setup.expert_parallel > 1 and lora is None:  # experts reduced over dp / ep only
                ar = ep_mod.gradient_ring_seconds(ep_mod.expert_split(m, setup.expert_parallel, dp),
                                                  grad_bytes / m.params, dp_bus)
            if setup.zero_stage >= 3:
                ar *= 1.5  # parameters are all-gathered in the forward and the backward
            # the all-reduce overlaps the backward (about 2/3 of the compute) of the last micro-batch,
            # slowing it while it runs (plan/overlap.py)
            comm = max(0.0, ar - (2 / 3) * per_micro) + hidden_collective_cost_seconds(min(ar, (2 / 3) * per_micro), gpu)
    # 1F1B: p - 1 micro-batch slots of the pipeline bubble on top of the micro-batches; interleaved,
    # (p - 1) / V (plan/interleaved.py)
    p, v = setup.pipeline_parallel, setup.virtual_stages
    slots = setup.grad_accum + interleaved.bubble_slots(p, v)
    off = None
    if setup.offload == "optimizer":  # once per step, not overlapped (no delayed parameter update)
        off = offload_mod.offload_time(ep_mod.partition_params(m, ep=setup.expert_parallel, data_parallel=setup.num_gpus,
                                                               zero_stage=setup.zero_stage),
                                       min(setup.num_gpus, setup.gpus_per_node), gpu)
    # Megatron: the output layer on the last stage, which sets the pipeline's pace (plan/megatron_step.py)
    head = (megatron_step.output_layer_seconds(m, setup, precision, matmul_flops_per_second=_peak_for(gpu, precision, eff),
                                               bandwidth_bytes_per_second=bw) if setup.megatron else None)
    slots_seconds, head_compute, head_memory = megatron_step.pipeline_step_seconds(
        per_micro, head, setup.grad_accum, interleaved.bubble_slots(p, v))
    acc_step = acc_seconds * acc.accumulations_per_step if acc and not acc.every_micro_batch else 0.0
    fp8_step = fp8.weight_cast_seconds_per_step if fp8 is not None else 0.0  # Megatron: cast once per step
    step = slots_seconds + opt_time + comm + acc_step + (off.seconds if off else 0.0) + fp8_step
    global_tokens = tokens * setup.grad_accum * dp
    tps = global_tokens / step
    fmt = "fp32" if setup.precision == "fp32" else ("fp16" if "fp16" in setup.precision else "bf16")
    model_fpt = model_flops_per_token(m, setup.seq_len) if lora is None else fpt  # LoRA: what it computes
    mfu = tps * model_fpt / (setup.num_gpus * gpu.peak_flops(fmt))
    return TrainSpeed(
        step_seconds=step,
        tokens_per_second=tps,
        samples_per_second=global_tokens / setup.seq_len / step,
        flops_per_token=fpt,
        mfu_ratio=mfu,
        compute_seconds=compute * slots + head_compute,
        memory_seconds=memory * slots + head_memory + opt_time + acc_step + fp8_step,
        overhead_seconds=overhead * slots,
        communication_seconds=comm + model_comm * slots,
        efficiency_source=eff.source,
        nodes=nodes_for(setup.num_gpus, setup.gpus_per_node),
        communication_link=link.name if group > 1 else "",
        communication_link_bytes_per_second=link.bytes_per_second if group > 1 else 0.0,
        communication_bus_bytes_per_second=dp_bus,
        tensor_parallel_link=(collective_link(gpu, setup.tensor_parallel, gpus_per_node=setup.gpus_per_node,
                                              inter_node_bytes_per_second=setup.inter_node_bytes_per_second).name
                              if setup.tensor_parallel > 1 else ""),
        pipeline_bubble_ratio=interleaved.bubble_slots(p, v) / slots,
        pipeline_bubble_over_compute_ratio=interleaved.bubble_over_compute_ratio(p, v, setup.grad_accum),
        pipeline_virtual_stages=v,
        pipeline_p2p_seconds=p2p * slots,
        output_layer_last_stage_seconds=head.last_stage_seconds * setup.grad_accum if head else 0.0,
        grad_accumulation_seconds=acc_seconds * acc.accumulations_per_step if acc else 0.0,
        context_parallel=cp,
        context_parallel_link=ring.link,
        context_parallel_transfer_seconds=ring.transfer_seconds * slots,
        context_parallel_exposed_seconds=ring.exposed_seconds * slots,
        attention_kernel=attn.kernel if attn else "",
        attention_seconds=attn.seconds_per_token * tokens / mp / cp * slots if attn else 0.0,
        attention_source=attn.source if attn else "",
        mfu_peak_format=fmt,
        fp8=fp8,
        expert_all_to_all_seconds=a2a.seconds_per_micro_batch * slots if a2a else 0.0,
        expert_all_to_all_link=a2a.link if a2a else "",
        expert_all_to_all_count=a2a.count if a2a else 0,
        expert_all_to_all_buffer_bytes=a2a.buffer_bytes if a2a else 0.0,
        offload_pcie_seconds=off.pcie_seconds if off else 0.0,
        offload_cpu_adam_seconds=off.cpu_adam_seconds if off else 0.0,
        offload_host_link=off.host_link if off else "",
        offload_host_link_bytes_per_second=off.host_link_bytes_per_second if off else 0.0,
    )


def _model_parallel_seconds(m: ModelSpec, setup: TrainSetup, gpu: GpuSpec) -> float:
    """Per micro-batch, on one GPU: tensor parallelism's all-reduces (two in the forward, two in
    the backward per layer, two more with recomputation, each a ring all-reduce priced by size,
    degree and link as NCCL prices it; the same volume as reduce-scatter +
    all-gather under sequence parallelism), not overlapped, over the TP group's link; pipeline
    parallelism's activation and gradient sends between stages over theirs."""
    t, p = setup.tensor_parallel, setup.pipeline_parallel
    msg = _activation_message_bytes(m, setup)
    seconds = 0.0
    if t > 1:
        ar = ring_all_reduce(msg, t, gpu, gpus_per_node=setup.gpus_per_node,
                             inter_node_bytes_per_second=setup.inter_node_bytes_per_second)
        seconds += m.num_layers / p * (6 if setup.grad_ckpt else 4) * ar.seconds
    return seconds + _pipeline_p2p_seconds(m, setup, gpu)


def _activation_message_bytes(m: ModelSpec, setup: TrainSetup) -> float:
    """bf16 activations of the micro-batch's share of the sequence this GPU holds (1/cp of it)."""
    return setup.micro_batch * setup.seq_len / setup.context_parallel * m.hidden_size * 2


def _pipeline_p2p_seconds(m: ModelSpec, setup: TrainSetup, gpu: GpuSpec) -> float:
    """Per micro-batch, on one GPU: the activation sent to the next stage and its gradient sent
    back; interleaved over V chunks, each micro-batch crosses V stage boundaries each way
    (Narayanan et al. 2021, 2.2.2: "the amount of communication also increases by v")."""
    t, p = setup.tensor_parallel, setup.pipeline_parallel
    if p <= 1:
        return 0.0
    msg = _activation_message_bytes(m, setup)
    link = collective_link(gpu, t * setup.context_parallel * p, gpus_per_node=setup.gpus_per_node,
                           inter_node_bytes_per_second=setup.inter_node_bytes_per_second)
    # without sequence parallelism, Megatron's scatter/gather: 1/t per rank, then a TP all-gather (plan/megatron_step.py)
    return 2 * setup.virtual_stages * megatron_step.scatter_gather_p2p_seconds(msg, setup, gpu, link.nccl_bytes_per_second)


def zero3_exposed_seconds(m: ModelSpec, setup: TrainSetup, gpu: GpuSpec, per_micro_seconds: float) -> float:
    """ZeRO-3 / FSDP FULL_SHARD communication one micro-batch leaves exposed, on one GPU, plus what
    the hidden rest costs the compute it runs beside (plan/overlap.py).

    Per transformer block (FSDP's wrapping unit in llm-foundry, torchtitan and transformers'
    auto-wrap): an all-gather of its parameters before its forward, another before its backward,
    and a reduce-scatter of its gradients after it, each a ring over the data-parallel group
    (`links.ring_gather_or_scatter`). In the forward the next unit's all-gather runs on its own
    stream beside this unit's compute (FSDP's implicit prefetch). In the backward, with a backward
    prefetch (`--backward-prefetch pre`, FSDP's default, or `post`), the next all-gather and this
    unit's reduce-scatter share one NCCL stream beside the next unit's compute. So a unit's
    collectives hide only behind one unit's compute: exposed = the first gather (nothing runs
    before it), then per block max(0, gather - forward compute) and max(0, gather + reduce-scatter
    - backward compute), then the last reduce-scatter. Without one (`none`) the reduce-scatter
    blocks the next all-gather and that unit's backward waits for both: gather + reduce-scatter
    per block (PyTorch docs/source/notes/fsdp.rst, "FSDP Prefetch Nuances": "0 overlap").
    Gathered dtype: the module's compute dtype (bf16 under FSDP MixedPrecision and DeepSpeed, the
    fp32 weights under the plain `fsdp` layout with autocast); gradients reduced in `--reduce-dtype`,
    by default fp32 under amp (Composer's DEFAULT from 0.16.4), else in the weights' dtype.
    Source: PyTorch FSDP docs and Zhao et al. 2023 (PyTorch FSDP, VLDB), sections 3.3-3.4."""
    dp = setup.data_parallel
    if dp <= 1:
        return 0.0
    amp = setup.precision in ("amp_bf16", "amp_fp16", "fp8")
    gather_bytes = 2 if setup.low_precision_module else _mode(setup.precision).weight
    reduce_bytes = REDUCE_DTYPES[setup.reduce_dtype] if setup.reduce_dtype else (4 if amp or setup.precision == "fp32" else 2)
    layers = max(m.num_layers, 1)
    block = m.block_params / layers
    kw = dict(gpus_per_node=setup.gpus_per_node, inter_node_bytes_per_second=setup.inter_node_bytes_per_second)
    gather = ring_gather_or_scatter(block * gather_bytes, dp, gpu, **kw).seconds
    scatter = ring_gather_or_scatter(block * reduce_bytes, dp, gpu, **kw).seconds
    fwd_share = 1 / 4 if setup.grad_ckpt else 1 / 3  # recomputation runs in the backward
    per_layer = per_micro_seconds / layers
    fwd, bwd = fwd_share * per_layer, (1 - fwd_share) * per_layer
    backward = gather + scatter if setup.backward_prefetch == "none" else max(0.0, gather + scatter - bwd)
    exposed = gather + (layers - 1) * max(0.0, gather - fwd) + (layers - 1) * backward + scatter
    # what hides still slows the compute beside it (plan/overlap.py)
    return exposed + hidden_collective_cost_seconds(layers * (2 * gather + scatter) - exposed, gpu)
