"""A stand-in for the NVIDIA driver behind pynvml, answering from the real H200's NVML probe
(`nvml_probe.json`): the GPU is the one thing these tests cannot have, so its answers are recorded.

Only the C-level calls NvmlBackend makes are replaced; pynvml's own error classes and structs are used.
Scriptable: `lost` (GPU_IS_LOST from a handle), `unsupported` (NOT_SUPPORTED for a function), `xids`
(events waiting in the event set), `mig` (GPU index -> MIG profiles: that GPU is in MIG mode, with one
GPU instance per profile; the probed H200 was not, so these answers follow NVML's documented shapes)."""

from __future__ import annotations

import json
import queue
from pathlib import Path
from types import SimpleNamespace

import pynvml


class ProbeNvml:
    def __init__(self, probe_path: Path, gpus: int = 1):
        self.probe = json.loads(probe_path.read_text())
        self.gpus = gpus
        self.lost: set[int] = set()
        self.unsupported: set[str] = set()
        self.xids: queue.Queue = queue.Queue()
        self.calls: dict[str, int] = {}
        self.mig: dict[int, list[str]] = {}

    def value(self, key):
        entry = self.probe[key]
        if not entry.get("ok"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return entry["value"]

    def install(self, monkeypatch) -> None:
        def device(name, fn):
            def call(handle, *args):
                self.calls[name] = self.calls.get(name, 0) + 1
                if handle.index in self.lost:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
                if name in self.unsupported:
                    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
                return fn(handle, *args)

            monkeypatch.setattr(pynvml, name, call)

        v = self.value
        monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
        monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: self.gpus)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: SimpleNamespace(index=i))
        def mig_of(h):
            return getattr(h, "mig", None)

        def mig_total(h):
            return int(self.mig[h.index][h.mig].split(".")[1].removesuffix("gb")) * 10**9

        device("nvmlDeviceGetName", lambda h: v("name") if mig_of(h) is None else f"{v('name')} MIG {self.mig[h.index][h.mig]}")
        device("nvmlDeviceGetUUID", lambda h: v("uuid")[:-1] + str(h.index) if mig_of(h) is None else f"MIG-{h.index}-{h.mig}")
        device("nvmlDeviceGetMemoryInfo", lambda h, version=None: SimpleNamespace(**v("memory_info")) if mig_of(h) is None
               else SimpleNamespace(total=mig_total(h), used=mig_total(h) // 4, free=mig_total(h) - mig_total(h) // 4))
        device("nvmlDeviceGetMaxMigDeviceCount", lambda h: 7)

        def mig_handle(h, k):
            if k >= len(self.mig.get(h.index, [])):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
            return SimpleNamespace(index=h.index, mig=k)

        device("nvmlDeviceGetMigDeviceHandleByIndex", mig_handle)
        device("nvmlDeviceGetGpuInstanceId", lambda h: h.mig + 1)
        device("nvmlDeviceGetComputeInstanceId", lambda h: 0)
        monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: v("driver"))
        device("nvmlDeviceGetEncoderUtilization", lambda h: list(v("encoder_util")))
        device("nvmlDeviceGetDecoderUtilization", lambda h: list(v("decoder_util")))
        device("nvmlDeviceGetPcieReplayCounter", lambda h: v("pcie_replay_counter"))
        device("nvmlDeviceGetFieldValues", lambda h, ids: v("field_values"))  # not probed: NOT_SUPPORTED
        device("nvmlDeviceGetEnforcedPowerLimit", lambda h: v("enforced_power_limit_mw"))
        device("nvmlDeviceGetMaxClockInfo", lambda h, c: v("max_clock_sm") if c == pynvml.NVML_CLOCK_SM else v("max_clock_mem"))
        device("nvmlDeviceGetClockInfo", lambda h, c: v("clock_sm") if c == pynvml.NVML_CLOCK_SM else v("clock_mem"))
        device("nvmlDeviceGetPciInfo", lambda h: SimpleNamespace(busId=v("pci_info")["busId"]))
        device(
            "nvmlDeviceGetTemperatureThreshold",
            lambda h, k: v("temp_threshold_slowdown") if k == pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN else v("temp_threshold_shutdown"),
        )
        device("nvmlDeviceGetTemperature", lambda h, s: v("temperature_gpu"))
        device("nvmlDeviceGetUtilizationRates", lambda h: SimpleNamespace(**v("utilization")))
        device("nvmlDeviceGetPowerUsage", lambda h: v("power_usage_mw"))
        device("nvmlDeviceGetTotalEnergyConsumption", lambda h: v("total_energy_mj"))
        device("nvmlDeviceGetCurrentClocksEventReasons", lambda h: v("clocks_event_reasons"))
        device("nvmlDeviceGetPerformanceState", lambda h: v("pstate"))
        device("nvmlDeviceGetPcieThroughput", lambda h, c: v("pcie_tx_kbs") if c == pynvml.NVML_PCIE_UTIL_TX_BYTES else v("pcie_rx_kbs"))

        def ecc(h, err, scope):
            kind = "sbe" if err == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else "dbe"
            return v(f"ecc_{kind}_{'volatile' if scope == pynvml.NVML_VOLATILE_ECC else 'aggregate'}")

        device("nvmlDeviceGetTotalEccErrors", ecc)
        device("nvmlDeviceGetRemappedRows", lambda h: tuple(v("remapped_rows")))
        device("nvmlDeviceGetMigMode", lambda h: [1, 1] if h.index in self.mig else v("mig_mode"))
        device("nvmlDeviceGetComputeRunningProcesses", lambda h: [SimpleNamespace(pid=4242, usedGpuMemory=1_000_000_000)])
        monkeypatch.setattr(pynvml, "nvmlSystemGetProcessName", lambda pid: "python")
        # GPM (Hopper): supported on the probed H200; values from its measurement under load
        device("nvmlGpmQueryDeviceSupport", lambda h: SimpleNamespace(isSupportedDevice=v("gpm_support")["isSupportedDevice"]))
        device("nvmlGpmSampleGet", lambda h, s: s)
        device("nvmlGpmMigSampleGet", lambda h, gi, s: s)
        monkeypatch.setattr(pynvml, "nvmlGpmSampleAlloc", lambda: pynvml.c_nvmlGpmSample_t())
        monkeypatch.setattr(pynvml, "nvmlGpmSampleFree", lambda s: None)
        gpm = v("gpm_under_load")
        by_id = {
            pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: gpm["gpm_graphics_util"],
            pynvml.NVML_GPM_METRIC_SM_UTIL: gpm["gpm_sm_util"],
            pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: gpm["gpm_sm_occupancy"],
            pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: gpm["gpm_any_tensor_util"],
            pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: gpm["gpm_dram_bw_util"],
        }

        def metrics_get(req):
            for k in range(req.numMetrics):
                req.metrics[k].value = by_id[req.metrics[k].metricId]
                req.metrics[k].nvmlReturn = pynvml.NVML_SUCCESS
            return req

        monkeypatch.setattr(pynvml, "nvmlGpmMetricsGet", metrics_get)
        # XID events
        monkeypatch.setattr(pynvml, "nvmlEventSetCreate", lambda: object())
        monkeypatch.setattr(pynvml, "nvmlDeviceRegisterEvents", lambda h, mask, s: None)
        monkeypatch.setattr(pynvml, "nvmlEventSetFree", lambda s: None)

        def wait(event_set, timeout_ms):
            try:
                gpu, xid = self.xids.get(timeout=timeout_ms / 1000)
            except queue.Empty:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None
            return SimpleNamespace(device=SimpleNamespace(index=gpu), eventData=xid)

        monkeypatch.setattr(pynvml, "nvmlEventSetWait_v2", wait)
