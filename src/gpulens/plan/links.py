"""The link a collective runs over: inside a node the GPUs' own interconnect (NVLink, Infinity
Fabric, PCIe), across nodes the network (InfiniBand or Ethernet), each as the bytes per second
one GPU can send in one direction.

The catalog's `interconnect_gbps` is the datasheets' bidirectional aggregate (H100 NVLink 4:
900 GB/s = 450 GB/s each way; PCIe Gen4 x16: 64 GB/s = 32 each way), so a GPU's send rate is
half of it. Across nodes the default is one 400 Gb/s InfiniBand NDR port per GPU (50 GB/s), as
DGX/HGX H100 systems are built; `--inter-node-gbps` overrides it (100 GbE: 12.5).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulens.errors import BadInputError
from gpulens.plan.catalog import GpuSpec

DEFAULT_GPUS_PER_NODE = 8
DEFAULT_INTER_NODE_BYTES_PER_SECOND = 50e9  # 400 Gb/s InfiniBand NDR per GPU
PCIE_FALLBACK_BYTES_PER_SECOND = 16e9  # a card with no published link figure: PCIe Gen3 x16 each way


@dataclass(frozen=True)
class Link:
    bytes_per_second: float  # per GPU, one direction
    name: str

    @property
    def gbps(self) -> float:
        return self.bytes_per_second / 1e9


def intra_node_link(gpu: GpuSpec) -> Link:
    if gpu.interconnect_bytes_per_second:
        return Link(gpu.interconnect_bytes_per_second / 2, f"{gpu.interconnect or 'interconnect'} (one direction)")
    return Link(PCIE_FALLBACK_BYTES_PER_SECOND, "PCIe (no published figure)")


def nodes_for(gpus: int, gpus_per_node: int) -> int:
    if gpus_per_node < 1:
        raise BadInputError(f"GPUs per node must be at least 1, not {gpus_per_node}.", hint="Pass --gpus-per-node 8, say.")
    return -(-gpus // gpus_per_node)


def collective_link(gpu: GpuSpec, group: int, *, gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
                    inter_node_bytes_per_second: float = DEFAULT_INTER_NODE_BYTES_PER_SECOND) -> Link:
    """The bottleneck link of a ring over `group` GPUs: the node's interconnect when the group
    fits in one node, else the slower of it and the network."""
    intra = intra_node_link(gpu)
    if group <= gpus_per_node:
        return intra
    if inter_node_bytes_per_second <= 0:
        raise BadInputError("The inter-node link must be faster than 0 GB/s.", hint="Pass --inter-node-gbps 50, say.")
    if inter_node_bytes_per_second < intra.bytes_per_second:
        return Link(inter_node_bytes_per_second, f"inter-node network ({inter_node_bytes_per_second / 1e9:g} GB/s per GPU)")
    return intra
