"""What hiding a collective behind compute costs the compute.

The planner hides data-parallel collectives (ZeRO-3 / FSDP's per-block gathers and reduce-scatters,
the gradient all-reduce of ZeRO 0-2, ring attention's K/V sends) behind the compute they run beside.
That overlap is not free: NCCL's kernels run on the same GPU, and the compute kernels beside them
slow down while they run.

- Hopper and later: PyTorch issue #143988 (lw, 2024-12-30), FSDP on H100: "the matmuls take 2x as
  long to complete when they are overlapped with a NCCL kernel". cuBLAS's matmuls there are
  persistent kernels that launch one block per SM; with NCCL holding ~10 % of the SMs, they no
  longer fit in one wave and run as two ("wave quantization"; CUTLASS issue #2471: "Statically-
  scheduled persistent kernels will run 2x slower when wave quantization occurs"). PyTorch 2.7
  added `torch._C._set_sm_carveout_experimental` for it (PR #147966); runs that set a carveout
  lose ~10 %, which this does not price.
- Ampere and the rest: NVIDIA/nccl issue #1428, GPT training on A100-SXM4-80GB profiled with Nsight:
  a GEMM 2.08 ms overlapped with an AllGather against 1.18 ms alone (1.76x), attention 0.33 against
  0.18 ms; NCCL's maintainer: "they're competing for memory bandwidth", since NCCL's traffic costs
  two to three times its network bytes in HBM traffic. Contention for HBM is not peculiar to the
  A100, so GPUs without a measurement of their own take its 1.76x.

During a hidden collective of T seconds the compute beside it runs at 1/s of its speed, so it gets
T/s of its work done and the rest moves later: the step grows by T (1 - 1/s), about half of T on an
H100. NCCL's own time is taken as unchanged.
"""

from __future__ import annotations

from gpulens.plan.catalog import GpuSpec

# compute time beside a running NCCL kernel / alone, by GPU architecture (module docstring)
OVERLAP_COMPUTE_SLOWDOWN = {"hopper": 2.0, "blackwell": 2.0}
DEFAULT_OVERLAP_COMPUTE_SLOWDOWN = 2.08 / 1.18  # NCCL issue #1428: a GEMM beside an AllGather on an A100


def overlap_compute_slowdown(gpu: GpuSpec) -> float:
    return OVERLAP_COMPUTE_SLOWDOWN.get(gpu.architecture.lower(), DEFAULT_OVERLAP_COMPUTE_SLOWDOWN)


def hidden_collective_cost_seconds(hidden_seconds: float, gpu: GpuSpec) -> float:
    """What `hidden_seconds` of collectives running beside compute add to the step: T (1 - 1/s)."""
    return max(0.0, hidden_seconds) * (1.0 - 1.0 / overlap_compute_slowdown(gpu))
