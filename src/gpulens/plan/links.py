"""The link a collective runs over: inside a node the GPUs' own interconnect (NVLink, Infinity
Fabric, PCIe), across nodes the network (InfiniBand or Ethernet), each as the bytes per second
one GPU can send in one direction.

The catalog's `interconnect_gbps` is the datasheets' bidirectional aggregate (H100 NVLink 4:
900 GB/s = 450 GB/s each way; PCIe Gen4 x16: 64 GB/s = 32 each way), so a GPU's send rate is
half of it. Across nodes the default is one 400 Gb/s InfiniBand NDR port per GPU (50 GB/s), as
DGX/HGX H100 systems are built; `--inter-node-gbps` overrides it (100 GbE: 12.5).

A collective costs alpha + beta (Hockney's model) as NCCL's own tuner prices it (NVIDIA/nccl
src/graph/tuning.cc): a ring all-reduce over t GPUs takes 2 (t - 1) steps; each step pays the
link's latency (NVLink 0.47 us, PCIe 1.0, the network 2.7 with the LL protocol; 3.4 / 5.7 / 9.6
with Simple), on top of a base latency (LL 3.6 us, Simple 8.4), and each GPU sends
2 (t - 1) / t of the message over the ring's slowest link (LL reaches a quarter of its bandwidth,
Simple all of it). NCCL picks the faster protocol for the size; so does `ring_all_reduce_seconds`.
InfiniBand, RoCE and Ethernet are the same "network" to NCCL's tuner: only the send rate differs.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulens.errors import BadInputError
from gpulens.plan.catalog import GpuSpec

DEFAULT_GPUS_PER_NODE = 8
DEFAULT_INTER_NODE_BYTES_PER_SECOND = 50e9  # 400 Gb/s InfiniBand NDR per GPU
PCIE_FALLBACK_BYTES_PER_SECOND = 16e9  # a card with no published link figure: PCIe Gen3 x16 each way


@dataclass(frozen=True)
class Protocol:
    """One NCCL protocol's cost terms (tuning.cc's baseLat, hwLat and bus-bandwidth share)."""

    name: str
    base_seconds: float
    step_seconds: dict[str, float]  # latency per ring step by link kind: nvlink, pcie, network
    bandwidth_share: float  # of the link's send rate the protocol reaches


# NCCL src/graph/tuning.cc (ring rows of baseLat and hwLat; LL's bus bandwidth is 1/4 of the link)
NCCL_LL = Protocol("LL", 3.6e-6, {"nvlink": 0.47e-6, "pcie": 1.0e-6, "network": 2.7e-6}, 0.25)
NCCL_SIMPLE = Protocol("Simple", 8.4e-6, {"nvlink": 3.4e-6, "pcie": 5.7e-6, "network": 9.6e-6}, 1.0)
NCCL_PROTOCOLS = (NCCL_LL, NCCL_SIMPLE)
LL_INTRA_STEP_SLOWDOWN = 1.8  # tuning.cc: LL's intra-node steps are 1.8x slower once the ring leaves the node
SIMPLE_MULTI_NODE_PLATEAU = 1.9  # tuning.cc: a multi-node Simple ring's latency plateau on large messages


@dataclass(frozen=True)
class Link:
    bytes_per_second: float  # per GPU, one direction
    name: str
    kind: str = "nvlink"  # nvlink | pcie | network: which latency row of NCCL's tuner applies

    @property
    def gbps(self) -> float:
        return self.bytes_per_second / 1e9


def intra_node_link(gpu: GpuSpec) -> Link:
    if gpu.interconnect_bytes_per_second:
        kind = "pcie" if "pcie" in gpu.interconnect.lower() else "nvlink"  # NVLink, NVSwitch, Infinity Fabric
        return Link(gpu.interconnect_bytes_per_second / 2, f"{gpu.interconnect or 'interconnect'} (one direction)", kind)
    return Link(PCIE_FALLBACK_BYTES_PER_SECOND, "PCIe (no published figure)", "pcie")


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
        return Link(inter_node_bytes_per_second, f"inter-node network ({inter_node_bytes_per_second / 1e9:g} GB/s per GPU)",
                    "network")
    return intra


@dataclass(frozen=True)
class AllReduceCost:
    """One ring all-reduce: its latency (alpha) and bandwidth (beta) terms, and what priced them."""

    seconds: float
    latency_seconds: float
    transfer_seconds: float
    protocol: str
    link: Link
    nodes: int


def ring_all_reduce(message_bytes: float, group: int, gpu: GpuSpec, *, gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
                    inter_node_bytes_per_second: float = DEFAULT_INTER_NODE_BYTES_PER_SECOND) -> AllReduceCost:
    """A ring all-reduce of `message_bytes` per GPU over `group` GPUs, with the faster NCCL protocol:
    2 (t - 1) steps, 2 (nodes - 1) of them over the network, each GPU sending 2 (t - 1) / t of the
    message over the ring's slowest link."""
    link = collective_link(gpu, group, gpus_per_node=gpus_per_node, inter_node_bytes_per_second=inter_node_bytes_per_second)
    if group <= 1:
        return AllReduceCost(0.0, 0.0, 0.0, "", link, 1)
    nodes = nodes_for(group, gpus_per_node)
    steps, inter_steps = 2 * (group - 1), 2 * (nodes - 1)
    intra_kind = intra_node_link(gpu).kind
    best: AllReduceCost | None = None
    for proto in NCCL_PROTOCOLS:
        intra_step = proto.step_seconds[intra_kind] * (LL_INTRA_STEP_SLOWDOWN if nodes > 1 and proto is NCCL_LL else 1.0)
        latency = proto.base_seconds + (steps - inter_steps) * intra_step + inter_steps * proto.step_seconds["network"]
        if proto is NCCL_SIMPLE and nodes > 1 and message_bytes >= group / 16 * 65536:
            latency *= SIMPLE_MULTI_NODE_PLATEAU
        transfer = 2 * (group - 1) / group * message_bytes / (link.bytes_per_second * proto.bandwidth_share)
        cost = AllReduceCost(latency + transfer, latency, transfer, proto.name, link, nodes)
        if best is None or cost.seconds < best.seconds:
            best = cost
    assert best is not None
    return best


def ring_bus_bytes_per_second(gpu: GpuSpec, group: int, *, gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
                              inter_node_bytes_per_second: float = DEFAULT_INTER_NODE_BYTES_PER_SECOND) -> float:
    """What one rank of a data-parallel ring moves per second. Inside a node: its interconnect.
    Across nodes, NCCL builds one ring (channel) per NIC, and a rail-optimized node has one NIC
    per GPU, so each ring carries 1/NICs of the data through its own NIC: a rank's bus bandwidth
    is the node's NICs together (`nChannels * bwInter` in NCCL's tuning.cc), never above its own
    interconnect (DGX A100: 8 x 25 GB/s HDR, 185-190 GB/s all-reduce bus bandwidth in nccl-tests)."""
    link = collective_link(gpu, group, gpus_per_node=gpus_per_node, inter_node_bytes_per_second=inter_node_bytes_per_second)
    if link.kind != "network":
        return link.bytes_per_second
    rails = min(gpus_per_node, group)
    return min(intra_node_link(gpu).bytes_per_second, link.bytes_per_second * rails)


def ring_gather_or_scatter(full_bytes: float, group: int, gpu: GpuSpec, *, gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
                           inter_node_bytes_per_second: float = DEFAULT_INTER_NODE_BYTES_PER_SECOND) -> AllReduceCost:
    """A ring all-gather (or reduce-scatter: the same steps and bytes) whose gathered result is
    `full_bytes`: t - 1 steps, nodes - 1 of them over the network, each rank sending (t - 1) / t of
    `full_bytes` at its ring bus bandwidth (`ring_bus_bytes_per_second`), the faster NCCL protocol
    for the size; half an all-reduce's steps and bytes, as NCCL's tuner counts them."""
    link = collective_link(gpu, group, gpus_per_node=gpus_per_node, inter_node_bytes_per_second=inter_node_bytes_per_second)
    if group <= 1:
        return AllReduceCost(0.0, 0.0, 0.0, "", link, 1)
    nodes = nodes_for(group, gpus_per_node)
    steps, inter_steps = group - 1, nodes - 1
    bus = ring_bus_bytes_per_second(gpu, group, gpus_per_node=gpus_per_node,
                                    inter_node_bytes_per_second=inter_node_bytes_per_second)
    intra_kind = intra_node_link(gpu).kind
    best: AllReduceCost | None = None
    for proto in NCCL_PROTOCOLS:
        intra_step = proto.step_seconds[intra_kind] * (LL_INTRA_STEP_SLOWDOWN if nodes > 1 and proto is NCCL_LL else 1.0)
        latency = proto.base_seconds + (steps - inter_steps) * intra_step + inter_steps * proto.step_seconds["network"]
        transfer = (group - 1) / group * full_bytes / (bus * proto.bandwidth_share)
        cost = AllReduceCost(latency + transfer, latency, transfer, proto.name, link, nodes)
        if best is None or cost.seconds < best.seconds:
            best = cost
    assert best is not None
    return best
