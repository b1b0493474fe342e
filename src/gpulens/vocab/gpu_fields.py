"""The `GpuSample` (and `MigInstanceSample`) attributes that carry a reading, by name: for code that
names a field as data (the series table, nvidia-smi's counterparts, NVML's error keys, a recording's
probe), so a renamed field is one edit here and a typo is an import error.

Identity and bookkeeping attributes (`t`, `gpu`, `uuid`, `name`, `lost`, `errors`, `processes`,
`mig_instances`, a MIG instance's ids and profile) are not readings and have no constant here;
tests/foundation/test_vocabulary.py checks this list against the dataclasses.
"""

UTILIZATION_GPU_RATIO = "utilization_gpu_ratio"
UTILIZATION_MEMORY_COPY_RATIO = "utilization_memory_copy_ratio"
UTILIZATION_ENCODER_RATIO = "utilization_encoder_ratio"
UTILIZATION_DECODER_RATIO = "utilization_decoder_ratio"
MEMORY_USED_BYTES = "memory_used_bytes"
MEMORY_FREE_BYTES = "memory_free_bytes"
MEMORY_RESERVED_BYTES = "memory_reserved_bytes"
MEMORY_TOTAL_BYTES = "memory_total_bytes"
TEMPERATURE_CELSIUS = "temperature_celsius"
MEMORY_TEMPERATURE_CELSIUS = "memory_temperature_celsius"
TEMPERATURE_SLOWDOWN_CELSIUS = "temperature_slowdown_celsius"
TEMPERATURE_SHUTDOWN_CELSIUS = "temperature_shutdown_celsius"
POWER_WATTS = "power_watts"
POWER_LIMIT_WATTS = "power_limit_watts"
ENERGY_JOULES = "energy_joules"
SM_CLOCK_HZ = "sm_clock_hz"
MEMORY_CLOCK_HZ = "memory_clock_hz"
SM_CLOCK_MAX_HZ = "sm_clock_max_hz"
MEMORY_CLOCK_MAX_HZ = "memory_clock_max_hz"
CLOCK_EVENT_MASK = "clock_event_mask"
PERFORMANCE_STATE = "performance_state"
PCIE_TX_BYTES_PER_SECOND = "pcie_tx_bytes_per_second"
PCIE_RX_BYTES_PER_SECOND = "pcie_rx_bytes_per_second"
PCIE_REPLAY_TOTAL = "pcie_replay_total"
NVLINK_BYTES_TOTAL = "nvlink_bytes_total"
ECC_CORRECTED_VOLATILE_TOTAL = "ecc_corrected_volatile_total"
ECC_UNCORRECTED_VOLATILE_TOTAL = "ecc_uncorrected_volatile_total"
ECC_CORRECTED_AGGREGATE_TOTAL = "ecc_corrected_aggregate_total"
ECC_UNCORRECTED_AGGREGATE_TOTAL = "ecc_uncorrected_aggregate_total"
REMAPPED_ROWS_CORRECTABLE = "remapped_rows_correctable"
REMAPPED_ROWS_UNCORRECTABLE = "remapped_rows_uncorrectable"
REMAPPED_ROWS_PENDING = "remapped_rows_pending"
REMAPPED_ROWS_FAILURE = "remapped_rows_failure"
# GPM (Hopper and newer), 0..1, per GPU and per MIG GPU instance
GRAPHICS_ACTIVE_RATIO = "graphics_active_ratio"
SM_ACTIVE_RATIO = "sm_active_ratio"
SM_OCCUPANCY_RATIO = "sm_occupancy_ratio"
TENSOR_ACTIVE_RATIO = "tensor_active_ratio"
DRAM_ACTIVE_RATIO = "dram_active_ratio"
GPM_FIELDS = (GRAPHICS_ACTIVE_RATIO, SM_ACTIVE_RATIO, SM_OCCUPANCY_RATIO, TENSOR_ACTIVE_RATIO, DRAM_ACTIVE_RATIO)
MIG_MODE = "mig_mode"
COMPUTE_PROCESS_COUNT = "compute_process_count"  # series gpu_compute_processes (derived, not in the table)
