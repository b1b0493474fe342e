"""NvmlBackend: real GPUs through NVML (nvidia-ml-py). The only module in gpulens that imports pynvml.

Habits taken from nvitop/gpustat: a field that fails becomes None and is logged once per GPU and
field, never per tick; a GPU that answers NVML_ERROR_GPU_IS_LOST is reported lost while the others go
on; XID errors come from an NVML event set watched by a thread; GPM (Hopper and newer) is probed once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml

from gpulens.errors import BackendUnavailableError
from gpulens.gpu.types import GpuInfo, GpuProcess, GpuSample, MigInstanceSample, XidEvent
from gpulens.vocab import gpu_fields as F

log = logging.getLogger(__name__)

_GPM_METRICS = {
    F.GRAPHICS_ACTIVE_RATIO: pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
    F.SM_ACTIVE_RATIO: pynvml.NVML_GPM_METRIC_SM_UTIL,
    F.SM_OCCUPANCY_RATIO: pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    F.TENSOR_ACTIVE_RATIO: pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    F.DRAM_ACTIVE_RATIO: pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
}


# nvmlDeviceGetFieldValues ids read each sample: sample field -> (field id, scope id). NVLink's
# throughput counters (KiB) are asked for all links at once (scope UINT_MAX, as DCGM does).
_ALL_LINKS = 0xFFFFFFFF
_FIELD_VALUES = {
    F.MEMORY_TEMPERATURE_CELSIUS: (pynvml.NVML_FI_DEV_MEMORY_TEMP, 0),
    "nvlink_tx_kib": (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _ALL_LINKS),
    "nvlink_rx_kib": (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _ALL_LINKS),
}
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}


def _field_value(v: Any) -> float | None:
    """The number in one nvmlFieldValue_t, or None when NVML answered an error for that field."""
    if v.nvmlReturn != pynvml.NVML_SUCCESS:
        return None
    member = _VALUE_MEMBER.get(int(v.valueType))
    return float(getattr(v.value, member)) if member else None


class _GpuLost(Exception):
    pass


def driver_available() -> bool:
    """True when an NVIDIA driver answers (NVML initialises and sees at least one GPU)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    try:
        return pynvml.nvmlDeviceGetCount() > 0
    except pynvml.NVMLError:
        return False
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _error_name(e: pynvml.NVMLError) -> str:
    return type(e).__name__.replace("NVMLError_", "NVML_ERROR_") if type(e) is not pynvml.NVMLError else f"NVML_ERROR_{e.value}"


class NvmlBackend:
    name = "nvml"
    paced = False  # sampled on the wall clock, at the pipeline's interval
    source_time: float | None = None

    def __init__(self, *, clock: Callable[[], float] = time.time, watch_xid: bool = True, processes: bool = True):
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise BackendUnavailableError(
                f"NVML could not start ({e}): no NVIDIA driver is loaded here.",
                hint="On a machine without a GPU use --backend fake or --backend replay:PATH.",
            ) from None
        self._clock = clock
        self._want_processes = processes
        self._warned: set[tuple[int, str]] = set()
        self._lost: set[int] = set()
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self._driver_version = self._driver()
        self._infos = [self._read_info(i, h) for i, h in enumerate(self._handles)]
        self._gpm_prev: dict[tuple[int, int | None], Any] = {}
        self._gpm_ok = {i: self._gpm_supported(h) for i, h in enumerate(self._handles)}
        self._clock_reasons_fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        self._xids: list[XidEvent] = []
        self._xid_lock = threading.Lock()
        self._stop = threading.Event()
        self._xid_thread: threading.Thread | None = None
        self.xid_watch_gpus: list[int] = []  # the GPUs whose XID events are registered
        if watch_xid:
            self._start_xid_watch()

    # ------------------------------------------------------------ helpers
    def _q(self, gpu: int, field: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call NVML; a failing field becomes None and is logged once. A lost GPU raises _GpuLost."""
        try:
            return fn(*args)
        except pynvml.NVMLError as e:
            if getattr(e, "value", None) == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost() from None
            if (gpu, field) not in self._warned:
                self._warned.add((gpu, field))
                log.info("GPU %d: %s unavailable (%s); reported as missing from now on", gpu, field, _error_name(e))
            return None

    def _driver(self) -> str | None:
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
        except pynvml.NVMLError:
            return None
        return v.decode() if isinstance(v, bytes) else str(v)

    def _read_info(self, i: int, h: Any) -> GpuInfo:
        def q(field: str, fn: Callable[..., Any], *a: Any) -> Any:
            try:
                return self._q(i, field, fn, *a)
            except _GpuLost:
                return None

        mem = q("memory", pynvml.nvmlDeviceGetMemoryInfo, h)
        limit_mw = q("power_limit", pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
        sm_max = q("sm_clock_max", pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_SM)
        mem_max = q("memory_clock_max", pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_MEM)
        pci = q("pci", pynvml.nvmlDeviceGetPciInfo, h)
        name = q("name", pynvml.nvmlDeviceGetName, h) or f"GPU {i}"
        uuid = q("uuid", pynvml.nvmlDeviceGetUUID, h) or f"GPU-unknown-{i}"
        return GpuInfo(
            index=i,
            uuid=uuid.decode() if isinstance(uuid, bytes) else uuid,
            name=name.decode() if isinstance(name, bytes) else name,
            memory_total_bytes=mem.total if mem else None,
            temperature_slowdown_celsius=q("temp_slowdown", pynvml.nvmlDeviceGetTemperatureThreshold, h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
            temperature_shutdown_celsius=q("temp_shutdown", pynvml.nvmlDeviceGetTemperatureThreshold, h, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
            sm_clock_max_hz=sm_max * 1e6 if sm_max else None,
            memory_clock_max_hz=mem_max * 1e6 if mem_max else None,
            power_limit_watts=limit_mw / 1000 if limit_mw else None,
            pci_bus_id=(pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId) if pci else None,
            minor_number=q("minor_number", pynvml.nvmlDeviceGetMinorNumber, h),
            driver_version=self._driver_version,
        )

    def _gpm_supported(self, h: Any) -> bool:
        try:
            return bool(pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
        except (pynvml.NVMLError, AttributeError):
            return False

    # ------------------------------------------------------------ XID events
    def _start_xid_watch(self) -> None:
        try:
            event_set = pynvml.nvmlEventSetCreate()
            registered = []
            for i, h in enumerate(self._handles):
                try:
                    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, event_set)
                    registered.append(i)
                except pynvml.NVMLError as e:
                    log.info("GPU %d: XID events unavailable (%s)", i, _error_name(e))
        except pynvml.NVMLError as e:
            log.info("XID events unavailable (%s)", _error_name(e))
            return
        if not registered:
            return
        self.xid_watch_gpus = registered
        uuid_by_handle = {id(h): self._infos[i] for i, h in enumerate(self._handles)}

        def watch() -> None:
            while not self._stop.is_set():
                try:
                    data = pynvml.nvmlEventSetWait_v2(event_set, 500)
                except pynvml.NVMLError as e:
                    if getattr(e, "value", None) == pynvml.NVML_ERROR_TIMEOUT:
                        continue
                    log.warning("XID watch stopped: %s", _error_name(e))
                    return
                info = self._info_for_handle(data.device) or uuid_by_handle.get(id(data.device))
                with self._xid_lock:
                    self._xids.append(
                        XidEvent(t=self._clock(), gpu=info.index if info else -1, uuid=info.uuid if info else "", xid=int(data.eventData))
                    )
            try:
                pynvml.nvmlEventSetFree(event_set)
            except pynvml.NVMLError:
                pass

        self._xid_thread = threading.Thread(target=watch, name="gpulens-xid", daemon=True)
        self._xid_thread.start()

    def _info_for_handle(self, handle: Any) -> GpuInfo | None:
        try:
            uuid = pynvml.nvmlDeviceGetUUID(handle)
        except pynvml.NVMLError:
            return None
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        return next((i for i in self._infos if i.uuid == uuid), None)

    def drain_xid_events(self) -> list[XidEvent]:
        with self._xid_lock:
            out, self._xids = self._xids, []
        return out

    # ------------------------------------------------------------ sampling
    def gpus(self) -> list[GpuInfo]:
        return list(self._infos)

    @property
    def exhausted(self) -> bool:
        return False

    def sample(self) -> list[GpuSample]:
        now = self._clock()
        out = []
        for info, h in zip(self._infos, self._handles, strict=True):
            if info.index in self._lost:
                out.append(GpuSample(t=now, gpu=info.index, uuid=info.uuid, name=info.name, lost=True))
                continue
            try:
                out.append(self._sample_one(info, h, now))
            except _GpuLost:
                log.error("GPU %d (%s) is lost (NVML_ERROR_GPU_IS_LOST); the others are still watched", info.index, info.uuid)
                self._lost.add(info.index)
                out.append(GpuSample(t=now, gpu=info.index, uuid=info.uuid, name=info.name, lost=True))
        return out

    def _sample_one(self, info: GpuInfo, h: Any, now: float) -> GpuSample:
        i = info.index
        q = self._q
        util = q(i, "utilization", pynvml.nvmlDeviceGetUtilizationRates, h)
        mem = self._memory(i, h)
        enc = q(i, "encoder_utilization", pynvml.nvmlDeviceGetEncoderUtilization, h)
        dec = q(i, "decoder_utilization", pynvml.nvmlDeviceGetDecoderUtilization, h)
        fv = self._field_values(i, h)
        nvlink = fv["nvlink_tx_kib"] + fv["nvlink_rx_kib"] if fv["nvlink_tx_kib"] is not None and fv["nvlink_rx_kib"] is not None else None
        power_mw = q(i, "power", pynvml.nvmlDeviceGetPowerUsage, h)
        energy_mj = q(i, "energy", pynvml.nvmlDeviceGetTotalEnergyConsumption, h)
        sm_mhz = q(i, "sm_clock", pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
        mem_mhz = q(i, "memory_clock", pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM)
        tx = q(i, "pcie_tx", pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        rx = q(i, "pcie_rx", pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        ecc = {}
        for err_name, err_type in (("corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED), ("uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
            for scope_name, scope in (("volatile", pynvml.NVML_VOLATILE_ECC), ("aggregate", pynvml.NVML_AGGREGATE_ECC)):
                ecc[f"ecc_{err_name}_{scope_name}_total"] = q(i, f"ecc_{err_name}_{scope_name}", pynvml.nvmlDeviceGetTotalEccErrors, h, err_type, scope)
        remap = q(i, "remapped_rows", pynvml.nvmlDeviceGetRemappedRows, h)
        limit_mw = q(i, "power_limit", pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
        s = GpuSample(
            t=now,
            gpu=i,
            uuid=info.uuid,
            name=info.name,
            utilization_gpu_ratio=util.gpu / 100.0 if util else None,
            utilization_memory_copy_ratio=util.memory / 100.0 if util else None,
            utilization_encoder_ratio=enc[0] / 100.0 if enc else None,
            utilization_decoder_ratio=dec[0] / 100.0 if dec else None,
            memory_used_bytes=mem.used if mem else None,
            memory_free_bytes=mem.free if mem else None,
            memory_reserved_bytes=getattr(mem, "reserved", None) if mem else None,
            memory_total_bytes=mem.total if mem else None,
            memory_temperature_celsius=fv[F.MEMORY_TEMPERATURE_CELSIUS],
            temperature_celsius=q(i, "temperature", pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
            temperature_slowdown_celsius=info.temperature_slowdown_celsius,
            temperature_shutdown_celsius=info.temperature_shutdown_celsius,
            power_watts=power_mw / 1000.0 if power_mw is not None else None,
            power_limit_watts=limit_mw / 1000.0 if limit_mw else info.power_limit_watts,
            energy_joules=energy_mj / 1000.0 if energy_mj is not None else None,
            sm_clock_hz=sm_mhz * 1e6 if sm_mhz is not None else None,
            memory_clock_hz=mem_mhz * 1e6 if mem_mhz is not None else None,
            sm_clock_max_hz=info.sm_clock_max_hz,
            memory_clock_max_hz=info.memory_clock_max_hz,
            clock_event_mask=q(i, "clock_event_reasons", self._clock_reasons_fn, h),
            performance_state=q(i, F.PERFORMANCE_STATE, pynvml.nvmlDeviceGetPerformanceState, h),
            pcie_tx_bytes_per_second=tx * 1024.0 if tx is not None else None,
            pcie_rx_bytes_per_second=rx * 1024.0 if rx is not None else None,
            pcie_replay_total=q(i, "pcie_replay_counter", pynvml.nvmlDeviceGetPcieReplayCounter, h),
            nvlink_bytes_total=nvlink * 1024.0 if nvlink is not None else None,
            remapped_rows_correctable=remap[0] if remap else None,
            remapped_rows_uncorrectable=remap[1] if remap else None,
            remapped_rows_pending=bool(remap[2]) if remap else None,
            remapped_rows_failure=bool(remap[3]) if remap else None,
            **ecc,
        )
        mig = q(i, F.MIG_MODE, pynvml.nvmlDeviceGetMigMode, h)
        s.mig_mode = bool(mig[0]) if mig else None
        if s.mig_mode:
            s.mig_instances = self._mig_instances(i, h)
        if self._want_processes:
            procs = q(i, "compute_processes", pynvml.nvmlDeviceGetComputeRunningProcesses, h)
            if procs is not None:
                s.processes = [
                    GpuProcess(pid=p.pid, name=_process_name(p.pid), used_memory_bytes=getattr(p, "usedGpuMemory", None))
                    for p in procs
                ]
                s.compute_process_count = len(s.processes)
        if self._gpm_ok.get(i) and not s.mig_mode:  # in MIG mode GPM is read per GPU instance
            self._read_gpm(i, h, s)
        return s

    def _memory(self, i: int, h: Any) -> Any:
        """nvmlMemory_v2_t (with `reserved`) where the driver has it, else the v1 struct."""
        try:
            return pynvml.nvmlDeviceGetMemoryInfo(h, pynvml.nvmlMemory_v2)
        except pynvml.NVMLError as e:
            if getattr(e, "value", None) == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost() from None
        return self._q(i, "memory", pynvml.nvmlDeviceGetMemoryInfo, h)

    def _field_values(self, i: int, h: Any) -> dict[str, float | None]:
        values = self._q(i, "field_values", pynvml.nvmlDeviceGetFieldValues, h, list(_FIELD_VALUES.values()))
        if values is None:
            return dict.fromkeys(_FIELD_VALUES)
        return {name: _field_value(values[k]) for k, name in enumerate(_FIELD_VALUES)}

    def _mig_instances(self, i: int, h: Any) -> list[MigInstanceSample] | None:
        """Each MIG device of a GPU in MIG mode: its memory and, with GPM, its engines' activity."""
        count = self._q(i, "mig_device_count", pynvml.nvmlDeviceGetMaxMigDeviceCount, h)
        if count is None:
            return None
        out = []
        for k in range(count):
            try:
                mh = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
            except pynvml.NVMLError:
                continue  # NOT_FOUND: no MIG device in that slot
            gi = self._q(i, "mig_gpu_instance_id", pynvml.nvmlDeviceGetGpuInstanceId, mh)
            if gi is None:
                continue
            name = self._q(i, "mig_name", pynvml.nvmlDeviceGetName, mh) or ""
            name = name.decode() if isinstance(name, bytes) else name
            uuid = self._q(i, "mig_uuid", pynvml.nvmlDeviceGetUUID, mh) or ""
            mem = self._q(i, "mig_memory", pynvml.nvmlDeviceGetMemoryInfo, mh)
            m = MigInstanceSample(
                gpu_instance_id=int(gi),
                compute_instance_id=int(self._q(i, "mig_compute_instance_id", pynvml.nvmlDeviceGetComputeInstanceId, mh) or 0),
                profile=name.rsplit(" ", 1)[-1] if "MIG" in name else name,  # "NVIDIA H200 MIG 1g.18gb" -> "1g.18gb"
                uuid=uuid.decode() if isinstance(uuid, bytes) else uuid,
                memory_used_bytes=mem.used if mem else None,
                memory_free_bytes=mem.free if mem else None,
                memory_total_bytes=mem.total if mem else None,
                device_index=k,
            )
            if self._gpm_ok.get(i):
                self._read_gpm(i, h, m, mig_instance=m.gpu_instance_id)
            out.append(m)
        return out

    def _read_gpm(self, i: int, h: Any, s: GpuSample | MigInstanceSample, mig_instance: int | None = None) -> None:
        """GPM metrics are rates between two samples: keep the previous one per GPU (and MIG instance)."""
        key = (i, mig_instance)
        try:
            if mig_instance is None:
                cur = pynvml.nvmlGpmSampleGet(h, pynvml.nvmlGpmSampleAlloc())
            else:
                cur = pynvml.nvmlGpmMigSampleGet(h, mig_instance, pynvml.nvmlGpmSampleAlloc())
        except pynvml.NVMLError as e:
            log.info("GPU %d: GPM sampling failed (%s); GPM metrics off", i, _error_name(e))
            self._gpm_ok[i] = False
            return
        prev = self._gpm_prev.get(key)
        self._gpm_prev[key] = cur
        if prev is None:
            return
        req = pynvml.c_nvmlGpmMetricsGet_t()
        req.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(_GPM_METRICS)
        req.sample1 = prev
        req.sample2 = cur
        for k, metric_id in enumerate(_GPM_METRICS.values()):
            req.metrics[k].metricId = metric_id
        try:
            pynvml.nvmlGpmMetricsGet(req)
        except pynvml.NVMLError as e:
            log.info("GPU %d: GPM metrics failed (%s)", i, _error_name(e))
            return
        finally:
            try:
                pynvml.nvmlGpmSampleFree(prev)
            except pynvml.NVMLError:
                pass
        for k, field in enumerate(_GPM_METRICS):
            m = req.metrics[k]
            if m.nvmlReturn == pynvml.NVML_SUCCESS:
                setattr(s, field, m.value / 100.0)

    def close(self) -> None:
        self._stop.set()
        if self._xid_thread is not None:
            self._xid_thread.join(timeout=2)
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _process_name(pid: int) -> str:
    try:
        name = pynvml.nvmlSystemGetProcessName(pid)
        return name.decode() if isinstance(name, bytes) else str(name)
    except pynvml.NVMLError:
        pass
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def nvml_smi_versions() -> dict[str, Any]:
    """Driver, NVML and CUDA driver versions, for the environment fingerprint. {} without a driver."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return {}
    out: dict[str, Any] = {}
    try:
        for key, fn in (("driver", pynvml.nvmlSystemGetDriverVersion), ("nvml", pynvml.nvmlSystemGetNVMLVersion)):
            try:
                v = fn()
                out[key] = v.decode() if isinstance(v, bytes) else v
            except pynvml.NVMLError:
                pass
        try:
            cuda = pynvml.nvmlSystemGetCudaDriverVersion()
            out["cuda_driver"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        except pynvml.NVMLError:
            pass
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            g: dict[str, Any] = {"index": i}
            for key, fn in (("name", pynvml.nvmlDeviceGetName), ("uuid", pynvml.nvmlDeviceGetUUID), ("vbios", pynvml.nvmlDeviceGetVbiosVersion)):
                try:
                    v = fn(h)
                    g[key] = v.decode() if isinstance(v, bytes) else v
                except pynvml.NVMLError:
                    pass
            try:
                g[F.MIG_MODE] = pynvml.nvmlDeviceGetMigMode(h)[0]
            except pynvml.NVMLError:
                pass
            gpus.append(g)
        out["gpus"] = gpus
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return out
