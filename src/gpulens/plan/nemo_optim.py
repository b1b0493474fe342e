"""NeMo's distributed Adam and Megatron's vocab-parallel cross-entropy: what one GPU holds per
parameter and per vocabulary entry in a NeMo (Megatron-Core) pretraining run.

Read at the versions NVIDIA's NeMo 24.07 container pinned (NVIDIA/NeMo tag r2.0.0rc1, commit
579983fbfc85533df0fb53b30b5e9fca1a1159c9, Dockerfile.ci: APEX_TAG=810ffae374a2b9cb4b5c5e28eaeca7d7998fca0c,
MCORE_TAG=338af51452a53982d202e8386db6233adad1ce86 (on Megatron-LM's core_r0.8.0),
TE_TAG=7d576ed25266a17a7b651f2c12e8498f67e0baea):

`--zero-layout apex-distributed-adam` (NeMo `optim: name: distributed_fused_adam` =
nemo/core/optim/distributed_adam.py MegatronDistributedFusedAdam on Apex's
apex/contrib/optimizers/distributed_fused_adam.py DistributedFusedAdam), under `megatron_amp_O2: true`
with bf16 (the NeMo-Framework-Launcher recipes):
- the module's parameters stay bf16 (O2), and with `contiguous_param_buffer` they become views
  into one bf16 buffer (`init_param_buffer`): 2 bytes a parameter, nothing more;
- `contiguous_grad_buffer` (NeMo forces it under O2: megatron_base_model.py `setup_optimization`)
  allocates ONE buffer over every bucket, whole, not sharded (`_init_grad_buffer`: `torch.zeros(
  [buffer_size], dtype=grad_sync_dtype)`, buffer_size the end of the last bucket), in
  `grad_sync_dtype`, whose default is the optimizer's `dtype` (`if grad_sync_dtype is None:
  grad_sync_dtype = dtype`), which NeMo sets to fp32 (`get_config_arg('dtype', torch.float32)`);
  NeMo points each parameter's `main_grad` at its view of it (`zero_grad`), where TE's fused wgrad
  accumulation writes: 4 bytes a parameter;
- the reduce-scatter of each bucket writes a new shard (`_start_bucket_grad_sync`: `sync_grads_shard
  = torch.empty([shard_size])`), kept as `grads_shard` until the step (`_finish_bucket_grad_sync`):
  4 bytes / d;
- per bucket shard the Adam moments in `dtype` (`exp_avg_shard`, `exp_avg_sq_shard`: 8 bytes / d)
  and, because NeMo sets `store_params=False, store_param_remainders=True` when the optimizer is fp32
  and the model bf16, no fp32 master copy but its low 16 bits (`param_remainders_shard`, int16:
  2 bytes / d): the fp32 master weight is the bf16 parameter plus that remainder;
- d: the process group is `parallel_state.get_data_parallel_group(with_context_parallel=True)`
  (the data x context-parallel ranks), fully distributed unless `distribute_within_nodes`
  (default False; no recipe sets it).
So 2 + 4 + (4 + 8 + 2) / d = 6 + 14 / d bytes a parameter (Megatron's own distributed optimizer:
6 + 12 / d, plan/megatron.py).

`--zero-layout apex-distributed-adam-bf16`: the same optimizer with `optim.dtype: bf16` (the
nemotron_340b recipe, which also sets `grad_sync_dtype: bf16`): moments in bf16, grad buffer and
shards in bf16, and `store_params=False` without remainders (NeMo: `optim_dtype == model_dtype`):
2 + 2 + (2 + 4) / d = 4 + 6 / d bytes a parameter; but the word and position embeddings (and a tied
output layer) are `_with_fp32_optimizer` (megatron_gpt_model.py, `with_fp32_embedding_grads`
default True), bucketed with `grad_sync_dtype=torch.float32`: 4 + 4/d bytes of gradient for those.

`--reduce-dtype bf16|fp32` with either layout: NeMo's `optim.grad_sync_dtype`, the dtype of the whole
gradient buffer and of its reduce-scattered shards (Apex `_init_grad_buffer` and
`_start_bucket_grad_sync` allocate both in the bucket's `grad_sync_dtype`), whatever the moments' dtype;
its default is the optimizer's dtype (fp32 for apex-distributed-adam, bf16 for -bf16). The release's
own H100 FP8 run scripts set it to bf16 beside fp32 moments (NeMo-Framework-Launcher tag 24.07,
examples/training/{gpt/h100/*_fp8_*,llama/h100/llama{2,3}_*_fp8}.sh:
`+training.model.optim.grad_sync_dtype=bf16`): 2 + 2 + (2 + 8 + 2) / d = 4 + 12 / d bytes a
parameter. Whatever the dtype, the embeddings (and a tied output layer) keep fp32 gradients
(`_with_fp32_optimizer`, bucketed with `grad_sync_dtype=torch.float32`).

FP8 (`--precision fp8`) changes none of it: the recipes leave `fp8_params` False
(megatron_gpt_model.py `self.cfg.get('fp8_params', False)`), so TE casts the bf16 weights and caches
the FP8 copy and its transpose across micro-batches as plan/fp8_megatron.py prices (Megatron-Core
338af514 custom_layers/transformer_engine.py passes `is_first_microbatch`; TE 7d576ed2 and v1.8
linear.py: `cache_name=(None if is_first_microbatch is None else "weight")`).

`--loss vocab-parallel`: Megatron-Core's cross-entropy over the tensor-parallel vocabulary shards,
fused (`cross_entropy_loss_fusion: true`, megatron/core/fusions/fused_cross_entropy.py) or not
(megatron/core/tensor_parallel/cross_entropy.py; the same `VocabParallelCrossEntropy` steps, only
the two all-reduces batched into one): the bf16 logits shard is upcast to an fp32 copy
(`vocab_parallel_logits.float()`), then the max is subtracted, exponentiated and normalized IN PLACE
(`-=`, `torch.exp(..., out=)`, `div_`), and that fp32 softmax is saved for backward; the backward
turns it into the gradient in place and casts it to bf16 (`grad_input.to(torch.bfloat16)`, or the
`.float()`'s own backward unfused). At the end of the forward the bf16 logits (2 bytes) and the fp32
copy (4) are alive, at the start of the backward the fp32 softmax (4) and the bf16 gradient (2):
6 bytes per local vocabulary entry per token, either way.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulens.errors import BadInputError

APEX_LAYOUTS = ("apex-distributed-adam", "apex-distributed-adam-bf16")
VOCAB_PARALLEL_LOSS = "vocab-parallel"
VOCAB_PARALLEL_LOSS_BYTES_PER_ENTRY = 2 + 4  # bf16 logits (or bf16 gradient) + the fp32 softmax


@dataclass(frozen=True)
class ApexAdamStates:
    """Bytes on one GPU for its local parameters."""

    weights_bytes: float  # the bf16 module (contiguous param buffer)
    gradients_bytes: float  # the whole contiguous grad buffer (main_grad views)
    optimizer_states_bytes: float  # reduce-scattered grad shards + moments + param remainders, / d


def apex_grad_sync_bytes(layout: str, reduce_dtype: str | None) -> int:
    """Bytes a gradient element takes in the buffer and on the wire: `--reduce-dtype` when given,
    else the optimizer's dtype (Apex: `if grad_sync_dtype is None: grad_sync_dtype = dtype`)."""
    if reduce_dtype is not None:
        return {"fp32": 4, "bf16": 2}[reduce_dtype]
    return 4 if layout == "apex-distributed-adam" else 2


def apex_adam_states(params: float, *, layout: str, group: int, fp32_grad_params: float = 0.0,
                     grad_sync_bytes: int | None = None) -> ApexAdamStates:
    """`params` local parameters sharded over `group` data x context-parallel ranks;
    `fp32_grad_params`: of those, the embeddings' (fp32 gradients whatever the sync dtype);
    `grad_sync_bytes`: the gradient buffer's and shards' dtype (None: the layout's own)."""
    d = max(group, 1)
    g = apex_grad_sync_bytes(layout, None) if grad_sync_bytes is None else grad_sync_bytes
    # the moments (and, with fp32 moments over a bf16 module, the params' int16 remainders)
    states = (8.0 + 2.0) if layout == "apex-distributed-adam" else 4.0
    other = params - fp32_grad_params
    grads = g * other + 4.0 * fp32_grad_params
    return ApexAdamStates(2.0 * params, grads, (grads + states * params) / d)


def check_nemo_options(*, layout: str, loss: str, zero_stage: int, precision: str, megatron: bool) -> None:
    """Refuse the combinations these mechanisms do not describe (one sentence, exit 2)."""
    if layout in APEX_LAYOUTS:
        if not megatron:
            raise BadInputError(f"--zero-layout {layout} is NeMo's distributed Adam on a Megatron-Core model, and this "
                                "plan is a plain data-parallel one.",
                                hint="Add --megatron-core (or --tp/--pp/--cp), or use --zero-layout fsdp or deepspeed.")
        if zero_stage != 1:
            raise BadInputError(f"--zero-layout {layout} shards the optimizer states and gradient shards but keeps the "
                                f"whole gradient buffer and the bf16 module: that is --zero 1, not --zero {zero_stage}.",
                                hint="Use --zero 1 with it.")
        if precision not in ("bf16", "amp_bf16", "fp8"):
            raise BadInputError(f"--zero-layout {layout} is NeMo's megatron_amp_O2 bf16 layout (param remainders need a "
                                f"bf16 module), not --precision {precision}.",
                                hint="Use --precision bf16, amp_bf16 or fp8 with it.")
    if loss == VOCAB_PARALLEL_LOSS and not megatron:
        raise BadInputError("--loss vocab-parallel is Megatron's cross-entropy over tensor-parallel vocabulary shards, "
                            "and this plan is not a Megatron-Core one.",
                            hint="Add --megatron-core (or --tp/--pp/--cp), or use --loss torch or fused.")
