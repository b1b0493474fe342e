"""GPU metric names: the one table that maps a `GpuSample` field to a Prometheus-style series name
(and to dcgm-exporter's name, for `--metric-names dcgm`). The store, the exporter, the rules and the
dashboards all use these names; `gpu/metrics.py` turns a sample into them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MetricType = Literal["gauge", "counter"]


@dataclass(frozen=True, slots=True)
class GpuMetric:
    name: str  # gpulens name, base units
    field: str  # GpuSample attribute
    help: str
    type: MetricType = "gauge"
    dcgm_name: str | None = None  # dcgm-exporter's field name
    dcgm_scale: float = 1.0  # multiply the base-unit value by this for DCGM's unit
    # further dcgm-exporter names for the same reading: (name, scale), e.g. PCIe throughput is both
    # DCGM_FI_DEV_PCIE_TX_THROUGHPUT (KB/s) and DCGM_FI_PROF_PCIE_TX_BYTES (B/s)
    dcgm_aliases: tuple[tuple[str, float], ...] = ()

    @property
    def is_counter(self) -> bool:
        return self.type == "counter"


MiB = 1024 * 1024

GPU_METRICS: tuple[GpuMetric, ...] = (
    GpuMetric("gpu_utilization_ratio", "utilization_gpu_ratio", "Fraction of time a kernel ran (NVML utilization.gpu).", dcgm_name="DCGM_FI_DEV_GPU_UTIL", dcgm_scale=100),
    GpuMetric("gpu_memory_copy_utilization_ratio", "utilization_memory_copy_ratio", "Fraction of time device memory was read or written (NVML utilization.memory).", dcgm_name="DCGM_FI_DEV_MEM_COPY_UTIL", dcgm_scale=100),
    GpuMetric("gpu_encoder_utilization_ratio", "utilization_encoder_ratio", "Fraction of time the video encoder was busy.", dcgm_name="DCGM_FI_DEV_ENC_UTIL", dcgm_scale=100),
    GpuMetric("gpu_decoder_utilization_ratio", "utilization_decoder_ratio", "Fraction of time the video decoder was busy.", dcgm_name="DCGM_FI_DEV_DEC_UTIL", dcgm_scale=100),
    GpuMetric("gpu_memory_used_bytes", "memory_used_bytes", "Device memory in use.", dcgm_name="DCGM_FI_DEV_FB_USED", dcgm_scale=1 / MiB),
    GpuMetric("gpu_memory_free_bytes", "memory_free_bytes", "Device memory free.", dcgm_name="DCGM_FI_DEV_FB_FREE", dcgm_scale=1 / MiB),
    GpuMetric("gpu_memory_reserved_bytes", "memory_reserved_bytes", "Device memory the driver and firmware reserve.", dcgm_name="DCGM_FI_DEV_FB_RESERVED", dcgm_scale=1 / MiB),
    GpuMetric("gpu_memory_total_bytes", "memory_total_bytes", "Device memory in total.", dcgm_name="DCGM_FI_DEV_FB_TOTAL", dcgm_scale=1 / MiB),
    GpuMetric("gpu_temperature_celsius", "temperature_celsius", "GPU core temperature.", dcgm_name="DCGM_FI_DEV_GPU_TEMP"),
    GpuMetric("gpu_memory_temperature_celsius", "memory_temperature_celsius", "Device memory (HBM) temperature.", dcgm_name="DCGM_FI_DEV_MEMORY_TEMP"),
    GpuMetric("gpu_temperature_slowdown_celsius", "temperature_slowdown_celsius", "Temperature at which the GPU slows its clocks.", dcgm_name="DCGM_FI_DEV_SLOWDOWN_TEMP"),
    GpuMetric("gpu_temperature_shutdown_celsius", "temperature_shutdown_celsius", "Temperature at which the GPU shuts down.", dcgm_name="DCGM_FI_DEV_SHUTDOWN_TEMP"),
    GpuMetric("gpu_power_watts", "power_watts", "Power draw.", dcgm_name="DCGM_FI_DEV_POWER_USAGE"),
    GpuMetric("gpu_power_limit_watts", "power_limit_watts", "Enforced power limit.", dcgm_name="DCGM_FI_DEV_POWER_MGMT_LIMIT"),
    GpuMetric("gpu_energy_joules_total", "energy_joules", "Energy used since the driver loaded.", "counter", dcgm_name="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", dcgm_scale=1000),
    GpuMetric("gpu_sm_clock_hertz", "sm_clock_hz", "SM clock.", dcgm_name="DCGM_FI_DEV_SM_CLOCK", dcgm_scale=1e-6),
    GpuMetric("gpu_memory_clock_hertz", "memory_clock_hz", "Memory clock.", dcgm_name="DCGM_FI_DEV_MEM_CLOCK", dcgm_scale=1e-6),
    GpuMetric("gpu_sm_clock_max_hertz", "sm_clock_max_hz", "Highest SM clock.", dcgm_name="DCGM_FI_DEV_MAX_SM_CLOCK", dcgm_scale=1e-6),
    GpuMetric("gpu_memory_clock_max_hertz", "memory_clock_max_hz", "Highest memory clock.", dcgm_name="DCGM_FI_DEV_MAX_MEM_CLOCK", dcgm_scale=1e-6),
    GpuMetric("gpu_clock_event_reasons", "clock_event_mask", "Bitmask of active clock-event (throttle) reasons, NVML encoding.", dcgm_name="DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"),
    GpuMetric("gpu_performance_state", "performance_state", "Performance state (0 = P0, fastest).", dcgm_name="DCGM_FI_DEV_PSTATE"),
    GpuMetric("gpu_pcie_tx_bytes_per_second", "pcie_tx_bytes_per_second", "PCIe transmit throughput.", dcgm_name="DCGM_FI_DEV_PCIE_TX_THROUGHPUT", dcgm_scale=1 / 1024,
              dcgm_aliases=(("DCGM_FI_PROF_PCIE_TX_BYTES", 1.0),)),
    GpuMetric("gpu_pcie_rx_bytes_per_second", "pcie_rx_bytes_per_second", "PCIe receive throughput.", dcgm_name="DCGM_FI_DEV_PCIE_RX_THROUGHPUT", dcgm_scale=1 / 1024,
              dcgm_aliases=(("DCGM_FI_PROF_PCIE_RX_BYTES", 1.0),)),
    GpuMetric("gpu_pcie_replay_total", "pcie_replay_total", "PCIe retries since the driver loaded.", "counter", dcgm_name="DCGM_FI_DEV_PCIE_REPLAY_COUNTER"),
    GpuMetric("gpu_nvlink_bytes_total", "nvlink_bytes_total", "NVLink data bytes sent and received over all links since the driver loaded.", "counter", dcgm_name="DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"),
    GpuMetric("gpu_ecc_corrected_volatile_total", "ecc_corrected_volatile_total", "Corrected (single-bit) ECC errors since the driver loaded.", "counter", dcgm_name="DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),
    GpuMetric("gpu_ecc_uncorrected_volatile_total", "ecc_uncorrected_volatile_total", "Uncorrected (double-bit) ECC errors since the driver loaded.", "counter", dcgm_name="DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
    GpuMetric("gpu_ecc_corrected_aggregate_total", "ecc_corrected_aggregate_total", "Corrected ECC errors over the GPU's life.", "counter", dcgm_name="DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"),
    GpuMetric("gpu_ecc_uncorrected_aggregate_total", "ecc_uncorrected_aggregate_total", "Uncorrected ECC errors over the GPU's life.", "counter", dcgm_name="DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"),
    GpuMetric("gpu_remapped_rows_correctable_total", "remapped_rows_correctable", "Rows remapped for correctable errors.", "counter", dcgm_name="DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"),
    GpuMetric("gpu_remapped_rows_uncorrectable_total", "remapped_rows_uncorrectable", "Rows remapped for uncorrectable errors.", "counter", dcgm_name="DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"),
    GpuMetric("gpu_remapped_rows_pending", "remapped_rows_pending", "1 when a row remapping waits for a GPU reset.", dcgm_name="DCGM_FI_DEV_ROW_REMAP_PENDING"),
    GpuMetric("gpu_remapped_rows_failure", "remapped_rows_failure", "1 when a row remapping failed.", dcgm_name="DCGM_FI_DEV_ROW_REMAP_FAILURE"),
    GpuMetric("gpu_mig_mode", "mig_mode", "1 when MIG (multi-instance GPU) mode is enabled.", dcgm_name=None),
    GpuMetric("gpu_graphics_active_ratio", "graphics_active_ratio", "Fraction of time the graphics or compute engine was active (GPM).", dcgm_name="DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
    GpuMetric("gpu_sm_active_ratio", "sm_active_ratio", "Fraction of time at least one warp was active on an SM (GPM).", dcgm_name="DCGM_FI_PROF_SM_ACTIVE"),
    GpuMetric("gpu_sm_occupancy_ratio", "sm_occupancy_ratio", "Resident warps over the maximum (GPM).", dcgm_name="DCGM_FI_PROF_SM_OCCUPANCY"),
    GpuMetric("gpu_tensor_active_ratio", "tensor_active_ratio", "Fraction of cycles a tensor pipe was active (GPM).", dcgm_name="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
    GpuMetric("gpu_dram_active_ratio", "dram_active_ratio", "Fraction of cycles device memory was busy (GPM).", dcgm_name="DCGM_FI_PROF_DRAM_ACTIVE"),
)

METRICS_BY_NAME: dict[str, GpuMetric] = {m.name: m for m in GPU_METRICS}

# dcgm-exporter's help text for the fields of its default-counters.csv, word for word, so that
# `--metric-names dcgm` reads as dcgm-exporter does (other DCGM names get gpulens's help).
DCGM_HELP: dict[str, str] = {
    "DCGM_FI_DEV_SM_CLOCK": "SM clock frequency (in MHz).",
    "DCGM_FI_DEV_MEM_CLOCK": "Memory clock frequency (in MHz).",
    "DCGM_FI_DEV_MEMORY_TEMP": "Memory temperature (in C).",
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "Total energy consumption since boot (in mJ).",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "Total number of PCIe retries.",
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "Memory utilization (in %).",
    "DCGM_FI_DEV_ENC_UTIL": "Encoder utilization (in %).",
    "DCGM_FI_DEV_DEC_UTIL": "Decoder utilization (in %).",
    "DCGM_FI_DEV_XID_ERRORS": "Value of the last XID error encountered.",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
    "DCGM_FI_DEV_FB_RESERVED": "Framebuffer memory reserved (in MiB).",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "Total number of NVLink bandwidth counters for all lanes.",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "Number of remapped rows for uncorrectable errors",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "Number of remapped rows for correctable errors",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "Whether remapping of rows has failed",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "Ratio of time the graphics engine is active.",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "Ratio of cycles the tensor (HMMA) pipe is active.",
    "DCGM_FI_PROF_DRAM_ACTIVE": "Ratio of cycles the device memory interface is active sending or receiving data.",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
}

# Derived series written beside the table above.
GPU_UP = "gpu_up"  # 1 while the GPU answers, 0 once it is lost
GPU_CLOCK_EVENT_ACTIVE = "gpu_clock_event_active"  # {reason=...} 1 while that reason is active
GPU_PROCESS_MEMORY = "gpu_process_memory_bytes"  # {pid, process}
GPU_PROCESS_COUNT = "gpu_compute_processes"
GPU_XID_TOTAL = "gpu_xid_errors_total"  # {xid=...} counter
GPU_XID_LAST = "gpu_xid_last_code"  # DCGM_FI_DEV_XID_ERRORS carries the last XID code

# Series of the table above that analyzers read by name (diagnose, energy): one constant each.
GPU_UTILIZATION = "gpu_utilization_ratio"
GPU_TENSOR_ACTIVE = "gpu_tensor_active_ratio"
GPU_MEMORY_USED = "gpu_memory_used_bytes"
GPU_MEMORY_TOTAL = "gpu_memory_total_bytes"
GPU_TEMPERATURE = "gpu_temperature_celsius"
GPU_TEMPERATURE_SLOWDOWN = "gpu_temperature_slowdown_celsius"
GPU_TEMPERATURE_SHUTDOWN = "gpu_temperature_shutdown_celsius"
GPU_POWER = "gpu_power_watts"
GPU_ENERGY_TOTAL = "gpu_energy_joules_total"
GPU_SM_CLOCK = "gpu_sm_clock_hertz"
GPU_SM_CLOCK_MAX = "gpu_sm_clock_max_hertz"
GPU_ECC_UNCORRECTED_VOLATILE = "gpu_ecc_uncorrected_volatile_total"
GPU_REMAPPED_ROWS_UNCORRECTABLE = "gpu_remapped_rows_uncorrectable_total"
GPU_REMAPPED_ROWS_PENDING = "gpu_remapped_rows_pending"
GPU_REMAPPED_ROWS_FAILURE = "gpu_remapped_rows_failure"
GPU_MIG_MODE = "gpu_mig_mode"
