"""What quantized serving costs beyond the bytes it reads: weight-only int8 / int4 dequantization
on the CUDA cores, and FP8 activations scaled at run time.

FP8 W8A8 (`--dtype fp8`) multiplies FP8 weights by FP8 activations, so every activation that
enters a GEMM is quantized first. With dynamic scales (`--fp8-activations dynamic`, the default:
vLLM's online `--quantization fp8`, torchao's `float8_dynamic_activation_float8_weight`) that is
two kernels per GEMM input, every step: an absolute-max reduction, then the scale-and-cast. vLLM's
`dynamic_scaled_fp8_quant` (csrc/quantization/fp8/common.cu) launches
`segmented_max_reduction` then `scaled_fp8_quant_kernel` (after a memset of the scale); torchao's
`_choose_qparams_affine` + `_quantize_affine` become one reduction and one pointwise kernel under
Inductor. At decode sizes each costs its launch floor, not its bytes: torchao's own roofline model
(torchao/float8/roofline_utils.py @92dd5f5) takes "a triton kernel with a single element
read/write on an H100" as 2 us of GPU time (`TRITON_KERNEL_1_ELEMENT_TIME_SEC`). In a prefill the
bytes count: each kernel reads the 16-bit activation, the second also writes it in FP8. Static
scales (`static`: calibrated checkpoints, TensorRT-LLM's ModelOpt recipes) fold into the
preceding kernel and cost nothing here.

GEMM inputs per layer: the attention's input (one fused QKV GEMM), its output (O), the MLP's input
(gate and up, fused) and its intermediate (down): 4, plus the head's input when the head is
quantized (`quantize_head`). gpt-fast's model keeps w1 and w3 apart, each quantizing the same input
(5 a layer): not counted, about 2 % of a Llama-3.1-8B step at batch 1. Under tensor parallelism
each rank quantizes the O and down inputs of its own shard; the kernel count stays.
Not modelled: the GEMM kernels' own small-M behaviour (cuBLASLt's FP8 GEMM wants M a multiple of
16; vLLM pads the batch to 17 rows for `torch._scaled_mm`, vLLM PR #4691).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpulens.errors import BadInputError
from gpulens.plan.catalog import GpuSpec
from gpulens.plan.models import ModelSpec

if TYPE_CHECKING:
    from gpulens.plan.serve import ServeSetup

FP8_ACTIVATIONS = {
    "dynamic": "scaled at run time: an amax reduction and a cast per GEMM input, every step (vLLM's online fp8, torchao)",
    "static": "calibrated scales fixed in the checkpoint (TensorRT-LLM / ModelOpt): the cast folds into the previous kernel",
}
KERNEL_FLOOR_SECONDS = 2e-6  # torchao roofline_utils.py TRITON_KERNEL_1_ELEMENT_TIME_SEC, measured on an H100
GEMM_INPUTS_PER_LAYER = 4  # QKV, O, gate/up, down


def check_fp8_activations(scaling: str) -> None:
    if scaling not in FP8_ACTIVATIONS:
        raise BadInputError(f"Unknown FP8 activation scaling {scaling!r}.", hint="Use --fp8-activations dynamic or static.")


# Weight-only kernels (int8: gpt-fast's int8 Linear / AWQ-GPTQ int8; int4: tinygemm / Marlin style,
# grouped scales and zero points) turn every weight back into 16-bit on the CUDA cores before the
# multiply: operations per weight, counted from the kernel's arithmetic. int8: convert, then the
# FMA (2); int4: shift and mask out of the packed byte, convert, scale and zero point (one FMA, 2),
# then the FMA with the activation (2). Priced at the GPU's non-tensor FP32 rate and not
# overlapped with the weight stream (the GEMV waits on its dequantized registers).
DEQUANT_OPS_PER_WEIGHT = {"int8": 3.0, "int4": 6.0}



def expected_experts_touched(num_experts: int, experts_per_token: int, tokens: int) -> float:
    """Distinct experts of one MoE layer that `tokens` routed tokens touch, in expectation, with
    each token picking `experts_per_token` of `num_experts` uniformly: E (1 - (1 - k/E)^b)."""
    if num_experts <= 0:
        return 0.0
    return num_experts * (1 - (1 - experts_per_token / num_experts) ** max(tokens, 0))


def quantized_head_params(m: ModelSpec, setup: ServeSetup) -> int:
    """Parameters of the output head that `quantize_head` stores in the weight format: the
    untied head's vocabulary x hidden (gpt-fast's quantize.py replaces every nn.Linear, the head
    included; GPTQ/AWQ/FP8 checkpoints keep it 16-bit, the default); 0 for 16-bit weights and a
    tied table (the embedding lookup needs it in 16-bit)."""
    if not setup.quantize_head or setup.dtype in ("fp32", "bf16", "fp16") or m.tie_word_embeddings or m.encoder:
        return 0
    return m.vocab_size * m.hidden_size


def dequantize_seconds(m: ModelSpec, setup: ServeSetup, gpu: GpuSpec) -> float:
    """One decode step's weight-only dequantization on the CUDA cores (DEQUANT_OPS_PER_WEIGHT),
    split over the TP group; 0 for 16-bit and FP8 weights and for a GPU without an FP32 figure."""
    ops = DEQUANT_OPS_PER_WEIGHT.get(setup.dtype)
    if not ops or not gpu.fp32_flops:
        return 0.0
    weights = m.block_params
    if m.is_moe:  # only the experts the batch routes to are read (and dequantized)
        touched = expected_experts_touched(m.num_experts, m.experts_per_token, setup.batch) / m.num_experts
        weights -= m.moe_layers * m.expert_params_per_layer() * (1 - touched)
    head = quantized_head_params(m, setup)
    tp = setup.tensor_parallel
    head_share = 1.0 if not setup.tp_shards_head else 1 / tp  # a replicated head is dequantized on every rank
    return ops * (weights / tp + head * head_share) / gpu.fp32_flops


def fp8_activation_quant_seconds(m: ModelSpec, setup: ServeSetup, gpu: GpuSpec, tokens: int,
                                 bandwidth_bytes_per_second: float) -> float:
    """One forward's dynamic FP8 activation quantization over `tokens` tokens on one rank: per GEMM
    input, two kernels, each the longer of its launch floor and its bytes at
    `bandwidth_bytes_per_second` (the reduction reads the 16-bit activation, the cast reads it
    again and writes one byte an element). A MoE layer's experts count as one MLP. 0 unless the
    weights are FP8 with dynamic scales."""
    if setup.dtype != "fp8" or setup.fp8_activations != "dynamic" or tokens <= 0:
        return 0.0
    tp = setup.tensor_parallel
    inter = m.moe_intermediate_size if m.is_moe and m.moe_intermediate_size else m.intermediate_size
    widths = [m.hidden_size, m.q_size / tp, m.hidden_size, inter / tp] * m.num_layers
    if quantized_head_params(m, setup):
        widths.append(m.hidden_size)
    seconds = 0.0
    for width in widths:
        reduce_bytes, cast_bytes = 2.0 * tokens * width, 3.0 * tokens * width
        seconds += (max(KERNEL_FLOOR_SECONDS, reduce_bytes / bandwidth_bytes_per_second)
                    + max(KERNEL_FLOOR_SECONDS, cast_bytes / bandwidth_bytes_per_second))
    return seconds
