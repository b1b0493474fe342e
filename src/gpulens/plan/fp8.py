"""FP8 training as NVIDIA Transformer Engine runs it (`--precision fp8`).

Mechanism (TE docs, "Using FP8 with Transformer Engine"; the recipe is
`transformer_engine.common.recipe.DelayedScaling`, whose defaults are fp8_format=Format.HYBRID,
amax_history_len=1024, amax_compute_algo="max"): inside `te.fp8_autocast` every TE Linear runs its
three GEMMs in FP8 on the tensor cores: the forward (Y = X W^T), the data gradient (dX = dY W) and
the weight gradient (dW = dY^T X); HYBRID means E4M3 for the forward tensors (inputs, weights) and
E5M2 for the gradients. Everything else stays 16-bit: the attention core (the flash kernel), the
norms, the activation functions, the softmax, the output head (Megatron-LM / NeMo build the output
layer from their own ColumnParallelLinear, not a TE module) and the loss.

What the planner assumes, and where it comes from:
- Layout: the amp_bf16 one the planner already has (fp32 weights, fp32 gradients, fp32 AdamW
  moments; the non-TE ops under bf16 autocast). TE casts its fp32 weights straight to FP8
  (`fp8_cast_transpose_fused(weight, ...)` in transformer_engine/pytorch/module/linear.py,
  `_Linear.forward`, TE 1.x), so the Linear layers keep no 16-bit autocast copy; the output head
  (plain PyTorch) still does.
- FP8 weight copies: the cast writes a row-wise FP8 copy (forward GEMM) and a transposed one
  (`weight_t_fp8`, saved for the dgrad GEMM), held in module buffers (`weight1_fp8`,
  `weight1_t_fp8`, TE 1.x base.py `set_fp8_weights`) that live as long as the module: 2 bytes per
  parameter of every FP8 Linear, at every moment of the step (the optimizer step too).
- Scaling state: per TE module `fp8_meta["scaling_fwd"]` holds 3 FP8 tensors per GEMM (input,
  weight, output) and `scaling_bwd` 2 (grad_output, grad_input) (TE 1.x base.py `set_meta_tensor`:
  "Max. number of fp8 tensors per GEMM = 3 ... for fwd and 2 ... for bwd"), each with an fp32
  amax history of amax_history_len rows, a scale and a scale_inv: (1024 + 2) x 5 x 4 bytes =
  20,520 bytes per Linear.
- Saved activations: each FP8 Linear saves, for its wgrad, the FP8 transposed copy of its input
  (`saved_inputmat_t = inputmat_t`, linear.py) instead of a 16-bit one: 1 byte per element where
  amp_bf16 saves 2. The flash kernel still keeps its 16-bit output, so o_proj's FP8 copy is 1 byte
  more, not less; the gate/up (or fc) inputs, the q/k/v inputs and down's (fc2's) input drop to 1.
- Speed: the FP8 GEMMs' FLOPs (6 x the FP8 Linears' parameters per token, 8 x with full
  recomputation) at the GPU's FP8 dense peak x a matmul ceiling. No measured FP8 matmul ceiling is
  in the project (Stas Bekman's ml-engineering mamf-finder table is BF16 only), so the FP8 GEMMs
  are assumed to reach the same share of the FP8 peak as the 16-bit ones reach of theirs (the
  16-bit ceiling, plan/kernels.py MATMUL_CEILING, or the calibrated compute ratio): an assumption,
  stated in the output's `ceiling_source`.
- Cast traffic, priced at the memory bandwidth like the other elementwise work: each FP8 GEMM
  input is quantized by a fused cast + transpose (read 2 bytes, write 1 + 1 per element): the
  Linear's input in the forward (again under full recomputation), the output gradient in the
  backward (`grad_output_preprocess`: cast + transpose); the weights are cast from fp32 (read 4,
  write 1 + 1) every micro-batch (`is_first_microbatch=None`, the default, recasts each forward).
- MFU stays reported against the GPU's dense 16-bit (bf16) peak, so that FP8 and bf16 runs of
  one model read on one scale (`mfu_peak_format`: "bf16"); against the FP8 peak it would be
  about half. There is no single published convention for FP8 MFU; this one is the planner's.

Megatron-style runs (--tp/--pp/--cp, --zero 1 as the distributed optimizer) keep a bf16 module,
cast its weights once per step and shard what TE keeps: plan/fp8_megatron.py.

Not modelled (refused): LoRA / QLoRA, MoE and encoder models, and, without --tp/--pp/--cp, the
DeepSpeed and FSDP-bf16 ZeRO layouts; GPUs without FP8 tensor cores.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gpulens.errors import BadInputError
from gpulens.plan.catalog import GpuSpec, UnsupportedPrecisionError
from gpulens.plan.models import ModelSpec

AMAX_HISTORY_LEN = 1024  # DelayedScaling's default amax_history_len (TE >= 0.8 docs, common API)
FP8_TENSORS_PER_GEMM = 3 + 2  # forward: input, weight, output; backward: grad_output, grad_input (TE base.py)
# amax history + scale + scale_inv, fp32, per single-GEMM TE module
SCALING_BYTES_PER_LINEAR = (AMAX_HISTORY_LEN + 2) * FP8_TENSORS_PER_GEMM * 4
FP8_WEIGHT_COPY_BYTES = 2  # row-wise FP8 copy + the transposed FP8 copy, per parameter
CAST_BYTES_PER_ELEMENT = 2 + 1 + 1  # fused cast + transpose of a 16-bit tensor: read 2, write 1 + 1
WEIGHT_CAST_BYTES_PER_PARAM = 4 + 1 + 1  # the fp32 weight cast + transposed each micro-batch
RECIPE = "DelayedScaling, Format.HYBRID (E4M3 forward, E5M2 gradients), amax history 1024, max"


@dataclass(frozen=True)
class Fp8Linear:
    """One FP8 Linear of a transformer block (per layer)."""

    name: str
    in_features: int
    out_features: int

    @property
    def params(self) -> int:
        return self.in_features * self.out_features


def fp8_linears(m: ModelSpec) -> list[Fp8Linear]:
    """The Linear layers of one block that TE runs in FP8 (the output head is not one of them)."""
    h, q, kv = m.hidden_size, m.q_size, m.kv_size
    inter = m.intermediate_size
    out = [Fp8Linear("qkv_proj", h, q + 2 * kv)] if m.qkv_fused else [
        Fp8Linear("q_proj", h, q), Fp8Linear("k_proj", h, kv), Fp8Linear("v_proj", h, kv)]
    out.append(Fp8Linear("o_proj", q, h))
    if m.mlp == "gated":
        out += [Fp8Linear("gate_up_proj", h, 2 * inter)] if m.gate_up_fused else [
            Fp8Linear("gate_proj", h, inter), Fp8Linear("up_proj", h, inter)]
        out.append(Fp8Linear("down_proj", inter, h))
    else:
        out += [Fp8Linear("fc_in", h, inter), Fp8Linear("fc_out", inter, h)]
    return out


def fp8_linear_params(m: ModelSpec) -> int:
    """Parameters of every FP8 Linear (all layers): the weights TE keeps FP8 copies of."""
    return m.num_layers * sum(x.params for x in fp8_linears(m))


def check_fp8_gpu(gpu: GpuSpec) -> None:
    """FP8 training needs FP8 tensor cores (Hopper, Ada, Blackwell; MI300X)."""
    if not gpu.supports("fp8"):
        raise UnsupportedPrecisionError(
            f"The {gpu.name} has no FP8 tensor cores, so --precision fp8 (Transformer Engine) cannot run on it.",
            hint=f"Use --precision {'amp_bf16' if gpu.supports('bf16') else 'amp_fp16'} on this card, or pick a GPU "
                 "with FP8 (h100-sxm, h200, l40s, b200).")


def check_fp8_training(m: ModelSpec, *, finetune: str, megatron: bool, zero_layout: str, zero_stage: int) -> None:
    """Refuse what the FP8 model does not cover (one sentence, exit 2)."""
    if finetune != "full":
        raise BadInputError(f"--precision fp8 with --finetune {finetune} is not modelled (a frozen base under "
                            "Transformer Engine's FP8 GEMMs).", hint=f"Use --precision bf16 with --finetune {finetune}, "
                                                                     "or --finetune full with fp8.")
    if m.is_moe or m.encoder:
        raise BadInputError(f"--precision fp8 is modelled for dense decoders; {m.name} is "
                            f"{'a mixture of experts' if m.is_moe else 'an encoder'}.",
                            hint="Plan it with --precision amp_bf16.")
    # Megatron's own layout (bf16 module, fp32 main params) is what its TE runs use: any --zero-layout
    if zero_stage and zero_layout != "fsdp" and not megatron:
        raise BadInputError(f"--precision fp8 with data parallelism keeps the amp_bf16 layout (fp32 weights), and "
                            f"--zero-layout {zero_layout} is a 16-bit-module layout.",
                            hint="Use --zero-layout fsdp with fp8, or a Megatron layout (--tp/--pp/--cp).")


def saved_delta_bytes_per_token_layer(m: ModelSpec, *, selective_recompute: bool = False) -> int:
    """What one layer saves for backward under FP8 minus under amp_bf16, per token (negative: less).
    Each Linear's saved 16-bit input (2 bytes) becomes its FP8 transposed copy (1 byte); o_proj's
    input is the flash kernel's output, which the kernel keeps in 16-bit: its FP8 copy is extra,
    unless selective recomputation re-runs the core (then the kernel keeps nothing and o_proj's
    copy replaces its 16-bit input, as fp8_megatron prices it)."""
    linears = fp8_linears(m)
    readers_of_norms = sum(1 for x in linears if x.name not in ("o_proj", "down_proj", "fc_out"))
    return (-readers_of_norms * m.hidden_size  # q/k/v (or qkv) and gate/up (or fc_in): 2 -> 1 byte
            + (-m.q_size if selective_recompute else m.q_size)  # o_proj: its FP8 copy, beside or instead
            - m.intermediate_size)  # down_proj / fc_out: 2 -> 1 byte


def apply_fp8_memory(cands: dict[str, dict[str, int]], m: ModelSpec, *, tokens: int, grad_ckpt: bool,
                     zero3_gpus: int, activation_scale: float, notes: list[str], selective_recompute: bool = False) -> None:
    """Turn the amp_bf16 candidates of one step into FP8 ones, in place."""
    n8 = fp8_linear_params(m)
    copies = FP8_WEIGHT_COPY_BYTES * n8 // zero3_gpus
    scaling = m.num_layers * len(fp8_linears(m)) * SCALING_BYTES_PER_LINEAR
    dropped_autocast = 2 * n8 // zero3_gpus  # the Linears' bf16 autocast copies TE never makes
    layer_delta = int(saved_delta_bytes_per_token_layer(m, selective_recompute=selective_recompute) * tokens
                      * activation_scale)
    for name, c in cands.items():
        if c.get("autocast_weight_copies"):
            c["autocast_weight_copies"] = max(0, c["autocast_weight_copies"] - dropped_autocast)
        if "activations" in c and name != "optimizer step":
            if name == "layer recompute":
                c["activations"] += layer_delta  # the layer being recomputed (the others kept their inputs)
            elif not grad_ckpt:
                c["activations"] += m.num_layers * layer_delta
        c["fp8_weight_copies"] = copies
        c["fp8_scaling_state"] = scaling
    notes.append(f"FP8 (Transformer Engine, {RECIPE}): FP8 copies of the block Linears' weights, row-wise and "
                 f"transposed ({FP8_WEIGHT_COPY_BYTES} bytes per parameter, {n8:,} parameters), in place of their bf16 "
                 f"autocast copies; amax histories {SCALING_BYTES_PER_LINEAR:,} bytes per Linear; each Linear saves "
                 "its input as FP8 (1 byte per element); the fp32 weights, gradients and AdamW moments as amp_bf16")


@dataclass(frozen=True)
class Fp8Speed:
    """What FP8 changes in one micro-batch of one GPU (Megatron runs: its share, plan/fp8_megatron.py)."""

    gemms: list[str]  # the Linears whose forward, dgrad and wgrad GEMMs run in FP8
    gemm_flops_per_token: float  # of flops_per_token: the FP8 GEMMs
    fp8_peak_flops: float  # the GPU's dense FP8 peak
    ceiling_ratio: float  # the share of it the FP8 GEMMs are priced at
    ceiling_source: str
    gemm_seconds: float  # the FP8 GEMMs at that rate, per micro-batch
    cast_bytes: float  # quantize traffic per micro-batch (inputs, output gradients, weights)
    cast_seconds: float
    saved_activation_delta_bytes: float  # per micro-batch: FP8 saved inputs minus 16-bit ones (this GPU's layers)
    gemm_flops_per_micro_batch: float = 0.0  # this GPU's FP8 GEMM FLOPs (what they would take at the 16-bit rate)
    weight_cast_bytes_per_step: float = 0.0  # Megatron: the weights cast once per step (else in cast_bytes)
    weight_cast_seconds_per_step: float = 0.0
    tensor_parallel_all_gather_saving_seconds: float = 0.0  # Megatron + --sp: the TP all-gathers in FP8
    stays_16bit: str = "attention (flash kernel), norms, activations, softmax, output head, loss"
    recipe: str = RECIPE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def ceiling_source(compute_ratio: float, ratio_source: str) -> str:
    return (f"no measured FP8 matmul ceiling: assumed the same share of the FP8 peak as the 16-bit matmuls reach of "
            f"theirs ({compute_ratio:.0%}, {ratio_source})")


def fp8_speed(m: ModelSpec, gpu: GpuSpec, *, tokens: int, grad_ckpt: bool, compute_ratio: float,
              ratio_source: str, bandwidth_bytes_per_second: float, selective_recompute: bool = False) -> Fp8Speed:
    """The FP8 GEMMs' time and the cast traffic of one micro-batch of `tokens` tokens."""
    check_fp8_gpu(gpu)
    linears = fp8_linears(m)
    n8 = fp8_linear_params(m)
    flops = (8 if grad_ckpt else 6) * n8
    peak = gpu.peak_flops("fp8")
    ins = m.num_layers * sum(x.in_features for x in linears)
    outs = m.num_layers * sum(x.out_features for x in linears)
    cast = (tokens * ins * CAST_BYTES_PER_ELEMENT * (2 if grad_ckpt else 1)  # inputs (recomputed forward: again)
            + tokens * outs * CAST_BYTES_PER_ELEMENT  # output gradients, backward
            + n8 * WEIGHT_CAST_BYTES_PER_PARAM)  # fp32 weights -> FP8 + transposed FP8
    delta = 0.0 if grad_ckpt else m.num_layers * saved_delta_bytes_per_token_layer(
        m, selective_recompute=selective_recompute) * tokens
    source = ceiling_source(compute_ratio, ratio_source)
    return Fp8Speed(gemms=[x.name for x in linears], gemm_flops_per_token=flops, fp8_peak_flops=peak,
                    ceiling_ratio=compute_ratio, ceiling_source=source,
                    gemm_seconds=flops * tokens / (peak * compute_ratio), cast_bytes=cast,
                    cast_seconds=cast / bandwidth_bytes_per_second, saved_activation_delta_bytes=delta,
                    gemm_flops_per_micro_batch=flops * tokens)
