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
    """device id -> the containers that hold it. The kubelet reports the device plugin's ids: by
    default a GPU UUID "GPU-..." or a MIG device's "MIG-..."; with NVIDIA's device plugin run with
    `--device-id-strategy=index`, the GPU's index "0" and a MIG device's "<gpu index>:<MIG device
    index>" ("0:1"). A device is looked up by both spellings (they cannot collide: an index is digits).

    Several containers hold one device when the device plugin shares GPUs (time-slicing, MPS): each
    gets its own series, as dcgm-exporter does."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_device: dict[str, tuple[ContainerRef, ...]] = {}

    def replace(self, by_device: dict[str, list[ContainerRef]]) -> None:
        with self._lock:
            self._by_device = {d: tuple(sorted(set(refs))) for d, refs in by_device.items() if refs}

    def containers(self, device_id: str, index: str | None = None) -> tuple[ContainerRef, ...]:
        """The holders of the device with this UUID, or else of its index spelling (`index_id`)."""
        with self._lock:
            found = self._by_device.get(device_id, ())
            if not found and index is not None:
                found = self._by_device.get(index, ())
            return found


def index_id(gpu_index: int, mig_index: int | None = None) -> str:
    """A device's id under the device plugin's index strategy: "0" for GPU 0, "0:1" for its MIG device 1."""
    return str(gpu_index) if mig_index is None else f"{gpu_index}:{mig_index}"
