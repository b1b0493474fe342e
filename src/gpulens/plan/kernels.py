"""Measured kernel speeds the training model prices its FLOPs at: how fast the attention kernels
run (by kernel, GPU chip, head dimension and sequence length), and the highest 16-bit matmul
throughput each GPU reaches (its ceiling, not a datasheet peak).

Attention. FLOPs alone do not say how long attention takes: a fused (flash) kernel reaches a
different share of the peak than a GEMM does, and that share depends on the kernel and the GPU
generation. FlashAttention-2's own benchmark (Dao 2023, "FlashAttention-2: Faster Attention with
Better Parallelism and Work Partitioning"; the same charts are in Dao-AILab/flash-attention,
assets/flash2_a100_fwd_bwd_benchmark.png and assets/flash2_h100_fwd_bwd_benchmark.png, added in
commit 4f285b35, 2023-07-17) measured forward + backward TFLOP/s of FlashAttention (v1, CUDA),
OpenAI Triton's own fused attention (`triton.ops.flash_attention`) and FlashAttention-2 on an A100
80GB SXM4, and of v1 and v2 on an H100 80GB SXM5, for
sequence lengths 512 to 16k at 16k tokens per batch, hidden size 2048, head dimensions 64 and 128,
16-bit. The tables below are the causal-mask panels (a decoder's training), as printed on the
bars. On the H100 the same kernels reach a far smaller share of the peak than on the A100: written
for Ampere, they issue its synchronous mma.sync instructions and use neither Hopper's wgmma nor its
TMA (Shah et al. 2024, "FlashAttention-3": FlashAttention-2 reaches 35 % of the H100's peak; the
FlashAttention-2 paper: 50-73 % of the A100's).

The benchmark counts FLOPs as flash-attention's benchmarks/benchmark_flash_attention.py does:
forward 4 x seqlen^2 x heads x head_dim per sequence, halved under the causal mask (the kernel
skips the masked blocks), backward 2.5 x the forward (it recomputes QK^T), so forward + backward =
3.5 x. Per token and layer that is 14 x H x Q x S / 2 FLOPs run at the measured rate, where the
PaLM count the planner reports (12 L H Q S, no mask) assumes 12 x H x Q x S.

Hopper-native kernels (`flash3`, `cudnn`): FlashAttention-3 (Shah et al. 2024, arXiv 2407.08608v2,
section 4.1, Figures 5 and 6) measured FlashAttention-2 (2.5.8), cuDNN 9.1.1.17's fused attention
(what Transformer Engine's FusedAttention backend runs) and FlashAttention-3 on an H100 80GB SXM5
at a fixed 1830 MHz (the 989 TFLOP/s peak), FP16, with the same lengths, 16k tokens per batch,
hidden 2048 and FLOP count as the FlashAttention-2 benchmark. The bar values are printed on the
figures and are in the PDF's text layer; the forward chart is also assets/flash3_fp16_fwd.png in
Dao-AILab/flash-attention (commit 7ef24848, 2024-07-11). Forward is measured with and without the
causal mask (head_dim 64, 128, 256), backward only without it (64, 128). The causal forward +
backward rate is therefore DERIVED, not measured: the causal backward runs at the measured
non-causal backward rate times the forward's causal / non-causal ratio at the same head_dim and
length (the mask costs the backward what it costs the forward: idle diagonal and skipped tiles),
and forward + backward combine by time, 3.5 / (1 / fwd + 2.5 / bwd). Applied to the paper's own
FlashAttention-2 bars this reproduces FlashAttention-2's separately measured causal fwd + bwd on
the H100 (the table below) within 0-3 % at head_dim 64 and 3-11 % below at 128; without the ratio
(the non-causal backward rate as is) it is 3-37 % too fast at short lengths.

Matmul ceiling: Stas Bekman, "Machine Learning Engineering" (github.com/stas00/ml-engineering),
compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table" (BF16, mean of
100 iterations of the best shape found by mamf-finder.py): A100 SXM 271.2 of 312 TFLOP/s (86.9 %),
A100 PCIe 252.9 (81.1 %), H100 SXM 794.5 of 989 (80.3 %, "H200 is the same"), GH200 828.6 (83.8 %),
B200 1745 of 2250 (77.6 %), MI300X 668.4 of 1300 (51.4 %). The bundled H200 recording measured
781 TFLOP/s on an 8192^3 bf16 matmul (79 %), within 2 % of the H100 SXM row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpulens.errors import BadInputError
from gpulens.plan.catalog import GpuSpec, UnsupportedPrecisionError

# The chips the benchmarks ran on, and the catalog GPUs that carry the same chip (same SMs and
# tensor cores; their clocks and power limits scale the peak the share is taken of).
_CHIP_OF = {"A100-40GB": "ga100", "A100-80GB": "ga100", "A100-80GB-PCIe": "ga100",
            "H100-SXM": "gh100", "H100-PCIe": "gh100", "H100-NVL": "gh100", "H200": "gh100", "H200-NVL": "gh100"}
_CHIP_PEAK_TFLOPS = {"ga100": 312.0, "gh100": 989.5}  # the benchmarked cards' dense 16-bit peaks
_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
# (kernel, chip) -> {head_dim: TFLOP/s at each of _SEQS}, causal mask, forward + backward.
_CAUSAL_TFLOPS: dict[tuple[str, str], dict[int, tuple[float, ...]]] = {
    ("flash2", "ga100"): {64: (88, 119, 140, 156, 165, 171), 128: (99, 133, 155, 173, 182, 189)},
    ("flash1", "ga100"): {64: (58, 70, 77, 87, 92, 97), 128: (55, 62, 69, 76, 80, 83)},
    ("flash2", "gh100"): {64: (141, 192, 232, 257, 273, 284), 128: (163, 221, 265, 294, 308, 328)},
    ("flash1", "gh100"): {64: (104, 123, 136, 138, 149, 156), 128: (98, 109, 108, 126, 135, 137)},
}
# FlashAttention-3 paper (module docstring), H100 80GB SXM5, FP16, TFLOP/s at _SEQS, as printed on
# the bars: Figure 5 (b)/(d) forward with the causal mask, (a)/(c) without it; Figure 6 (a)/(b)
# backward without it. Head_dim 256 has forward bars only (flash3 causal 286 427 537 612 628 642,
# cudnn 308 391 450 483 497 509): the FA3 release the paper timed ran the backward at 64 and 128
# only (hopper/flash_api.cpp at 7ef24848: "Only support head size 64 and 128 for now"), so above
# 128 the rate is held at 128's, as for the other kernels.
_FA3_PAPER_FWD_CAUSAL = {
    "flash3": {64: (197, 265, 371, 420, 460, 473), 128: (292, 423, 521, 579, 602, 616)},
    "cudnn": {64: (225, 288, 334, 363, 379, 388), 128: (315, 410, 484, 518, 529, 539)},
}
_FA3_PAPER_FWD = {
    "flash3": {64: (333, 392, 460, 476, 496, 497), 128: (467, 565, 625, 638, 646, 648)},
    "cudnn": {64: (335, 373, 395, 408, 412, 413), 128: (497, 574, 617, 609, 600, 595)},
}
_FA3_PAPER_BWD = {
    "flash3": {64: (272, 363, 422, 453, 472, 474), 128: (316, 424, 501, 542, 559, 561)},
    "cudnn": {64: (266, 348, 395, 417, 432, 433), 128: (305, 408, 465, 499, 518, 516)},
}


def causal_fwd_bwd_tflops(fwd_causal: float, fwd: float, bwd: float) -> float:
    """Causal forward + backward TFLOP/s from a causal forward, a non-causal forward and a non-causal
    backward rate (a DERIVATION, module docstring): the causal backward at bwd x fwd_causal / fwd,
    the two combined by time under the benchmark's count (backward = 2.5 x forward FLOPs)."""
    return 3.5 / (1.0 / fwd_causal + 2.5 / (bwd * fwd_causal / fwd))


for _k in ("flash3", "cudnn"):
    _CAUSAL_TFLOPS[(_k, "gh100")] = {
        hd: tuple(causal_fwd_bwd_tflops(fc, f, b) for fc, f, b in
                  zip(_FA3_PAPER_FWD_CAUSAL[_k][hd], _FA3_PAPER_FWD[_k][hd], _FA3_PAPER_BWD[_k][hd], strict=True))
        for hd in (64, 128)}
# The kernels that exist for Hopper only, or were measured on it only: no rate elsewhere, and
# asking for them on another GPU is refused (check_attention_kernel_gpu).
HOPPER_KERNELS = ("flash3", "cudnn")
# FlashAttention's Triton port (flash_attn/flash_attn_triton.py, the copy llm-foundry ships as
# llmfoundry/models/layers/flash_attn_triton.py, run on the pre-MLIR triton==2.0.0.dev20221202 it
# was written for: llm-foundry's setup.py pins it at 300cc5c and its sm90 fork `triton-pre-mlir` at
# b2a43a1) was not what the paper's "Triton" bars measured: benchmarks/benchmark_causal.py at
# 4f285b35, the script that timed those charts (same lengths, dim 2048, head_dim 64/128), labels
# "Triton" OpenAI Triton's `triton.ops.flash_attention` (A100 bars, causal, hd 64: 59 75 79 76 79 80;
# hd 128: 50 61 68 74 78 80 TFLOP/s). The port's own docstring is the one statement of its speed:
# "Triton forward + backward is slightly slower than CUDA forward + backward" (v1), so it is priced
# at v1's measured rate on both chips (an upper bound by that much) at head_dim 64. Its head-dim
# scaling is not v1's: v1's CUDA kernels lose 14 % going from 64 to 128 at 16k tokens (97 -> 83),
# while the Triton kernel the port grew from ("We use the FlashAttention implementation from Phil
# Tillet a starting point", the tutorial's 06-fused-attention.py, which triton.ops.flash_attention
# is) keeps its speed (80 -> 80), and the port made "the backward for d=128 much faster by reducing
# register spilling" (its docstring). So above 64 the port runs at v1's hd-64 rate times the
# Triton kernel's own hd/64 ratio at that length (the A100 bars; the same ratio on the H100, which
# has no Triton bar).
_SAME_AS = {("triton", "ga100"): ("flash1", "ga100"), ("triton", "gh100"): ("flash1", "gh100")}
_TRITON_TUTORIAL_A100 = {64: (59, 75, 79, 76, 79, 80), 128: (50, 61, 68, 74, 78, 80)}

# Each kernel runs a head dimension on tiles compiled for a fixed width, the smallest that holds it;
# the extra columns are loaded as zeros and multiplied all the same, so a head_dim of 112 costs what
# 128 does. flash1: flash-attn v1.0.9 (6d48e14a) csrc/flash_attn/fmha_api.cpp run_fmha_fwd /
# run_fmha_bwd (d <= 32, 64, 128); flash2: v2.0.0 (4f285b35, the benchmark's commit)
# csrc/flash_attn/src/static_switch.h FWD_HEADDIM_SWITCH (later releases keep 32 ... 128, 192,
# 256); triton: flash_attn_triton.py's `BLOCK_HEADDIM = max(triton.next_power_of_2(d), 16)` (the
# copy llm-foundry v0.3.0 ships, docs/plan-llm-foundry-sources.md); flash3: hopper/flash_api.cpp
# round_up_headdim (64, 96, 128, 192, 256; hopper/generate_kernels.py HEAD_DIMENSIONS since 7a802796,
# at 0251105a), a head_dim below 64 running on the 64 tile; cudnn: closed source, no tile known, so
# the head_dim itself (Transformer Engine sends it only head dims that are multiples of 8, <= 256 on
# Hopper: cuDNN frontend docs, operations/Attention, support matrix).
_HEAD_DIM_TILES = {"flash1": (32, 64, 128), "flash2": (32, 64, 96, 128, 160, 192, 224, 256),
                   "flash3": (64, 96, 128, 192, 256)}


def kernel_head_dim(kernel: str, head_dim: int) -> int:
    """The head dimension `kernel` computes with: its smallest compiled tile that holds `head_dim`
    (the head_dim itself for a kernel without tiles, or one wider than its largest)."""
    if kernel == "triton":
        return max(1 << max(head_dim - 1, 0).bit_length(), 16)
    tiles = _HEAD_DIM_TILES.get(kernel, ())
    return next((t for t in tiles if head_dim <= t), head_dim)


# `--attention-kernel`: which attention kernel the training runs.
ATTENTION_KERNELS = {
    "auto": "what PyTorch's scaled_dot_product_attention picks: its flash backend (FlashAttention-2, "
            "PyTorch >= 2.2) for 16-bit with head_dim <= 256, else the memory-efficient or math kernel",
    "flash2": "FlashAttention-2 (flash-attn 2.x, or SDPA's flash backend)",
    "flash3": "FlashAttention-3 (flash-attn's hopper/ build, flash_attn_interface; H100/H200 only)",
    "cudnn": "cuDNN's fused flash attention (Transformer Engine's FusedAttention backend, as Megatron-Core "
             "and NeMo run it; H100/H200 only)",
    "flash1": "FlashAttention v1 (flash-attn 1.x, CUDA)",
    "triton": "the Triton port of FlashAttention (flash_attn_triton.py; llm-foundry's attn_impl: triton)",
    "eager": "unfused attention: two batched matmuls with the S x S scores, softmax and dropout written to memory "
             "(transformers' eager attention; Megatron-LM's CoreAttention before FlashAttention)",
}

# Measured 16-bit matmul ceiling / dense peak (module docstring), by catalog GPU.
MATMUL_CEILING: dict[str, float] = {
    "A100-40GB": 271.2 / 312, "A100-80GB": 271.2 / 312, "A100-80GB-PCIe": 252.9 / 312,
    "H100-SXM": 794.5 / 989, "H200": 794.5 / 989, "B200": 1745.0 / 2250, "MI300X": 668.4 / 1300,
}


def check_attention_kernel(name: str) -> str:
    key = name.lower()
    if key not in ATTENTION_KERNELS:
        raise BadInputError(f"Unknown attention kernel {name!r}.", hint=f"Use one of {', '.join(ATTENTION_KERNELS)}.")
    return key


class UnsupportedKernelError(UnsupportedPrecisionError):
    """The GPU does not run (or was never measured running) the attention kernel asked for: like a
    card without the number format, `gpulens plan compare` leaves it out with this reason."""


def check_attention_kernel_gpu(kernel: str, gpu: GpuSpec, activation_precision: str) -> None:
    """Refuse a Hopper kernel on a GPU it was not measured on, or in fp32 (one sentence, exit 2):
    FlashAttention-3's README (Dao-AILab/flash-attention at 7ef24848) requires an H100 / H800, the
    paper's cuDNN bars are H100 bars, and both kernels take 16-bit (or FP8) inputs only."""
    if kernel not in HOPPER_KERNELS:
        return
    name = ATTENTION_KERNELS[kernel].split(" (")[0]
    if activation_precision == "fp32":
        raise BadInputError(f"--attention-kernel {kernel} ({name}) runs in 16-bit only, not under --precision fp32.",
                            hint="Use --precision amp_bf16 (or bf16) with it, or leave --attention-kernel auto.")
    if _CHIP_OF.get(gpu.name) != "gh100":
        raise UnsupportedKernelError(f"--attention-kernel {kernel} ({name}) is measured on Hopper (H100, H200) only, "
                                     f"not on the {gpu.name}.",
                                     hint="Use --attention-kernel flash2 (or auto) on this GPU, or pick an H100 or H200.")


@dataclass(frozen=True)
class AttentionRate:
    """What one attention kernel does on one GPU: FLOPs/s it sustains (forward + backward, causal)
    and where the figure comes from."""

    kernel: str
    flops_per_second: float
    source: str


def _interp(xs: tuple[float, ...], ys: tuple[float, ...], x: float) -> float:
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = next(i for i in range(1, len(xs)) if x <= xs[i])
    return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - xs[i - 1]) / (xs[i] - xs[i - 1])


def attention_rate(kernel: str, gpu: GpuSpec, head_dim: int, seq: int, peak_flops: float) -> AttentionRate | None:
    """The measured forward + backward rate of `kernel` (flash3, cudnn, flash2, flash1, triton) on `gpu` at this
    head dimension and sequence length, as the share of the benchmarked card's peak times
    `peak_flops` (the GPU's own 16-bit peak); None where no benchmark covers the GPU's chip.
    Between the measured points it interpolates (log2 of the length, linear in head_dim); beyond
    16k tokens it keeps the 16k figure (the kernels have plateaued there), below 512 the 512 one."""
    chip = _CHIP_OF.get(gpu.name)
    if chip is None:
        return None
    key = _SAME_AS.get((kernel, chip), (kernel, chip))
    table = _CAUSAL_TFLOPS.get(key)
    if table is None:
        return None
    x = math.log2(max(seq, 1))
    xs = tuple(math.log2(s) for s in _SEQS)
    lo, hi = _interp(xs, table[64], x), _interp(xs, table[128], x)
    tflops = _interp((64.0, 128.0), (lo, hi), float(head_dim))
    if kernel == "triton" and head_dim > 64:  # v1 at 64, scaled with head_dim as the Triton kernel scales
        t64, t128 = _interp(xs, _TRITON_TUTORIAL_A100[64], x), _interp(xs, _TRITON_TUTORIAL_A100[128], x)
        tflops = lo * _interp((64.0, 128.0), (t64, t128), float(head_dim)) / t64
    share = tflops / _CHIP_PEAK_TFLOPS[chip]
    bench = "A100 80GB SXM4" if chip == "ga100" else "H100 80GB SXM5"
    paper = ("FlashAttention-3 paper, figs. 5-6: causal forward measured, causal backward derived from the "
             "non-causal one" if kernel in HOPPER_KERNELS else
             "FlashAttention-2 paper, fig. 'Attention forward + backward speed'")
    return AttentionRate(kernel, share * peak_flops,
                         f"{ATTENTION_KERNELS[key[0]].split(' (')[0]} forward+backward on the {bench}, causal: "
                         f"{tflops:.0f} TFLOP/s = {share:.0%} of its peak ({paper})")


def attention_flops_run(num_layers: int, num_heads: int, head_dim: int, seq: int, *, recompute: bool) -> float:
    """FLOPs per token the flash kernels run (benchmark_flash_attention.py's count): forward
    4 H Q S / 2 under the causal mask, backward 2.5 x that; recomputation runs the forward again."""
    fwd = 4 * num_layers * num_heads * head_dim * seq / 2
    return fwd * (3.5 + (1.0 if recompute else 0.0))
