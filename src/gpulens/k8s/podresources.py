"""The kubelet's pod-resources API (gRPC on a unix socket, as dcgm-exporter and the NVIDIA device
plugin read it): which container holds which GPU. Needs grpcio (`pip install gpulens[k8s]`).

The reply is decoded by `wire.py` (no generated code); the call is the plain unary method
`/v1.PodResourcesLister/List` of podresources_v1.proto."""

from __future__ import annotations

import logging
from typing import Any

from gpulens.errors import BackendUnavailableError
from gpulens.k8s.attribution import ContainerRef, DeviceAttribution
from gpulens.k8s.wire import decode_list_response

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
# Resource names of NVIDIA's device plugin: whole GPUs and, with the "mixed" MIG strategy, MIG devices
# (nvidia.com/mig-1g.10gb); their device ids are GPU / MIG UUIDs.
GPU_RESOURCE_PREFIX = "nvidia.com/"


class PodResourcesClient:
    """Asks the kubelet which containers hold which NVIDIA devices."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, *, timeout_seconds: float = 5.0):
        try:
            import grpc
        except ImportError:
            raise BackendUnavailableError(
                "Pod attribution needs grpcio, which is not installed.", hint="Install it with pip install 'gpulens[k8s]'."
            ) from None
        self.socket_path = socket_path
        self.timeout_seconds = timeout_seconds
        self._grpc = grpc
        target = socket_path if socket_path.startswith("unix:") else f"unix://{socket_path}"
        self._channel = grpc.insecure_channel(target)
        self._list = self._channel.unary_unary(LIST_METHOD, request_serializer=lambda _: b"", response_deserializer=lambda b: b)

    def list_devices(self) -> dict[str, list[ContainerRef]]:
        """device id -> the containers it is assigned to, for NVIDIA devices only."""
        try:
            reply: bytes = self._list(None, timeout=self.timeout_seconds)
        except self._grpc.RpcError as e:
            code = e.code().name if hasattr(e, "code") else "UNKNOWN"
            raise BackendUnavailableError(
                f"The kubelet's pod-resources API at {self.socket_path} did not answer ({code}).",
                hint="Mount /var/lib/kubelet/pod-resources into the agent's pod (the DaemonSet in deploy/ does) "
                     "or drop --pod-resources.",
            ) from None
        out: dict[str, list[ContainerRef]] = {}
        for namespace, pod, container, resource, ids in decode_list_response(reply):
            if not resource.startswith(GPU_RESOURCE_PREFIX):
                continue
            for device in ids:
                out.setdefault(device, []).append(ContainerRef(namespace=namespace, pod=pod, container=container))
        return out

    def close(self) -> None:
        self._channel.close()


class PodResourcesPoller:
    """Refreshes a `DeviceAttribution` from the kubelet. A failed refresh keeps the last answer and
    is logged once until the kubelet answers again (pods rarely move; a scrape should not fail)."""

    def __init__(self, client: Any, attribution: DeviceAttribution):
        self.client = client
        self.attribution = attribution
        self._failing = False

    def refresh(self) -> bool:
        try:
            by_device = self.client.list_devices()
        except BackendUnavailableError as e:
            if not self._failing:
                log.warning("%s Pod labels keep their last values.", e.message)
            self._failing = True
            return False
        if self._failing:
            log.info("The kubelet's pod-resources API answers again.")
        self._failing = False
        self.attribution.replace(by_device)
        return True

    def close(self) -> None:
        self.client.close()
