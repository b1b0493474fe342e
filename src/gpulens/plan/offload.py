"""Optimizer offload (`--offload optimizer`): ZeRO-Offload (Ren et al. 2021, "ZeRO-Offload:
Democratizing Billion-Scale Model Training", section 4), DeepSpeed's
`zero_optimization.offload_optimizer: {device: cpu}`.

Memory: the GPU keeps DeepSpeed's 16-bit weights and gradients as its ZeRO stage shards them; the
fp32 master weights and both Adam moments (12 bytes per parameter of the GPU's partition) move to
CPU memory, with the fp32 gradient partition DeepSpeed upcasts the 16-bit gradients into there
(4 bytes more): 16 bytes per partition parameter on the host, the `16` of DeepSpeed's
`estimate_zero2_model_states_mem_needs` (cpu_mem = params x max(4 x GPUs, 16) x 1.5; the 4 x GPUs
term is each process's fp32 copy while the engine starts, the 1.5 a buffer factor: not counted).
The GPU keeps the 16-bit gradients as the stage shards them (DeepSpeed streams them out through
its reduce buckets, so this is an upper bound at stage 2).

Step time, once per optimizer step, on top of the micro-batches and not overlapped:
- PCIe: the 16-bit gradient partition GPU -> CPU and the updated 16-bit weights CPU -> GPU, over
  the GPU's host link at its nominal rate (an upper bound: pinned copies reach ~80 % of it);
  DeepSpeed overlaps the gradient copy with the backward (`overlap_comm`): not modelled;
- CPU Adam: the host updates the partitions of all the node's GPUs at DeepSpeedCPUAdam's
  throughput, ZeRO-Offload's Table 3: 10 billion parameters in 2.57 s on a DGX-2 host (2 x 24-core
  Xeon Platinum 8168), 3.9e9 parameters per second per node; other CPUs are priced the same.
  The update overlaps nothing: the paper's one-step delayed parameter update (DPU, section 4.2)
  is not modelled.
Only with --zero 1, 2 or 3 (DeepSpeed: offload_optimizer is valid for ZeRO stages 1-3), the
`deepspeed` layout under amp_bf16/amp_fp16 and AdamW (DeepSpeedCPUAdam).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gpulens.errors import BadInputError
from gpulens.plan.catalog import GpuSpec
from gpulens.plan.links import PCIE_FALLBACK_BYTES_PER_SECOND

OFFLOADS = ("none", "optimizer")
CPU_BYTES_PER_PARAM = 4 + 4 + 4 + 4  # fp32 master, Adam m and v (ZeRO-Offload section 4.1), fp32 gradient partition
PCIE_BYTES_PER_PARAM = 2 + 2  # 16-bit gradients to the host, 16-bit updated weights back
# ZeRO-Offload (Ren et al. 2021) Table 3, CPU-Adam row: 10B parameters in 2.57 s on the DGX-2's host CPUs
CPU_ADAM_PARAMS_PER_SECOND = 10e9 / 2.57

# The host link of GPUs whose catalog interconnect is NVLink (SXM and NVL boards): PCIe x16 of the
# generation the vendor's datasheet names, as the catalog counts it (bidirectional GB/s, half each
# way): Gen3 32, Gen4 64, Gen5 128 (PCI-SIG: 8, 16, 32 GT/s per lane). V100 SXM2: Gen3; A100/A800
# SXM4: "PCIe Gen4: 64 GB/s"; H100/H800/H200 SXM and NVL: "PCIe Gen5: 128 GB/s"; MI300X: "PCIe Gen 5
# x16, 128 GB/s" (NVIDIA and AMD datasheets).
HOST_PCIE_BY_ARCHITECTURE = {"volta": ("PCIe Gen3 x16", 32e9), "ampere": ("PCIe Gen4 x16", 64e9),
                             "hopper": ("PCIe Gen5 x16", 128e9), "cdna3": ("PCIe Gen5 x16", 128e9)}


def host_link(gpu: GpuSpec) -> tuple[str, float]:
    """(name, bytes per second one way) of the GPU's link to its host."""
    if gpu.interconnect_bytes_per_second and "pcie" in gpu.interconnect.lower():
        return f"{gpu.interconnect} (one direction)", gpu.interconnect_bytes_per_second / 2
    if gpu.architecture in HOST_PCIE_BY_ARCHITECTURE:
        name, both = HOST_PCIE_BY_ARCHITECTURE[gpu.architecture]
        return f"{name} (one direction)", both / 2
    return "PCIe (no published host-link figure: Gen3 x16 assumed)", PCIE_FALLBACK_BYTES_PER_SECOND


def check_offload(offload: str, *, zero_stage: int, layout: str, precision: str, optimizer: str, lora: bool,
                  megatron: bool) -> None:
    """One sentence (exit 2) for each --offload that is not meaningful."""
    if offload not in OFFLOADS:
        raise BadInputError(f"Unknown offload {offload!r}.", hint="Use --offload none or --offload optimizer.")
    if offload == "none":
        return
    if lora or megatron:
        raise BadInputError("--offload optimizer is planned for full fine-tuning with data parallelism (ZeRO-Offload).",
                            hint="Drop --offload, or drop --finetune/--tp/--pp/--cp.")
    if zero_stage < 1:
        raise BadInputError("--offload optimizer is a ZeRO option (DeepSpeed's offload_optimizer, stages 1-3), and "
                            "--zero is 0.", hint="Add --zero 2 (ZeRO-Offload's stage) with --zero-layout deepspeed.")
    if layout != "deepspeed":
        raise BadInputError(f"--offload optimizer is DeepSpeed's ZeRO-Offload; under --zero-layout {layout} PyTorch "
                            "FSDP's CPUOffload moves the parameters too, which is not modelled.",
                            hint="Add --zero-layout deepspeed.")
    if precision not in ("amp_bf16", "amp_fp16"):
        raise BadInputError(f"--offload optimizer moves the fp32 master weights of mixed precision, and --precision "
                            f"{precision} has none.", hint="Use --precision amp_bf16 or amp_fp16.")
    if optimizer != "adamw":
        raise BadInputError(f"--offload optimizer prices DeepSpeedCPUAdam, not --optimizer {optimizer}.",
                            hint="Use --optimizer adamw.")


@dataclass(frozen=True)
class OffloadTime:
    pcie_seconds: float  # gradients out + weights back, one optimizer step
    cpu_adam_seconds: float  # the host's Adam over the node's partitions
    pcie_bytes_per_gpu: float
    host_link: str
    host_link_bytes_per_second: float
    node_params: float  # parameters the node's CPUs update each step

    @property
    def seconds(self) -> float:
        return self.pcie_seconds + self.cpu_adam_seconds

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"seconds": self.seconds, "cpu_adam_params_per_second": CPU_ADAM_PARAMS_PER_SECOND}


def offload_time(partition_params: float, gpus_on_node: int, gpu: GpuSpec) -> OffloadTime:
    name, rate = host_link(gpu)
    pcie = PCIE_BYTES_PER_PARAM * partition_params
    node = partition_params * gpus_on_node
    return OffloadTime(pcie / rate, node / CPU_ADAM_PARAMS_PER_SECOND, pcie, name, rate, node)


def cpu_bytes(partition_params: float, gpus_on_node: int) -> tuple[float, float]:
    """(per GPU, per node) host memory the offloaded optimizer holds."""
    per_gpu = CPU_BYTES_PER_PARAM * partition_params
    return per_gpu, per_gpu * gpus_on_node


def offload_memory(partition_params: float, gpus_on_node: int, gpu_bytes_moved: float) -> tuple[dict[str, Any], str]:
    """(the figures the plan shows, a note) for the optimizer's host memory."""
    per_gpu, per_node = cpu_bytes(partition_params, gpus_on_node)
    figures = {"cpu_bytes_per_gpu": int(per_gpu), "cpu_bytes_per_node": int(per_node),
               "gpu_bytes_moved_off": int(gpu_bytes_moved), "partition_params": partition_params,
               "gpus_per_node": gpus_on_node, "cpu_bytes_per_param": CPU_BYTES_PER_PARAM}
    note = (f"ZeRO-Offload: fp32 master weights, Adam moments and the fp32 gradient partition ({CPU_BYTES_PER_PARAM} "
            f"bytes per partition parameter) in CPU memory: {per_gpu / 2**30:.1f} GiB per GPU, "
            f"{per_node / 2**30:.1f} GiB per node of {gpus_on_node} GPU(s)")
    return figures, note
