"""Typed values that cross the GPU seam. Units are in the field names; None means "not available"."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class ClockEvent(enum.IntFlag):
    """nvmlDeviceGetCurrentClocksEventReasons bits (NVML docs, see REFERENCE.md)."""

    IDLE = 0x1
    APPLICATIONS_CLOCKS = 0x2
    SW_POWER_CAP = 0x4
    HW_SLOWDOWN = 0x8
    SYNC_BOOST = 0x10
    SW_THERMAL = 0x20
    HW_THERMAL = 0x40
    HW_POWER_BRAKE = 0x80
    DISPLAY_CLOCKS = 0x100


# The reasons a user cares about, with the label value gpulens exports for each.
CLOCK_EVENT_LABELS: dict[ClockEvent, str] = {
    ClockEvent.IDLE: "idle",
    ClockEvent.SW_POWER_CAP: "sw_power_cap",
    ClockEvent.HW_SLOWDOWN: "hw_slowdown",
    ClockEvent.SYNC_BOOST: "sync_boost",
    ClockEvent.SW_THERMAL: "sw_thermal",
    ClockEvent.HW_THERMAL: "hw_thermal",
    ClockEvent.HW_POWER_BRAKE: "hw_power_brake",
}


def decode_clock_events(mask: int | None) -> list[str]:
    """Names of the active clock-event reasons in `mask`, in bit order."""
    if not mask:
        return []
    return [name for bit, name in CLOCK_EVENT_LABELS.items() if mask & bit]


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """Static facts about one GPU, read once."""

    index: int
    uuid: str
    name: str
    memory_total_bytes: int | None = None
    temperature_slowdown_celsius: float | None = None
    temperature_shutdown_celsius: float | None = None
    sm_clock_max_hz: float | None = None
    memory_clock_max_hz: float | None = None
    power_limit_watts: float | None = None
    pci_bus_id: str | None = None
    minor_number: int | None = None  # the N of /dev/nvidiaN (dcgm-exporter's `device` label)
    driver_version: str | None = None  # the same for every GPU of a node (DCGM_FI_DRIVER_VERSION)


@dataclass(slots=True)
class MigInstanceSample:
    """One MIG GPU instance of a GPU at time `t`: what NVML reads per MIG device (utilization and
    power are per GPU only). `profile` is the instance's profile name, e.g. "1g.18gb"."""

    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    uuid: str  # the MIG device's own UUID ("MIG-..."), what the device plugin hands to a pod
    memory_used_bytes: float | None = None
    memory_free_bytes: float | None = None
    memory_total_bytes: float | None = None
    # GPM per GPU instance (Hopper and newer), 0..1
    graphics_active_ratio: float | None = None
    sm_active_ratio: float | None = None
    sm_occupancy_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None
    # NVML's MIG device slot (nvmlDeviceGetMigDeviceHandleByIndex): the "<gpu>:<slot>" id NVIDIA's
    # device plugin gives the kubelet under --device-id-strategy=index
    device_index: int | None = None


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A compute process on a GPU and the GPU memory it holds."""

    pid: int
    name: str
    used_memory_bytes: int | None


@dataclass(slots=True)
class GpuSample:
    """One reading of one GPU at time `t` (unix seconds). Any field may be None: not supported or failed."""

    t: float
    gpu: int
    uuid: str
    name: str
    lost: bool = False
    utilization_gpu_ratio: float | None = None
    utilization_memory_copy_ratio: float | None = None
    utilization_encoder_ratio: float | None = None
    utilization_decoder_ratio: float | None = None
    memory_used_bytes: float | None = None
    memory_free_bytes: float | None = None
    memory_reserved_bytes: float | None = None  # held by the driver and firmware (nvmlMemory_v2_t.reserved)
    memory_total_bytes: float | None = None
    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None  # HBM temperature (NVML field NVML_FI_DEV_MEMORY_TEMP)
    temperature_slowdown_celsius: float | None = None
    temperature_shutdown_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None
    sm_clock_hz: float | None = None
    memory_clock_hz: float | None = None
    sm_clock_max_hz: float | None = None
    memory_clock_max_hz: float | None = None
    clock_event_mask: int | None = None
    performance_state: int | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    pcie_replay_total: float | None = None  # PCIe retries since the driver loaded
    nvlink_bytes_total: float | None = None  # NVLink data bytes sent and received, all links, since the driver loaded
    ecc_corrected_volatile_total: float | None = None
    ecc_uncorrected_volatile_total: float | None = None
    ecc_corrected_aggregate_total: float | None = None
    ecc_uncorrected_aggregate_total: float | None = None
    remapped_rows_correctable: float | None = None
    remapped_rows_uncorrectable: float | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    # GPM (Hopper and newer), 0..1
    graphics_active_ratio: float | None = None
    sm_active_ratio: float | None = None
    sm_occupancy_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None
    mig_mode: bool | None = None  # MIG enabled (current mode)
    compute_process_count: int | None = None
    processes: list[GpuProcess] | None = None
    mig_instances: list[MigInstanceSample] | None = None  # None: MIG off (or not read)
    # field name -> NVML error name, for fields that failed on this sample (informational)
    errors: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class XidEvent:
    """An XID error reported by the driver (nvmlEventTypeXidCriticalError)."""

    t: float
    gpu: int
    uuid: str
    xid: int
