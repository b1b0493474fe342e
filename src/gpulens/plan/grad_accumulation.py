"""Weight-gradient accumulation across micro-batches: the memory traffic of adding each
micro-batch's weight gradients into the step's accumulated gradient, priced by speed.training_speed
at the GPU's bandwidth x the memory efficiency of its other elementwise work. Only what the
frameworks do:

- PyTorch autograd (a single GPU, DDP under `no_sync`, transformers' Trainer / Accelerate with
  `gradient_accumulation_steps`; `--zero 0` with the module's own parameters holding the gradients):
  AccumulateGrad steals the first micro-batch's gradient as `.grad` (no copy; `zero_grad()` sets
  `.grad` to None by default since PyTorch 2.0), then for every later micro-batch runs
  `variable_grad += new_grad` in place (pytorch/pytorch torch/csrc/autograd/functions/
  accumulate_grad.h, `accumulateGrad`): read both, write one, 3 x the gradient's bytes per parameter,
  in the parameters' dtype (fp32 under autocast), m - 1 times a step.
- PyTorch FSDP FULL_SHARD (`--zero 3` with the `fsdp` / `fsdp-bf16` layouts): every micro-batch
  reduce-scatters its gradients (priced in speed.zero3_exposed_seconds) and adds the new shard into
  the saved one, `flat_param._saved_grad_shard += sharded_grad` after casting it to the shard's dtype
  (torch/distributed/fsdp/_runtime_utils.py, `_accumulate_sharded_grad`): 3 x the shard's bytes per
  parameter on 1/d of them, m - 1 times a step.
- Megatron-LM (`--tp`/`--pp`/`--cp`, where the planner keeps fp32 gradients as Megatron's
  `main_grad` buffer): the buffer is zeroed at the start of each step and every micro-batch's
  backward adds into it. With fp32 accumulation (forced for bf16) `--gradient-accumulation-fusion` is
  on by default (NVIDIA/Megatron-LM megatron/arguments.py at d898a899, Korthikanti et al. 2022: the
  `--no-gradient-accumulation-fusion` opt-out, switched off only without fp32 accumulation), and the
  weight-gradient GEMM accumulates into `main_grad` in its epilogue
  (`fused_dense_cuda.wgrad_gemm_accum_fp32` in megatron/mpu/layers.py): a read and a write of the
  fp32 buffer where a plain GEMM writes a 16-bit gradient, 4 + 4 - 2 = 6 more bytes per parameter of
  the GPU's stage, every micro-batch, inside each stage's slot of the pipeline. Those bytes move in
  the GEMM's epilogue, at the datasheet bandwidth (contiguous tiles), and what that adds depends on
  the GEMM: Ampere's (and earlier) cuBLAS / CUTLASS 2.x kernels run a tile's epilogue after its
  mainloop ("The epilogue is a separate phase", NVIDIA/cutlass media/docs/cpp/efficient_gemm.md at
  7107b055), so the bytes add their time; Hopper's and Blackwell's warp-specialized persistent
  kernels let "epilogue of one consumer warp group ... be overlapped with the math operations of the
  other" (the same page, "Warp-Specialized Persistent Ping-Pong"), so they cost
  only what they add to the GEMM's roofline, max(FLOPs / peak, bytes / bandwidth), which at a few
  thousand tokens a micro-batch (2 x tokens FLOPs per parameter) is nothing. (The 2021 sc21 code, Narayanan et al. 2021, ran fp16 without that buffer: PyTorch's
  AccumulateGrad in fp16, 6 bytes m - 1 times; the planner's Megatron gradients are fp32, as its
  data-parallel all-reduce prices them, so those rows are priced as the 2022 code runs.)

Not priced: DeepSpeed's own engines (`--zero-layout deepspeed`, ZeRO 1-2), whose gradient hooks
differ per stage and version; LoRA's adapters (a few million parameters); FSDP's NO_SHARD and
SHARD_GRAD_OP layouts, which the planner does not model.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulens.plan import expert_parallel as ep_mod
from gpulens.plan.memory import TrainSetup, _mode, megatron_stage_params
from gpulens.plan.models import ModelSpec

# GPU architectures whose GEMMs overlap one tile's epilogue with another's math (module docstring)
EPILOGUE_OVERLAPPING_ARCHITECTURES = ("hopper", "blackwell")
# the wgrad GEMM's epilogue reads the fp32 main_grad (4) and writes it back in fp32 (4) where a plain
# GEMM writes its 16-bit gradient (2, inside the matmul time the planner already prices)
MEGATRON_FUSED_FP32_BYTES = 4 + 4 - 2


@dataclass(frozen=True)
class GradAccumulation:
    bytes_per_accumulation: float  # on one GPU
    accumulations_per_step: int
    every_micro_batch: bool  # Megatron: inside every micro-batch's slot (the bubble's too)
    mechanism: str
    epilogue_gemm_flops: float = 0.0  # Megatron: the wgrad GEMMs whose epilogue does it (0: a kernel of its own)
    epilogue_base_bytes: float = 0.0  # what those GEMMs write without it (their 16-bit gradients)

    def seconds(self, *, elementwise_bytes_per_second: float, peak_bytes_per_second: float,
                matmul_flops_per_second: float, architecture: str) -> float:
        """One accumulation: its own kernel at the elementwise bandwidth, or the fused bytes at the
        datasheet bandwidth after the mainloop, or, on an architecture whose GEMMs overlap the
        epilogue, what they add to the GEMM's roofline (module docstring)."""
        if not self.epilogue_gemm_flops:
            return self.bytes_per_accumulation / elementwise_bytes_per_second
        if architecture not in EPILOGUE_OVERLAPPING_ARCHITECTURES:
            return self.bytes_per_accumulation / peak_bytes_per_second
        compute = self.epilogue_gemm_flops / matmul_flops_per_second
        with_it = (self.epilogue_base_bytes + self.bytes_per_accumulation) / peak_bytes_per_second
        return max(0.0, with_it - compute) - max(0.0, self.epilogue_base_bytes / peak_bytes_per_second - compute)


def grad_accumulation(m: ModelSpec, setup: TrainSetup) -> GradAccumulation | None:
    """What one GPU moves to accumulate gradients over a step's micro-batches; None where nothing
    is accumulated or the framework's path is not priced (module docstring)."""
    if setup.lora is not None:
        return None
    if setup.megatron:
        params = megatron_stage_params(m, setup)
        tokens = setup.micro_batch * setup.seq_len / setup.context_parallel  # the wgrad GEMM's inner dimension
        return GradAccumulation(MEGATRON_FUSED_FP32_BYTES * params, setup.grad_accum, True,
                                "Megatron-LM: fp32 main_grad accumulated in the wgrad GEMM's epilogue, every micro-batch",
                                epilogue_gemm_flops=2 * tokens * params, epilogue_base_bytes=2 * params)
    if setup.grad_accum <= 1:
        return None
    weight = _mode(setup.precision).weight
    if setup.zero_stage == 0 and setup.zero_layout == "fsdp" and setup.offload == "none":
        params = (ep_mod.partition_params(m, ep=setup.expert_parallel, data_parallel=setup.num_gpus, zero_stage=0)
                  if setup.expert_parallel > 1 else m.params)
        return GradAccumulation(3 * weight * params, setup.grad_accum - 1, False,
                                "PyTorch AccumulateGrad: .grad += new, micro-batches 2..m")
    if setup.zero_stage >= 3 and setup.zero_layout in ("fsdp", "fsdp-bf16") and setup.data_parallel > 1 \
            and setup.expert_parallel == 1 and setup.offload == "none":
        shard = 4 if setup.zero_layout == "fsdp-bf16" else weight  # fp32 shards under FSDP MixedPrecision
        return GradAccumulation(3 * shard * m.params / setup.data_parallel, setup.grad_accum - 1, False,
                                "PyTorch FSDP: _saved_grad_shard += sharded_grad, micro-batches 2..m")
    return None
