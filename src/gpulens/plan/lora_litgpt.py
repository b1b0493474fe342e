"""LoRA / QLoRA as LitGPT's `finetune/lora.py` runs it (`--lora-engine litgpt`): the memory its
resource tables report (Lightning-AI/litgpt tutorials/resource-tables.md, LitGPT commit 8641822,
PyTorch 2.1.0, bitsandbytes 0.41.1, `--precision bf16-true`, one GPU, `max_memory_allocated`).

LitGPT is not peft + transformers (plan/lora.py): its model code keeps other tensors for the
backward. Each item below was read in the code named and checked by walking autograd's saved
tensors of LitGPT's own `lit_gpt/lora.py` GPT (commit 8641822) under PyTorch 2.1.0 on the CPU
(docs/plan.md, "LoRA in LitGPT"):
- RMSNorm (`lit_gpt/rmsnorm.py`) computes in the input's dtype (no fp32 upcast):
  `x * torch.rsqrt(torch.mean(x * x, -1, keepdim=True) + eps)`; it keeps its input x and, under
  PyTorch 2.1, `torch.mean` keeps its input too (MeanBackward1 saves `self`): the square x*x.
  The frozen weight's product keeps nothing else.
- q/k/v are one fused Linear (`LoRAQKVLinear`): one dropout (p = 0.05, finetune/lora.py) on its
  input keeps a 1-byte mask (CUDA's fused dropout) and A's input (the dropout output); when not all
  of q, k, v are adapted, `zero_pad` scatters B's output with `index_copy`, whose backward keeps
  the source (derivatives.yaml: `grad.index_select(dim, index).expand_as(source)`).
- Attention: q and k are RoPE'd copies; v is a view of the fused qkv output (multi-head and
  multi-query: the reshape is a view), so the flash kernel's saved v keeps the whole qkv output
  alive; grouped-query heads expand k and v to every head (copies) first.
- MLP: fc_1's output, SiLU's output, fc_2's output; the frozen proj keeps nothing.
- Lightning's precision plugins convert the model's output to the default dtype
  (`Precision.convert_output`, lightning/fabric/plugins/precision/half.py, bitsandbytes.py): the
  chunked logits become fp32, and cross_entropy's log_softmax keeps an fp32 copy.
- QLoRA (`--quantize bnb.nf4[-dq]`): `BitsandbytesPrecision` replaces every `torch.nn.Linear`,
  the output head included (module_init_context patches the class; no ignore_modules), by an NF4
  Linear4bit; bitsandbytes' MatMul4Bit keeps each input that needs a gradient; Lightning quantizes
  from fp16 (`_quantize_weight`: `weight.to(torch.half)`), so each use dequantizes to fp16 and
  then casts to bf16 (`F.dequantize_4bit(B, state).to(A.dtype)`): 4 bytes per weight of the
  Linear at hand, the output head's (the largest) during its backward.
- Adapters in bf16 (bf16-true); torch AdamW keeps bf16 moments; QLoRA's bitsandbytes PagedAdamW
  keeps 32-bit moments in managed memory (outside PyTorch's allocator, a few megabytes).
"""

from __future__ import annotations

from gpulens.errors import BadInputError
from gpulens.plan.models import ModelSpec

NF4_BYTES = {True: 0.5 + 1 / 64 + 4 / (64 * 256), False: 0.5 + 4 / 64}  # double quantization or one fp32 absmax per 64
DROPOUT_MASK_BYTES = 1  # CUDA's fused dropout keeps a bool mask (native_dropout)
LITGPT_TARGETS = {"qv": ("q", "v"), "all": ("q", "k", "v", "o", "mlp")}  # finetune/lora.py: lora_query/lora_value; all to_*


def validate_litgpt(m: ModelSpec, precision: str, dtype: str, targets: str, grad_ckpt: bool, selective: bool,
                    gpus: int) -> None:
    if precision != "bf16":
        raise BadInputError("The LitGPT LoRA plan is for --precision bf16 (LitGPT's bf16-true), not " + precision + ".",
                            hint="Pass --precision bf16, or plan --lora-engine peft.")
    if dtype != "bf16":
        raise BadInputError("LitGPT's bf16-true keeps the adapters in bf16, not " + dtype + ".",
                            hint="Drop --lora-dtype (or pass --lora-dtype bf16) with --lora-engine litgpt.")
    if targets not in LITGPT_TARGETS:
        raise BadInputError(f"Unknown LoRA targets {targets!r}.", hint="Use --lora-targets qv or all.")
    if grad_ckpt or selective:
        raise BadInputError("LitGPT's finetune/lora.py checkpoints activations only under FSDP on several GPUs.",
                            hint="Drop --grad-ckpt / --recompute with --lora-engine litgpt.")
    if gpus != 1:
        raise BadInputError("The LitGPT LoRA plan is for one GPU (its resource tables' setting); on several GPUs "
                            "LitGPT runs FSDP with activation checkpointing.", hint="Pass --gpus 1, or --lora-engine peft.")


def weight_bytes(m: ModelSpec, qlora: bool, double_quant: bool) -> float:
    """LoRA: every parameter in bf16. QLoRA: every Linear (the output head too) in NF4."""
    if not qlora:
        return m.params * 2
    h, L = m.hidden_size, m.num_layers
    linears = L * (h * (m.q_size + 2 * m.kv_size) + m.q_size * h + 3 * h * m.intermediate_size) + m.lm_head_params
    return linears * NF4_BYTES[double_quant] + (m.params - linears) * 2


def layer_bytes_per_token(m: ModelSpec, targets: str, rank: int, qlora: bool, *, first: bool = False,
                          mask_bytes: int = DROPOUT_MASK_BYTES, mean_keeps_input: bool = True) -> float:
    """Bytes one layer keeps for the backward per token (bf16 activations). `mask_bytes`: what a
    dropout keeps per element (CUDA: a bool mask; the CPU keeps a 16-bit scaled noise tensor);
    `mean_keeps_input`: PyTorch 2.1's torch.mean keeps its input (later releases keep only sizes)."""
    c, h, inter = 2, m.hidden_size, m.intermediate_size
    a, g, q, kv = m.num_heads, m.num_kv_heads, m.q_size, m.kv_size
    t = LITGPT_TARGETS[targets]
    norm = (2 if mean_keeps_input else 1) * c * h + c  # input, its square (torch.mean's saved input), rsqrt
    out = norm * (1 if first else 2)  # the first layer's input comes from the frozen embedding: no gradient
    qkv_on = [s for s, size in (("q", q), ("k", kv), ("v", kv)) if s in t]
    if qkv_on:
        out += (0 if first else mask_bytes * h) + c * h + c * rank * len(qkv_on)
        if len(qkv_on) < 3:
            out += c * sum({"q": q, "k": kv, "v": kv}[s] for s in qkv_on)  # index_copy's source
    gqa = g not in (a, 1)
    out += c * q + c * (q if gqa else kv) + (c * q if gqa else c * (q + 2 * kv)) + c * q + 4 * a  # q, k, v, out, lse
    if "o" in t:
        out += mask_bytes * q + c * q + c * rank
    out += 3 * c * inter
    if "mlp" in t:
        out += 2 * (mask_bytes * h + c * h + c * rank) + mask_bytes * inter + c * inter + c * rank
    if qlora:  # MatMul4Bit keeps its inputs: qkv's (not in the first layer), fc_1/fc_2's shared one, proj's
        out += (0 if first else c * h) + c * h + c * inter
    return out


def head_bytes_per_token(m: ModelSpec, qlora: bool, *, mean_keeps_input: bool = True) -> float:
    """The final norm's input and square, the NF4 output head's input."""
    return (2 if mean_keeps_input else 1) * 2 * m.hidden_size + 2 + (2 * m.hidden_size if qlora else 0)


def activation_bytes(m: ModelSpec, targets: str, rank: int, qlora: bool, tokens: int) -> float:
    per_token = (layer_bytes_per_token(m, targets, rank, qlora, first=True)
                 + (m.num_layers - 1) * layer_bytes_per_token(m, targets, rank, qlora) + head_bytes_per_token(m, qlora))
    return tokens * per_token


def loss_candidates(m: ModelSpec, qlora: bool, tokens: int) -> dict[str, dict[str, int]]:
    """What sits beside the saved activations at the two peaks of the step's start: the backward's
    first op (fp32 logits and their fp32 log_softmax) and, under QLoRA, the output head's backward
    (fp32 logits, their bf16 gradient, the head's weight dequantized to fp16 and cast to bf16)."""
    v = m.vocab_size
    cands = {"backward start": {"logits_and_loss": tokens * 8 * v}}
    if qlora:
        cands["output head backward"] = {"logits_and_loss": tokens * 6 * v,
                                         "dequantized_weight": 4 * m.vocab_size * m.hidden_size}
    return cands
