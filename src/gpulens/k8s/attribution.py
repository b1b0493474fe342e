"""Which containers hold which GPU device, as the kubelet last said: the map the exporter reads at each
scrape to add `pod` / `namespace` / `container` labels, written by the pod-resources poller."""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class ContainerRef:
    """One container of one pod (the labels dcgm-exporter adds: pod, namespace, container)."""

    namespace: str
    pod: str
    container: str

    def labels(self) -> dict[str, str]:
        return {"pod": self.pod, "namespace": self.namespace, "container": self.container}


POD_LABELS = ("pod", "namespace", "container")


class DeviceAttribution:
    """device id (a GPU UUID "GPU-...", or a MIG device's "MIG-...") -> the containers that hold it.

    Several containers hold one device when the device plugin shares GPUs (time-slicing, MPS): each
    gets its own series, as dcgm-exporter does."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_device: dict[str, tuple[ContainerRef, ...]] = {}

    def replace(self, by_device: dict[str, list[ContainerRef]]) -> None:
        with self._lock:
            self._by_device = {d: tuple(sorted(set(refs))) for d, refs in by_device.items() if refs}

    def containers(self, device_id: str) -> tuple[ContainerRef, ...]:
        with self._lock:
            return self._by_device.get(device_id, ())
