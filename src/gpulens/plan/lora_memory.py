"""Training memory with LoRA / QLoRA adapters: the frozen base (16-bit, or NF4 for QLoRA), the
adapters with their gradients and optimizer states, and what each layer saves for the backward with
adapters beside its Linears; LitGPT's own accounting where the plan says `--lora-engine litgpt`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpulens.errors import BadInputError
from gpulens.plan import lora_litgpt as litgpt
from gpulens.plan.activations import (
    _head_bytes_per_token,
    _loss_bytes,
    _mode,
    layer_activation_bytes,
    recomputed_attention_bytes,
)
from gpulens.plan.lora import (
    PAGED_NOTE,
    LoraSetup,
    adapter_params,
    base_weight_bytes,
    head_and_first_norm_delta_per_token,
    largest_linear_params,
    layer_delta_per_token,
)
from gpulens.plan.memory_estimate import MemoryEstimate, peak_of
from gpulens.plan.models import ModelSpec

if TYPE_CHECKING:
    from gpulens.plan.memory import TrainSetup


def lora_layer_and_head_bytes(m: ModelSpec, lora: LoraSetup, precision: str, micro_batch: int,
                              seq: int, recompute: str = "none") -> tuple[float, float]:
    """(one layer, head + first norm) bytes saved for backward under LoRA, for the micro-batch."""
    tokens = micro_batch * seq
    c = _mode(precision).compute
    layer = layer_activation_bytes(m, precision, micro_batch, seq, recompute=recompute)
    per_layer = layer["attention"] + layer["mlp"] + layer["norms"] + tokens * layer_delta_per_token(m, lora, c)
    head = tokens * (_head_bytes_per_token(m, _mode(precision)) + head_and_first_norm_delta_per_token(m, c))
    return per_layer, head


def _lora_memory(m: ModelSpec, setup: TrainSetup, *, capacity_bytes: int, workspace_bytes: int,
                 cuda_context_bytes: int, reserved_ratio: float, activation_scale: float) -> MemoryEstimate:
    """LoRA / QLoRA (plan/lora.py): frozen base, adapters (fp32, or --lora-dtype) with their
    gradients and AdamW moments (in --lora-optimizer-dtype), the activations a frozen base keeps. Data parallel only replicates (no ZeRO: the
    sharded states would be the adapters' few megabytes)."""
    lora = setup.lora
    assert lora is not None
    lora.validate(m, setup.precision)
    if setup.optimizer not in ("adamw", "adamw8bit", "sgd"):
        raise BadInputError(f"LoRA planning takes --optimizer adamw, adamw8bit or sgd, not {setup.optimizer!r}.",
                            hint="Pass --optimizer adamw (paged AdamW is the same on the GPU).")
    mode = _mode(setup.precision)
    precision = setup.precision if lora.method == "lora" else "bf16"  # QLoRA computes in bf16
    b, s = setup.micro_batch, setup.seq_len
    tokens = b * s
    notes = [f"{'QLoRA' if lora.method == 'qlora' else 'LoRA'} rank {lora.rank} on the {lora.targets} Linear layers: "
             f"{adapter_params(m, lora):,} trainable parameters ({lora.dtype}; optimizer states "
             f"{lora.optimizer_dtype or lora.dtype}" + (", with an fp32 master copy" if lora.master_bytes else "")
             + "), base frozen"]
    n_ad = adapter_params(m, lora)
    base = base_weight_bytes(m, lora, mode.weight)
    per_state = {"adamw": 2 * lora.state_bytes, "adamw8bit": 2 + 8 / 256, "sgd": 0}[setup.optimizer]
    per_state += lora.master_bytes if setup.optimizer != "sgd" else 0
    if lora.engine == "litgpt":
        return _litgpt_lora_memory(m, setup, n_ad, per_state, notes, capacity_bytes=capacity_bytes,
                                   workspace_bytes=workspace_bytes, cuda_context_bytes=cuda_context_bytes,
                                   reserved_ratio=reserved_ratio, activation_scale=activation_scale)
    per_layer, head = lora_layer_and_head_bytes(m, lora, precision, b, s, setup.recompute)
    if setup.grad_ckpt:
        saved = m.num_layers * tokens * m.hidden_size * mode.residual + head
    else:
        saved = m.num_layers * per_layer + head
    saved = int(saved * activation_scale)
    loss = _loss_bytes(m, precision, tokens)
    ad = lora.adapter_bytes
    static = {"weights": int(base), "lora_adapters": n_ad * ad, "optimizer_states": int(n_ad * per_state),
              "cuda_workspace": workspace_bytes}
    if lora.method == "qlora":
        static["dequantized_weight"] = 2 * largest_linear_params(m)  # one Linear's bf16 weight at a time
        notes.append("QLoRA: block Linear weights in 4-bit NF4 " + ("with double quantization (0.516 bytes each); "
                     if lora.double_quant else "with an fp32 scale per 64 weights (0.5625 bytes each); ") + PAGED_NOTE)
    grads = n_ad * ad
    cands = {
        "backward start": static | {"gradients": grads if setup.grad_accum > 1 else 0, "activations": saved,
                                    "logits_and_loss": loss},
        "optimizer step": static | {"gradients": grads,
                                    "optimizer_step_temporaries": n_ad * max(ad, lora.state_bytes) if per_state else 0},
    }
    if setup.grad_ckpt or setup.selective_recompute:
        back = per_layer if setup.grad_ckpt else recomputed_attention_bytes(m, precision, b, s)
        cands["layer recompute" if setup.grad_ckpt else "attention recompute"] = static | {
            "gradients": grads, "activations": saved + int(back * activation_scale), "logits_and_loss": tokens * m.hidden_size * 4}
    return peak_of(cands, notes, reserved_ratio=reserved_ratio, cuda_context_bytes=cuda_context_bytes,
                    capacity_bytes=capacity_bytes)


def _litgpt_lora_memory(m: ModelSpec, setup: TrainSetup, n_ad: int, per_state: float, notes: list[str], *,
                        capacity_bytes: int, workspace_bytes: int, cuda_context_bytes: int, reserved_ratio: float,
                        activation_scale: float) -> MemoryEstimate:
    """LoRA / QLoRA as LitGPT's finetune/lora.py runs it on one GPU (plan/lora_litgpt.py)."""
    lora = setup.lora
    assert lora is not None
    qlora = lora.method == "qlora"
    litgpt.validate_litgpt(m, setup.precision, lora.dtype, lora.targets, setup.grad_ckpt, setup.selective_recompute,
                           setup.num_gpus)
    if qlora and setup.optimizer == "adamw":
        per_state = 8  # bitsandbytes' PagedAdamW: 32-bit moments (in managed memory)
        notes[0] = notes[0].replace(f"optimizer states {lora.optimizer_dtype or lora.dtype}",
                                    "optimizer states fp32 in bitsandbytes' PagedAdamW")
    tokens = setup.micro_batch * setup.seq_len
    grads = n_ad * lora.adapter_bytes
    static = {"weights": int(litgpt.weight_bytes(m, qlora, lora.double_quant)), "lora_adapters": grads,
              "optimizer_states": int(n_ad * per_state), "cuda_workspace": workspace_bytes}
    saved = int(litgpt.activation_bytes(m, lora.targets, lora.rank, qlora, tokens) * activation_scale)
    live = {"gradients": grads if setup.grad_accum > 1 else 0, "activations": saved}
    cands = {k: static | live | extra for k, extra in litgpt.loss_candidates(m, qlora, tokens).items()}
    cands["optimizer step"] = static | {"gradients": grads, "optimizer_step_temporaries": grads if per_state else 0}
    notes.append("LitGPT finetune/lora.py (bf16-true, one GPU): its RMSNorm in bf16, one dropout on the fused qkv "
                 "input, fp32 logits from Lightning's precision plugin" + (
                     "; every Linear, the output head too, in NF4 " + ("with" if lora.double_quant else "without")
                     + " double quantization, bitsandbytes PagedAdamW" if qlora else ""))
    return peak_of(cands, notes, reserved_ratio=reserved_ratio, cuda_context_bytes=cuda_context_bytes,
                    capacity_bytes=capacity_bytes)
