"""Model states per GPU under data parallelism with ZeRO sharding, in the two layouts people run.

- `fsdp` (PyTorch FSDP / ZeRO as PyTorch keeps it): under autocast the weights stay fp32 (the
  master copy is the module itself), gradients fp32, AdamW moments fp32. Stage 1 shards the
  optimizer states, 2 also the gradients, 3 also the weights (FSDP FULL_SHARD), over N GPUs.
- `deepspeed` (DeepSpeed's mixed-precision layout, ZeRO paper section 3.1): the module holds
  16-bit weights and gradients (2 + 2 bytes per parameter); the optimizer owns the fp32 master
  weights and both Adam moments (K = 12 bytes per parameter), sharded from stage 1 on. Stage 2
  shards the 16-bit gradients, stage 3 the 16-bit weights. This is what ZeRO Table 1 counts:
  (2 + 2 + K) Psi at stage 0, 2 Psi + 2 Psi + K Psi / N, 2 Psi + (2 + K) Psi / N, (2 + 2 + K) Psi / N.
  For the step DeepSpeed upcasts its gradient partition to fp32 (4 Psi / N more; stage 3 frees the
  16-bit shard as it goes), and stage 3 gathers the largest module's 16-bit weights and
  gradients (4 bytes per parameter of it): the terms of DeepSpeed's
  `estimate_zero2/3_model_states_mem_needs` (whose "zero2" figure keeps the 16-bit gradients
  whole, i.e. counts stage 1).

- `fsdp-bf16` (PyTorch FSDP with `MixedPrecision(param_dtype=bf16)`: Composer / llm-foundry's
  `DEFAULT` and `PURE` modes): the sharded FlatParameters keep their fp32 dtype (the master copy,
  sharded at stage 3), gradients are reduce-scattered into fp32 shards, the Adam moments are fp32;
  but each unit is gathered as bf16 and the module computes in bf16 without autocast, so the
  activations are pure 16-bit ones (a 16-bit residual stream, no per-Linear casts). Model states
  are the `fsdp` layout's; activations are the `deepspeed` layout's.

With fp32 or pure 16-bit training there is no separate master copy and the layouts coincide.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulens.errors import BadInputError
from gpulens.plan.models import ModelSpec

ZERO_LAYOUTS = ("fsdp", "deepspeed", "fsdp-bf16")
# ZeRO-3 / FSDP's backward prefetch (FSDP's `backward_prefetch`; speed.zero3_exposed_seconds prices it):
BACKWARD_PREFETCH = {
    "pre": "BACKWARD_PRE, FSDP's default (FSDP2 and DeepSpeed ZeRO-3 prefetch too): the next unit's all-gather "
           "is issued before this unit's gradient kernels, so it and this unit's reduce-scatter hide behind them",
    "post": "BACKWARD_POST (Composer's default): issued after them, reordered before the current reduce-scatter; "
            "priced as pre (the same order on the NCCL stream once the CPU runs ahead of the GPU)",
    "none": "no backward prefetch (NO_PREFETCH, the default of transformers' Trainer and HF Accelerate's FSDP plugin): this unit's "
            "reduce-scatter blocks the next all-gather on the one NCCL stream, so the backward's collectives do not "
            "overlap its compute",
}
REDUCE_DTYPES = {"fp32": 4, "bf16": 2}  # --reduce-dtype: bytes per gradient element reduce-scattered


def check_zero3_collectives(backward_prefetch: str, reduce_dtype: str | None) -> None:
    if backward_prefetch not in BACKWARD_PREFETCH:
        raise BadInputError(f"Unknown backward prefetch {backward_prefetch!r}.", hint="Use --backward-prefetch pre, post or none.")
    if reduce_dtype is not None and reduce_dtype not in REDUCE_DTYPES:
        raise BadInputError(f"Unknown gradient reduce dtype {reduce_dtype!r}.", hint="Use --reduce-dtype fp32 or bf16.")


@dataclass(frozen=True)
class ZeroStates:
    """Bytes per GPU. `weights`, `gradients`, `optimizer_states` persist through the step (what
    ZeRO Table 1 counts); the transients exist only around the optimizer step."""

    weights: float
    gradients: float
    optimizer_states: float  # fp32 master copy (deepspeed layout under amp) + the optimizer's moments
    fp32_gradient_partition: float = 0.0  # deepspeed: the gradient shard upcast for the step
    gathered_largest_module: float = 0.0  # deepspeed stage 3: the largest module's 16-bit weights + gradients
    gradients_freed_at_step: bool = False  # deepspeed stage 3 upcasts its 16-bit gradient shard sub-group by sub-group
    layout: str = "fsdp"

    @property
    def persistent_bytes(self) -> float:
        return self.weights + self.gradients + self.optimizer_states

    @property
    def at_step_bytes(self) -> float:
        grads = 0.0 if self.gradients_freed_at_step else self.gradients
        return self.weights + grads + self.optimizer_states + self.fp32_gradient_partition + self.gathered_largest_module


def check_layout(layout: str) -> None:
    if layout not in ZERO_LAYOUTS:
        raise BadInputError(f"Unknown ZeRO layout {layout!r}.",
                            hint="Use --zero-layout fsdp (PyTorch: fp32 weights under autocast), deepspeed "
                                 "(16-bit weights, fp32 master copy sharded with the optimizer states) or fsdp-bf16 "
                                 "(FSDP MixedPrecision: fp32 shards, bf16 compute).")


def zero_states(params: float, *, stage: int, gpus: int, layout: str, weight_bytes: int, state_bytes_per_param: float,
                amp: bool, largest_module_params: float = 0.0) -> ZeroStates:
    """Model states of one GPU. `weight_bytes`: bytes per parameter the module keeps in the fsdp
    layout (4 under amp); `state_bytes_per_param`: the optimizer's own states (8 for fp32 AdamW
    moments); `amp`: 16-bit compute over fp32 master weights."""
    check_layout(layout)
    n = max(gpus, 1)
    stage = stage if n > 1 else 0

    def shard(x: float, from_stage: int) -> float:
        return x / n if stage >= from_stage else x

    if layout == "deepspeed" and amp:
        master = 4.0 * params
        return ZeroStates(
            weights=shard(2.0 * params, 3),
            gradients=shard(2.0 * params, 2),
            optimizer_states=shard(master + state_bytes_per_param * params, 1),
            fp32_gradient_partition=4.0 * params / n if stage >= 1 else 0.0,
            gathered_largest_module=4.0 * largest_module_params if stage >= 3 else 0.0,
            gradients_freed_at_step=stage >= 3,
            layout=layout,
        )
    return ZeroStates(
        weights=shard(weight_bytes * params, 3),
        gradients=shard(weight_bytes * params, 2),
        optimizer_states=shard(state_bytes_per_param * params, 1),
        layout=layout,
    )


def largest_module_params(m: ModelSpec) -> int:
    """Parameters of the largest single module (what ZeRO-3 gathers at once): the embedding or
    output head of an LLM, else its largest Linear (a MoE's fused experts count as one)."""
    inter = max(m.intermediate_size, m.moe_intermediate_size or 0)
    linear = m.hidden_size * max(inter, m.q_size)
    experts = m.num_experts * m.hidden_size * (m.moe_intermediate_size or m.intermediate_size) if m.is_moe else 0
    return max(m.vocab_size * m.hidden_size, linear, experts)
