"""Activation memory of a Megatron-LM transformer layer under tensor and sequence parallelism and
activation recomputation, itemized tensor by tensor as Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models", section 4) count it: 16-bit activations,
1-byte dropout masks, a GPT layer (LayerNorm, attention with dropout, 4h GeLU MLP).

Without parallelism a layer saves s b h (34 + 5 a s / h) bytes; tensor parallelism t divides what
lies inside the parallel regions, s b h (10 + 24/t + 5 a s / (h t)); sequence parallelism also
divides the LayerNorm and dropout parts, s b h (34 + 5 a s / h) / t; selective recomputation drops
the attention core (5 a s^2 b), 34 s b h / t; full recomputation keeps the layer input, 2 s b h
(/ t with sequence parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulens.errors import BadInputError

RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class MegatronShape:
    seq: int  # s
    micro_batch: int  # b
    hidden: int  # h
    heads: int  # a
    layers: int = 1  # L


def layer_activation_items(x: MegatronShape, *, tensor_parallel: int = 1, sequence_parallel: bool = False,
                           recompute: str = "none") -> dict[str, float]:
    """Bytes one GPU saves for backward for one layer, by tensor (Korthikanti et al. 4.1)."""
    if recompute not in RECOMPUTE:
        raise BadInputError(f"Unknown recomputation {recompute!r}.", hint="Use none, selective or full.")
    t = tensor_parallel
    if t < 1 or x.heads % t:
        raise BadInputError(f"Tensor parallelism {t} must divide the {x.heads} attention heads.",
                            hint="Pick a degree that divides the heads.")
    sbh = x.seq * x.micro_batch * x.hidden
    as2b = x.heads * x.seq * x.seq * x.micro_batch
    outside = t if sequence_parallel else 1  # LayerNorms, dropouts and the inputs of the parallel regions
    if recompute == "full":
        return {"layer_input": 2 * sbh / outside}
    items = {
        # attention block
        "qkv_input": 2 * sbh / outside,
        "q_and_k": 4 * sbh / t,
        "softmax_output": 2 * as2b / t,
        "softmax_dropout_mask": as2b / t,
        "attention_dropout_output": 2 * as2b / t,
        "v": 2 * sbh / t,
        "output_projection_input": 2 * sbh / t,
        "attention_dropout_mask": sbh / outside,
        # MLP block
        "mlp_input": 2 * sbh / outside,
        "gelu_input": 8 * sbh / t,
        "gelu_output": 8 * sbh / t,
        "mlp_dropout_mask": sbh / outside,
        # two LayerNorms' inputs
        "layernorm_inputs": 4 * sbh / outside,
    }
    if recompute == "selective":  # the attention core (QK^T, softmax, dropout) is recomputed
        for k in ("softmax_output", "softmax_dropout_mask", "attention_dropout_output"):
            items.pop(k)
    return items


def activation_bytes(x: MegatronShape, *, tensor_parallel: int = 1, sequence_parallel: bool = False,
                     recompute: str = "none") -> float:
    """All layers on one GPU. With pipeline parallelism under 1F1B the first stage holds p
    micro-batches of L/p layers: the same L layers' worth (Korthikanti et al. 4.2.3)."""
    items = layer_activation_items(x, tensor_parallel=tensor_parallel, sequence_parallel=sequence_parallel,
                                   recompute=recompute)
    return x.layers * sum(items.values())


# ---------------------------------------------------------------- a LLaMA-like layer, Megatron-style


def llama_layer_items(*, seq: int, micro_batch: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
                      intermediate: int, tensor_parallel: int = 1, sequence_parallel: bool = False,
                      recompute: str = "none", flash: bool = True, gated: bool = True,
                      dropout: bool = False) -> dict[str, float]:
    """The same accounting for a grouped-KV layer as Megatron-LM runs it, with flash attention (no
    a s^2 b scores: the kernel keeps its output and per-row log-sum-exp) unless `flash` is False.

    The MLP's activation is fused with its bias (on by default: Megatron-LM's --no-bias-gelu-fusion
    and --no-bias-swiglu-fusion turn it off; Megatron-Core's `bias_activation_fusion`), and the fused
    kernel keeps only its input for the backward: a plain MLP keeps fc1's output and the GeLU's
    output (fc2's input), Korthikanti et al.'s "8sbh + 8sbh" at 4h; a gated one fc1's [gate | up]
    output (2 x intermediate) and the SwiGLU's output (megatron/core/fusions/fused_bias_swiglu.py:
    `ctx.save_for_backward(input, bias)`). With `dropout` (GPT-3's 0.1) each residual dropout keeps
    a 1-byte mask (sbh each) and unfused attention its softmax output, the dropout mask and the
    dropped probabilities (2 + 1 + 2 bytes a score: Korthikanti's 5as^2b), where without dropout
    the softmax output alone (Megatron's fused scale-mask-softmax keeps no input). Without
    recomputation, tensor or sequence parallelism this is Korthikanti et al.'s sbh (34 + 5as/h)."""
    t = tensor_parallel
    if recompute not in RECOMPUTE:
        raise BadInputError(f"Unknown recomputation {recompute!r}.", hint="Use none, selective or full.")
    s, b, h = seq, micro_batch, hidden
    sb = s * b
    outside = t if sequence_parallel else 1
    if recompute == "full":
        return {"layer_input": 2 * sb * h / outside}
    q, kv = heads * head_dim, kv_heads * head_dim
    items = {
        "norm_inputs": 2 * 2 * sb * h / outside,  # the two RMSNorms' inputs
        "qkv_input": 2 * sb * h / outside,
        "q": 2 * sb * q / t,
        "k_and_v": 2 * 2 * sb * kv / t,
        "attention_output": 2 * sb * q / t,  # o_proj's input (and the kernel's output)
        "mlp_input": 2 * sb * h / outside,
        # fc1's output (the fused activation's input: [gate | up] when gated) and fc2's input
        "fc1_output_and_act": (3 if gated else 2) * 2 * sb * intermediate / t,
    }
    if dropout:
        items["dropout_masks"] = 2 * sb * h / outside  # after the attention and after the MLP, 1 byte each
    if recompute == "selective":
        pass  # the attention core is recomputed: no scores, no log-sum-exp kept
    elif flash:
        items["softmax_lse"] = 4 * sb * heads / t
    else:
        items["scores"] = (5 if dropout else 2) * heads * s * s * b / t
    return items


def model_state_bytes_per_param(precision: str, data_parallel: int, distributed_optimizer: bool) -> float:
    """Megatron-LM's own table (docs, distributed optimizer): bf16 weights with fp32 gradients
    (main_grad) and fp32 master weights and Adam moments: 18 bytes per parameter, 6 + 12/d with the
    optimizer sharded over d data-parallel ranks; fp32 training: 16, 8 + 8/d."""
    d = data_parallel if distributed_optimizer else 1
    if precision == "fp32":
        return 8 + 8 / d
    return 6 + 12 / d
