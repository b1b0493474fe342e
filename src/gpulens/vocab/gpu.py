"""GPU metric names: the one table that maps a `GpuSample` field to a Prometheus-style series name
(and to dcgm-exporter's name, for `--metric-names dcgm`). The store, the exporter, the rules and the
dashboards all use these names; `gpu/metrics.py` turns a sample into them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpulens.vocab import gpu_fields as F

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

# Series names of the table below (the name in upper case), for code that reads one series.
GPU_UTILIZATION_RATIO = "gpu_utilization_ratio"
GPU_MEMORY_COPY_UTILIZATION_RATIO = "gpu_memory_copy_utilization_ratio"
GPU_ENCODER_UTILIZATION_RATIO = "gpu_encoder_utilization_ratio"
GPU_DECODER_UTILIZATION_RATIO = "gpu_decoder_utilization_ratio"
GPU_MEMORY_USED_BYTES = "gpu_memory_used_bytes"
GPU_MEMORY_FREE_BYTES = "gpu_memory_free_bytes"
GPU_MEMORY_RESERVED_BYTES = "gpu_memory_reserved_bytes"
GPU_MEMORY_TOTAL_BYTES = "gpu_memory_total_bytes"
GPU_TEMPERATURE_CELSIUS = "gpu_temperature_celsius"
GPU_MEMORY_TEMPERATURE_CELSIUS = "gpu_memory_temperature_celsius"
GPU_TEMPERATURE_SLOWDOWN_CELSIUS = "gpu_temperature_slowdown_celsius"
GPU_TEMPERATURE_SHUTDOWN_CELSIUS = "gpu_temperature_shutdown_celsius"
GPU_POWER_WATTS = "gpu_power_watts"
GPU_POWER_LIMIT_WATTS = "gpu_power_limit_watts"
GPU_ENERGY_JOULES_TOTAL = "gpu_energy_joules_total"
GPU_SM_CLOCK_HERTZ = "gpu_sm_clock_hertz"
GPU_MEMORY_CLOCK_HERTZ = "gpu_memory_clock_hertz"
GPU_SM_CLOCK_MAX_HERTZ = "gpu_sm_clock_max_hertz"
GPU_MEMORY_CLOCK_MAX_HERTZ = "gpu_memory_clock_max_hertz"
GPU_CLOCK_EVENT_REASONS = "gpu_clock_event_reasons"
GPU_PERFORMANCE_STATE = "gpu_performance_state"
GPU_PCIE_TX_BYTES_PER_SECOND = "gpu_pcie_tx_bytes_per_second"
GPU_PCIE_RX_BYTES_PER_SECOND = "gpu_pcie_rx_bytes_per_second"
GPU_PCIE_REPLAY_TOTAL = "gpu_pcie_replay_total"
GPU_NVLINK_BYTES_TOTAL = "gpu_nvlink_bytes_total"
GPU_ECC_CORRECTED_VOLATILE_TOTAL = "gpu_ecc_corrected_volatile_total"
GPU_ECC_UNCORRECTED_VOLATILE_TOTAL = "gpu_ecc_uncorrected_volatile_total"
GPU_ECC_CORRECTED_AGGREGATE_TOTAL = "gpu_ecc_corrected_aggregate_total"
GPU_ECC_UNCORRECTED_AGGREGATE_TOTAL = "gpu_ecc_uncorrected_aggregate_total"
GPU_REMAPPED_ROWS_CORRECTABLE_TOTAL = "gpu_remapped_rows_correctable_total"
GPU_REMAPPED_ROWS_UNCORRECTABLE_TOTAL = "gpu_remapped_rows_uncorrectable_total"
GPU_REMAPPED_ROWS_PENDING = "gpu_remapped_rows_pending"
GPU_REMAPPED_ROWS_FAILURE = "gpu_remapped_rows_failure"
GPU_MIG_MODE = "gpu_mig_mode"
GPU_GRAPHICS_ACTIVE_RATIO = "gpu_graphics_active_ratio"
GPU_SM_ACTIVE_RATIO = "gpu_sm_active_ratio"
GPU_SM_OCCUPANCY_RATIO = "gpu_sm_occupancy_ratio"
GPU_TENSOR_ACTIVE_RATIO = "gpu_tensor_active_ratio"
GPU_DRAM_ACTIVE_RATIO = "gpu_dram_active_ratio"

GPU_METRICS: tuple[GpuMetric, ...] = (
    GpuMetric(GPU_UTILIZATION_RATIO, F.UTILIZATION_GPU_RATIO, "Fraction of time a kernel ran (NVML utilization.gpu).", dcgm_name="DCGM_FI_DEV_GPU_UTIL", dcgm_scale=100),
    GpuMetric(GPU_MEMORY_COPY_UTILIZATION_RATIO, F.UTILIZATION_MEMORY_COPY_RATIO, "Fraction of time device memory was read or written (NVML utilization.memory).", dcgm_name="DCGM_FI_DEV_MEM_COPY_UTIL", dcgm_scale=100),
    GpuMetric(GPU_ENCODER_UTILIZATION_RATIO, F.UTILIZATION_ENCODER_RATIO, "Fraction of time the video encoder was busy.", dcgm_name="DCGM_FI_DEV_ENC_UTIL", dcgm_scale=100),
    GpuMetric(GPU_DECODER_UTILIZATION_RATIO, F.UTILIZATION_DECODER_RATIO, "Fraction of time the video decoder was busy.", dcgm_name="DCGM_FI_DEV_DEC_UTIL", dcgm_scale=100),
    GpuMetric(GPU_MEMORY_USED_BYTES, F.MEMORY_USED_BYTES, "Device memory in use.", dcgm_name="DCGM_FI_DEV_FB_USED", dcgm_scale=1 / MiB),
    GpuMetric(GPU_MEMORY_FREE_BYTES, F.MEMORY_FREE_BYTES, "Device memory free.", dcgm_name="DCGM_FI_DEV_FB_FREE", dcgm_scale=1 / MiB),
    GpuMetric(GPU_MEMORY_RESERVED_BYTES, F.MEMORY_RESERVED_BYTES, "Device memory the driver and firmware reserve.", dcgm_name="DCGM_FI_DEV_FB_RESERVED", dcgm_scale=1 / MiB),
    GpuMetric(GPU_MEMORY_TOTAL_BYTES, F.MEMORY_TOTAL_BYTES, "Device memory in total.", dcgm_name="DCGM_FI_DEV_FB_TOTAL", dcgm_scale=1 / MiB),
    GpuMetric(GPU_TEMPERATURE_CELSIUS, F.TEMPERATURE_CELSIUS, "GPU core temperature.", dcgm_name="DCGM_FI_DEV_GPU_TEMP"),
    GpuMetric(GPU_MEMORY_TEMPERATURE_CELSIUS, F.MEMORY_TEMPERATURE_CELSIUS, "Device memory (HBM) temperature.", dcgm_name="DCGM_FI_DEV_MEMORY_TEMP"),
    GpuMetric(GPU_TEMPERATURE_SLOWDOWN_CELSIUS, F.TEMPERATURE_SLOWDOWN_CELSIUS, "Temperature at which the GPU slows its clocks.", dcgm_name="DCGM_FI_DEV_SLOWDOWN_TEMP"),
    GpuMetric(GPU_TEMPERATURE_SHUTDOWN_CELSIUS, F.TEMPERATURE_SHUTDOWN_CELSIUS, "Temperature at which the GPU shuts down.", dcgm_name="DCGM_FI_DEV_SHUTDOWN_TEMP"),
    GpuMetric(GPU_POWER_WATTS, F.POWER_WATTS, "Power draw.", dcgm_name="DCGM_FI_DEV_POWER_USAGE"),
    GpuMetric(GPU_POWER_LIMIT_WATTS, F.POWER_LIMIT_WATTS, "Enforced power limit.", dcgm_name="DCGM_FI_DEV_POWER_MGMT_LIMIT"),
    GpuMetric(GPU_ENERGY_JOULES_TOTAL, F.ENERGY_JOULES, "Energy used since the driver loaded.", "counter", dcgm_name="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", dcgm_scale=1000),
    GpuMetric(GPU_SM_CLOCK_HERTZ, F.SM_CLOCK_HZ, "SM clock.", dcgm_name="DCGM_FI_DEV_SM_CLOCK", dcgm_scale=1e-6),
    GpuMetric(GPU_MEMORY_CLOCK_HERTZ, F.MEMORY_CLOCK_HZ, "Memory clock.", dcgm_name="DCGM_FI_DEV_MEM_CLOCK", dcgm_scale=1e-6),
    GpuMetric(GPU_SM_CLOCK_MAX_HERTZ, F.SM_CLOCK_MAX_HZ, "Highest SM clock.", dcgm_name="DCGM_FI_DEV_MAX_SM_CLOCK", dcgm_scale=1e-6),
    GpuMetric(GPU_MEMORY_CLOCK_MAX_HERTZ, F.MEMORY_CLOCK_MAX_HZ, "Highest memory clock.", dcgm_name="DCGM_FI_DEV_MAX_MEM_CLOCK", dcgm_scale=1e-6),
    GpuMetric(GPU_CLOCK_EVENT_REASONS, F.CLOCK_EVENT_MASK, "Bitmask of active clock-event (throttle) reasons, NVML encoding.", dcgm_name="DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"),
    GpuMetric(GPU_PERFORMANCE_STATE, F.PERFORMANCE_STATE, "Performance state (0 = P0, fastest).", dcgm_name="DCGM_FI_DEV_PSTATE"),
    GpuMetric(GPU_PCIE_TX_BYTES_PER_SECOND, F.PCIE_TX_BYTES_PER_SECOND, "PCIe transmit throughput.", dcgm_name="DCGM_FI_DEV_PCIE_TX_THROUGHPUT", dcgm_scale=1 / 1024,
              dcgm_aliases=(("DCGM_FI_PROF_PCIE_TX_BYTES", 1.0),)),
    GpuMetric(GPU_PCIE_RX_BYTES_PER_SECOND, F.PCIE_RX_BYTES_PER_SECOND, "PCIe receive throughput.", dcgm_name="DCGM_FI_DEV_PCIE_RX_THROUGHPUT", dcgm_scale=1 / 1024,
              dcgm_aliases=(("DCGM_FI_PROF_PCIE_RX_BYTES", 1.0),)),
    GpuMetric(GPU_PCIE_REPLAY_TOTAL, F.PCIE_REPLAY_TOTAL, "PCIe retries since the driver loaded.", "counter", dcgm_name="DCGM_FI_DEV_PCIE_REPLAY_COUNTER"),
    GpuMetric(GPU_NVLINK_BYTES_TOTAL, F.NVLINK_BYTES_TOTAL, "NVLink data bytes sent and received over all links since the driver loaded.", "counter", dcgm_name="DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"),
    GpuMetric(GPU_ECC_CORRECTED_VOLATILE_TOTAL, F.ECC_CORRECTED_VOLATILE_TOTAL, "Corrected (single-bit) ECC errors since the driver loaded.", "counter", dcgm_name="DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),
    GpuMetric(GPU_ECC_UNCORRECTED_VOLATILE_TOTAL, F.ECC_UNCORRECTED_VOLATILE_TOTAL, "Uncorrected (double-bit) ECC errors since the driver loaded.", "counter", dcgm_name="DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
    GpuMetric(GPU_ECC_CORRECTED_AGGREGATE_TOTAL, F.ECC_CORRECTED_AGGREGATE_TOTAL, "Corrected ECC errors over the GPU's life.", "counter", dcgm_name="DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"),
    GpuMetric(GPU_ECC_UNCORRECTED_AGGREGATE_TOTAL, F.ECC_UNCORRECTED_AGGREGATE_TOTAL, "Uncorrected ECC errors over the GPU's life.", "counter", dcgm_name="DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"),
    GpuMetric(GPU_REMAPPED_ROWS_CORRECTABLE_TOTAL, F.REMAPPED_ROWS_CORRECTABLE, "Rows remapped for correctable errors.", "counter", dcgm_name="DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"),
    GpuMetric(GPU_REMAPPED_ROWS_UNCORRECTABLE_TOTAL, F.REMAPPED_ROWS_UNCORRECTABLE, "Rows remapped for uncorrectable errors.", "counter", dcgm_name="DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"),
    GpuMetric(GPU_REMAPPED_ROWS_PENDING, F.REMAPPED_ROWS_PENDING, "1 when a row remapping waits for a GPU reset.", dcgm_name="DCGM_FI_DEV_ROW_REMAP_PENDING"),
    GpuMetric(GPU_REMAPPED_ROWS_FAILURE, F.REMAPPED_ROWS_FAILURE, "1 when a row remapping failed.", dcgm_name="DCGM_FI_DEV_ROW_REMAP_FAILURE"),
    GpuMetric(GPU_MIG_MODE, F.MIG_MODE, "1 when MIG (multi-instance GPU) mode is enabled.", dcgm_name=None),
    GpuMetric(GPU_GRAPHICS_ACTIVE_RATIO, F.GRAPHICS_ACTIVE_RATIO, "Fraction of time the graphics or compute engine was active (GPM).", dcgm_name="DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
    GpuMetric(GPU_SM_ACTIVE_RATIO, F.SM_ACTIVE_RATIO, "Fraction of time at least one warp was active on an SM (GPM).", dcgm_name="DCGM_FI_PROF_SM_ACTIVE"),
    GpuMetric(GPU_SM_OCCUPANCY_RATIO, F.SM_OCCUPANCY_RATIO, "Resident warps over the maximum (GPM).", dcgm_name="DCGM_FI_PROF_SM_OCCUPANCY"),
    GpuMetric(GPU_TENSOR_ACTIVE_RATIO, F.TENSOR_ACTIVE_RATIO, "Fraction of cycles a tensor pipe was active (GPM).", dcgm_name="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
    GpuMetric(GPU_DRAM_ACTIVE_RATIO, F.DRAM_ACTIVE_RATIO, "Fraction of cycles device memory was busy (GPM).", dcgm_name="DCGM_FI_PROF_DRAM_ACTIVE"),
)

METRICS_BY_NAME: dict[str, GpuMetric] = {m.name: m for m in GPU_METRICS}
METRICS_BY_FIELD: dict[str, GpuMetric] = {m.field: m for m in GPU_METRICS}

# dcgm-exporter's name of the last XID code (no GpuSample field: the exporter writes it from XID events)
DCGM_XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"

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
    DCGM_XID_ERRORS: "Value of the last XID error encountered.",
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

