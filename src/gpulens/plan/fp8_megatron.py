"""FP8 training under Megatron-Core's model parallelism (`--precision fp8` with --tp/--pp/--cp/--sp,
--virtual-stages, and --zero 1 as the distributed optimizer), as Megatron-Core runs it with
Transformer Engine (TE) modules (`--fp8-format hybrid --fp8-recipe delayed`).

Sources, read at NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553 and
NVIDIA/TransformerEngine d0067d0da6cb01811b8072a7d304f0e00344ce2b:
- Layout: Megatron keeps the module in bf16 (Float16Module) with fp32 main_grad buffers and, with the
  distributed optimizer, fp32 main parameters and Adam moments sharded over the data(-and-context)-
  parallel ranks: the 6 + 12/d bytes a parameter plan/megatron.py already prices for bf16. FP8
  changes none of it: TE quantizes the bf16 weights (`quantize_weight(..., workspace_dtype=
  activation_dtype)`, transformer_engine/pytorch/module/linear.py).
- Which GEMMs: the TE layers of the layer spec (megatron/core/models/gpt/gpt_layer_specs.py:
  linear_qkv and linear_fc1 are `column_parallel_layer_norm_linear()`, the norm fused in;
  linear_proj and linear_fc2 `row_parallel_linear()`). The output layer is Megatron's own
  `tensor_parallel.ColumnParallelLinear` unless the MXFP8 output-projection option is on
  (megatron/core/models/gpt/gpt_model.py), so it stays bf16; so do the attention core, the
  activation function and the loss.
- Weight casts once per step: Megatron's TE wrappers pass `is_first_microbatch`
  (megatron/core/extensions/transformer_engine.py, `TELinear.forward`: True for the first
  micro-batch, set again by `set_is_first_microbatch` in pipeline_parallel/schedules.py
  `forward_step`, False after it), and TE re-quantizes the weight only when
  `update_workspace = is_first_microbatch is None or is_first_microbatch` (linear.py), caching it
  in the module's `_fp8_workspaces["weight"]` (module/base.py) across micro-batches and steps. So
  the FP8 weight and its transpose (2 bytes a local parameter) live for the whole run, and the
  cast (read 2 bytes of bf16, write 1 + 1) happens once per step, not per micro-batch
  (`disable_parameter_transpose_cache` turns the cache off; its default is False,
  transformer_config.py).
- Tensor parallelism: each TP rank's TE Linear holds its 1/t shard and runs its FP8 GEMMs on it
  (the FLOPs split as the bf16 ones do). Without sequence parallelism nothing FP8 crosses the
  group: the row-parallel outputs and the column-parallel dgrads are all-reduced in bf16
  (`allreduce(out, tp_group)`, linear.py). With sequence parallelism TE quantizes the local
  s/t shard first and all-gathers the FP8 bytes (`gather_along_first_dim(..., quantizer=...)`,
  distributed.py `_all_gather_fp8`, for the LayerNormLinear input in layernorm_linear.py and the
  row-parallel grad_output in base.py `grad_output_preprocess`); the reduce-scatters stay bf16
  (`reduce_scatter_along_first_dim(out, tp_group)`). So of each reduce-scatter + all-gather pair
  the speed model prices per layer (4, 6 with full recomputation), the all-gather moves 1 byte an
  element instead of 2. The same holds with userbuffers (`--tp-comm-overlap`, off by default).
- amax reductions: with delayed scaling Megatron wraps the whole TransformerBlock's forward in one
  fp8_autocast (transformer_block.py: "If fp8_recipe is delayed, wrap the entire pass"), grouped
  over tensor x data(x context) ranks (`get_amax_reduction_group`): one all-reduce of a few KB of
  amaxes per model chunk and pass, latency only (tens of microseconds), not priced.
- Saved activations (Korthikanti et al.'s per-layer items, plan/megatron.py llama_layer_items):
  the fused norm writes its output straight to FP8 and the LayerNormLinear saves that (1 byte:
  the transposed copy without sequence parallelism, the local row-wise shard with it, re-gathered
  in FP8 for the wgrad), so `qkv_input` and `mlp_input` halve; linear_fc2 saves its input as FP8
  (down's input, one of the four intermediate tensors, 2 -> 1 byte); linear_proj saves an FP8 copy
  of the attention output beside the bf16 one the attention kernel keeps (+1 byte), and under
  selective recomputation, where the checkpointed core keeps nothing, in place of it (2 -> 1).
  The norms' inputs stay bf16 (`inputmat` is saved as given); full recomputation keeps only the
  bf16 layer input.
- Pipeline and context parallelism: the stage-to-stage sends and the ring attention's K/V stay
  bf16 (the attention is not FP8 without fp8_dpa): unchanged.
- Scaling state: per TE module 5 FP8 tensors' amax history, scale and scale_inv (plan/fp8.py; TE's
  default history of 1024, which NeMo's recipes use; Megatron-LM's own default
  `fp8_amax_history_len` is 1: 60 bytes a module); 4 modules a layer.
Not credited: the quantized-norm kernel fusion (the norm-fed casts are priced like the others);
the FP8 wgrad GEMM's epilogue accumulation into main_grad is priced as plan/grad_accumulation.py
prices the bf16 one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpulens.plan.catalog import GpuSpec
from gpulens.plan.fp8 import (
    CAST_BYTES_PER_ELEMENT,
    FP8_WEIGHT_COPY_BYTES,
    SCALING_BYTES_PER_LINEAR,
    Fp8Speed,
    ceiling_source,
    check_fp8_gpu,
    fp8_linear_params,
)
from gpulens.plan.links import ring_gather_or_scatter
from gpulens.plan.models import ModelSpec

if TYPE_CHECKING:
    from gpulens.plan.memory import TrainSetup

BF16_WEIGHT_CAST_BYTES_PER_PARAM = 2 + 1 + 1  # the bf16 weight read, its FP8 copy and transposed copy written
TE_MODULES_PER_LAYER = 4  # linear_qkv, linear_proj, linear_fc1, linear_fc2 (gpt_layer_specs.py)


@dataclass(frozen=True)
class MegatronLinear:
    """One TE Linear of a Megatron-Core layer, whole (before the TP split)."""

    name: str
    in_features: int
    out_features: int
    parallel: str  # "column" (output split over TP) or "row" (input split)


def megatron_fp8_linears(m: ModelSpec) -> list[MegatronLinear]:
    """Megatron-Core's fused TE Linears of one layer: q/k/v fused into linear_qkv, gate and up
    into linear_fc1 (gpt_layer_specs.py)."""
    h, q, kv, inter = m.hidden_size, m.q_size, m.kv_size, m.intermediate_size
    fc1 = 2 * inter if m.mlp == "gated" else inter
    return [MegatronLinear("linear_qkv", h, q + 2 * kv, "column"), MegatronLinear("linear_proj", q, h, "row"),
            MegatronLinear("linear_fc1", h, fc1, "column"), MegatronLinear("linear_fc2", inter, h, "row")]


def fp8_layer_items(items: dict[str, float], m: ModelSpec, setup: TrainSetup) -> dict[str, float]:
    """plan/megatron.py's llama_layer_items for one layer as TE saves them under FP8 (module docstring)."""
    if setup.recompute == "full":
        return items  # the bf16 layer input only
    t = setup.tensor_parallel
    sb = setup.seq_len // setup.context_parallel * setup.micro_batch
    out = dict(items)
    out["qkv_input"] = items["qkv_input"] / 2  # the fused norm's FP8 output
    out["mlp_input"] = items["mlp_input"] / 2
    out["fc1_output_and_act"] = items["fc1_output_and_act"] - sb * m.intermediate_size / t  # fc2's input 2 -> 1
    if setup.recompute == "selective":  # the checkpointed core keeps no output: linear_proj's FP8 copy only
        out["attention_output"] = items["attention_output"] / 2
    else:  # the attention kernel's bf16 output, and linear_proj's FP8 copy of it
        out["linear_proj_fp8_input"] = sb * m.q_size / t
    return out


def fp8_static_bytes(m: ModelSpec, setup: TrainSetup) -> dict[str, int]:
    """Per GPU, for the whole run: the cached FP8 weight workspaces (row-wise + transposed, 2 bytes
    a local parameter of the TE Linears) and the scaling state of the stage's TE modules."""
    local = fp8_linear_params(m) / (setup.tensor_parallel * setup.pipeline_parallel)
    modules = m.num_layers // setup.pipeline_parallel * TE_MODULES_PER_LAYER
    return {"fp8_weight_copies": int(FP8_WEIGHT_COPY_BYTES * local),
            "fp8_scaling_state": modules * SCALING_BYTES_PER_LINEAR}


@dataclass(frozen=True)
class MegatronFp8Traffic:
    """What FP8 adds to one GPU's memory traffic and takes off its TP communication."""

    cast_bytes_per_micro_batch: float  # GEMM inputs (forward) and output gradients (backward) quantized
    weight_cast_bytes_per_step: float  # bf16 weights -> FP8 + transposed FP8, once per step
    saved_activation_delta_bytes: float  # per micro-batch, this GPU's layers: FP8 saved inputs minus bf16 ones
    tp_all_gather_saving_seconds: float  # per micro-batch: the sequence-parallel all-gathers in FP8


def megatron_fp8_traffic(m: ModelSpec, setup: TrainSetup, gpu: GpuSpec, base_items: dict[str, float]) -> MegatronFp8Traffic:
    """Per GPU: each TE Linear quantizes (fused cast + transpose, 4 bytes an element as plan/fp8.py
    prices it) what it holds: a column-parallel Linear's input whole without sequence parallelism
    (replicated over the group) or its s/t shard with it (quantized before the FP8 all-gather), a
    row-parallel one's input shard; in the backward a column-parallel Linear's output-gradient
    shard, a row-parallel one's whole (or its s/t shard, gathered in FP8). Full recomputation runs
    the forward casts again."""
    t, p = setup.tensor_parallel, setup.pipeline_parallel
    tokens = setup.micro_batch * setup.seq_len / setup.context_parallel
    seq_split = t if setup.sequence_parallel else 1
    fwd = bwd = 0.0
    for x in megatron_fp8_linears(m):
        if x.parallel == "column":
            fwd += x.in_features / seq_split
            bwd += x.out_features / t
        else:
            fwd += x.in_features / t
            bwd += x.out_features / seq_split
    layers = m.num_layers / p
    cast = layers * tokens * CAST_BYTES_PER_ELEMENT * (fwd * (2 if setup.grad_ckpt else 1) + bwd)
    weights = fp8_linear_params(m) / (t * p) * BF16_WEIGHT_CAST_BYTES_PER_PARAM
    fp8_items = fp8_layer_items(base_items, m, setup)
    delta = layers * (sum(fp8_items.values()) - sum(base_items.values()))
    saving = 0.0
    if setup.sequence_parallel and t > 1:
        full = tokens * m.hidden_size * 2  # the gathered bf16 activation (speed._activation_message_bytes)
        kw = dict(gpus_per_node=setup.gpus_per_node, inter_node_bytes_per_second=setup.inter_node_bytes_per_second)
        per_gather = (ring_gather_or_scatter(full, t, gpu, **kw).seconds
                      - ring_gather_or_scatter(full / 2, t, gpu, **kw).seconds)
        saving = layers * (6 if setup.grad_ckpt else 4) * per_gather
    return MegatronFp8Traffic(cast, weights, delta, saving)


def megatron_fp8_speed(m: ModelSpec, setup: TrainSetup, gpu: GpuSpec, base_items: dict[str, float], *,
                       compute_ratio: float, ratio_source: str, bandwidth_bytes_per_second: float) -> Fp8Speed:
    """One GPU's share of a Megatron micro-batch: its 1/(t p cp) of the FP8 GEMM FLOPs (6, or 8 with
    full recomputation, per TE Linear parameter and token) at the FP8 peak x the 16-bit matmul
    ceiling's share (plan/fp8.py), its casts, its saved-input delta, its FP8 all-gathers; the
    weight cast once per step."""
    check_fp8_gpu(gpu)
    split = setup.tensor_parallel * setup.pipeline_parallel * setup.context_parallel
    flops = (8 if setup.grad_ckpt else 6) * fp8_linear_params(m) * setup.micro_batch * setup.seq_len / split
    peak = gpu.peak_flops("fp8")
    tr = megatron_fp8_traffic(m, setup, gpu, base_items)
    return Fp8Speed(gemms=[x.name for x in megatron_fp8_linears(m)], gemm_flops_per_token=(8 if setup.grad_ckpt else 6)
                    * fp8_linear_params(m), fp8_peak_flops=peak, ceiling_ratio=compute_ratio,
                    ceiling_source=ceiling_source(compute_ratio, ratio_source),
                    gemm_seconds=flops / (peak * compute_ratio), cast_bytes=tr.cast_bytes_per_micro_batch,
                    cast_seconds=tr.cast_bytes_per_micro_batch / bandwidth_bytes_per_second,
                    saved_activation_delta_bytes=tr.saved_activation_delta_bytes, gemm_flops_per_micro_batch=flops,
                    weight_cast_bytes_per_step=tr.weight_cast_bytes_per_step,
                    weight_cast_seconds_per_step=tr.weight_cast_bytes_per_step / bandwidth_bytes_per_second,
                    tensor_parallel_all_gather_saving_seconds=tr.tp_all_gather_saving_seconds,
                    stays_16bit="attention core, norms, activation, output layer (ColumnParallelLinear), loss; "
                                "pipeline sends, ring-attention K/V, TP reduce-scatters / all-reduces")
