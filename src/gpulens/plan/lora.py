"""LoRA and QLoRA fine-tuning as peft runs it: a frozen base, low-rank adapters on chosen Linear
layers, optimizer states for the adapters only.

Memory, per mechanism (checked against autograd's saved tensors of a real peft model on the CPU,
tests/plan/test_lora.py):
- base weights frozen in the precision's dtype; QLoRA stores the blocks' Linear weights as 4-bit
  NF4 with one 8-bit scale per 64 weights and one fp32 scale per 256 of those (double
  quantization: 0.516 bytes per weight), embeddings, norms and the head in 16-bit;
- adapters A (r x in) and B (out x r) per targeted Linear, kept in fp32 (peft's default
  `autocast_adapter_dtype`), with fp32 gradients and AdamW moments for them alone;
- activations: a frozen Linear saves nothing for its weight gradient, so its input is kept only
  where something else needs it: each targeted Linear's adapter saves its input cast to fp32 (a
  copy per adapter when the activations are 16-bit, the same tensor when they are fp32) and its
  r-wide A output; frozen norms keep only their fp32 input; the first layer's input norm saves
  nothing (no gradient flows below the first adapter); the output head's input is not kept.
Speed: no weight gradients for the base (4 N FLOPs per token instead of 6 N); QLoRA dequantizes
each Linear's weight in the forward and the backward (and the recompute).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulens.errors import BadInputError
from gpulens.plan.models import ModelSpec

FINETUNE = ("full", "lora", "qlora")
TARGETS = {
    "all": ("q", "k", "v", "o", "gate", "up", "down"),  # every Linear of the blocks ("all-linear")
    "qv": ("q", "v"),  # peft's default for LLaMA-like models
}
ADAPTER_BYTES = 4  # fp32 adapters: peft's default (get_peft_model(..., autocast_adapter_dtype=True))
LORA_DTYPES = {"fp32": 4, "bf16": 2}  # --lora-dtype / --lora-optimizer-dtype
NF4_BYTES_PER_WEIGHT = 0.5 + 1 / 64 + 4 / (64 * 256)  # 4-bit codes + 8-bit block scales + fp32 scales of scales
# without double quantization each block of 64 weights keeps its fp32 absmax (bitsandbytes quantize_4bit)
NF4_BYTES_PER_WEIGHT_NO_DQ = 0.5 + 4 / 64
LORA_ENGINES = ("peft", "litgpt")  # peft + transformers (this module) | LitGPT finetune/lora.py (plan/lora_litgpt.py)
PAGED_NOTE = ("paged AdamW (bitsandbytes) keeps the adapters' states on the GPU and moves pages to the CPU only "
              "under memory pressure")


@dataclass(frozen=True)
class LoraSetup:
    method: str = "lora"  # lora | qlora
    rank: int = 16
    targets: str = "all"
    dtype: str = "fp32"  # the adapters' weights and gradients: fp32 (peft's default) or bf16
    optimizer_dtype: str | None = None  # the AdamW moments; None = the adapters' dtype (torch.optim makes them so)
    engine: str = "peft"  # peft | litgpt
    double_quant: bool = True  # QLoRA: NF4 with double quantization (the QLoRA paper's set-up)

    @property
    def adapter_bytes(self) -> int:
        return LORA_DTYPES[self.dtype]

    @property
    def state_bytes(self) -> int:
        return LORA_DTYPES[self.optimizer_dtype or self.dtype]

    @property
    def master_bytes(self) -> int:
        """An fp32 master copy of 16-bit adapters, kept by a mixed-precision optimizer when the
        moments are fp32 (plain torch.optim would keep fp32 moments only for fp32 parameters)."""
        return 4 if self.adapter_bytes == 2 and self.state_bytes == 4 else 0

    def validate(self, m: ModelSpec, precision: str) -> None:
        if self.method not in ("lora", "qlora"):
            raise BadInputError(f"Unknown fine-tuning method {self.method!r}.", hint="Use --finetune full, lora or qlora.")
        if self.engine not in LORA_ENGINES:
            raise BadInputError(f"Unknown LoRA engine {self.engine!r}.", hint="Use --lora-engine peft or litgpt.")
        if self.rank < 1:
            raise BadInputError(f"The LoRA rank must be at least 1, not {self.rank}.", hint="Pass --lora-rank 16, say.")
        if self.targets not in TARGETS:
            raise BadInputError(f"Unknown LoRA targets {self.targets!r}.", hint=f"Use --lora-targets {' or '.join(TARGETS)}.")
        for flag, v in (("--lora-dtype", self.dtype), ("--lora-optimizer-dtype", self.optimizer_dtype or self.dtype)):
            if v not in LORA_DTYPES:
                raise BadInputError(f"Unknown {flag} {v!r}.", hint=f"Use {flag} fp32 or bf16.")
        if precision.startswith("amp"):
            raise BadInputError("LoRA is planned with the base in its storage dtype, not under autocast.",
                                hint="Pass --precision bf16 (the usual LoRA/QLoRA set-up) or fp32.")
        if m.is_moe or m.encoder or m.mlp != "gated" or m.qkv_fused or m.gate_up_fused:
            raise BadInputError(f"LoRA planning covers LLaMA-like decoders (separate q/k/v and gate/up projections); "
                                f"{m.name} ({m.family}) is not one.", hint="Plan full fine-tuning for it.")


def _linears(m: ModelSpec) -> dict[str, tuple[int, int]]:
    """(in, out) features of each Linear of a block."""
    h, inter = m.hidden_size, m.intermediate_size
    return {"q": (h, m.q_size), "k": (h, m.kv_size), "v": (h, m.kv_size), "o": (m.q_size, h),
            "gate": (h, inter), "up": (h, inter), "down": (inter, h)}


def adapter_params(m: ModelSpec, lora: LoraSetup) -> int:
    lin = _linears(m)
    return m.num_layers * sum(lora.rank * (lin[t][0] + lin[t][1]) for t in TARGETS[lora.targets])


def base_weight_bytes(m: ModelSpec, lora: LoraSetup, weight_bytes: int) -> float:
    if lora.method == "lora":
        return m.params * weight_bytes
    block_linears = m.num_layers * sum(i * o for i, o in _linears(m).values())
    nf4 = NF4_BYTES_PER_WEIGHT if lora.double_quant else NF4_BYTES_PER_WEIGHT_NO_DQ
    return block_linears * nf4 + (m.params - block_linears) * 2  # the rest stays 16-bit


def largest_linear_params(m: ModelSpec) -> int:
    return max(i * o for i, o in _linears(m).values())


def layer_delta_per_token(m: ModelSpec, lora: LoraSetup, compute_bytes: int) -> float:
    """Saved bytes per token of one layer under LoRA minus those of full fine-tuning."""
    h, c = m.hidden_size, compute_bytes
    lin = _linears(m)
    targets = TARGETS[lora.targets]
    # gone: each norm's cast that only its (frozen) weight's gradient needs, and the inputs the
    # base Linears saved for their weight gradients (q/k/v share the norm output, gate/up too;
    # o_proj's input is the attention output, which the attention kernel keeps anyway)
    removed = 2 * c * h + c * h + c * h + c * lin["down"][0]
    if lora.method == "qlora":
        # bitsandbytes' MatMul4Bit saves its input whenever that input needs a gradient
        # (`if any(ctx.needs_input_grad[:2]): ctx.tensors = (A, B)`, bitsandbytes/autograd/
        # _functions.py), frozen 4-bit weight or not: the NF4 Linears keep the very inputs a frozen
        # torch Linear drops (q/k/v's and gate/up's shared inputs, down's)
        removed = 2 * c * h
    added = 0.0
    ad = lora.adapter_bytes
    for t in targets:
        if c != ad:
            added += ad * lin[t][0]  # the adapter's own copy of its input, cast to the adapter's dtype
        added += ad * lora.rank  # A's output, saved by B
    if c == ad:  # activations in the adapters' dtype: an adapter keeps the very input the base Linear kept
        chosen = set(targets)
        added += c * h * bool({"q", "k", "v"} & chosen) + c * h * bool({"gate", "up"} & chosen)
        added += c * lin["down"][0] * ("down" in chosen)
    return added - removed


def head_and_first_norm_delta_per_token(m: ModelSpec, compute_bytes: int) -> float:
    """The final norm's frozen-weight cast and the output head's input are not kept, and the first
    layer's input norm saves nothing (its fp32 input and per-token scale)."""
    c, h = compute_bytes, m.hidden_size
    return -(c * h + c * h) - (4 * h + 4 * 3)
