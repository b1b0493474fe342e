"""The link a collective runs over: inside a node the GPUs' own interconnect (NVLink, Infinity
Fabric, PCIe), across nodes the network (InfiniBand or Ethernet), each as the bytes per second
one GPU can send in one direction.

The catalog's `interconnect_gbps` is the datasheets' bidirectional aggregate (H100 NVLink 4:
900 GB/s = 450 GB/s each way; PCIe Gen4 x16: 64 GB/s = 32 each way), so a GPU's send rate is
half of it. Across nodes the default is one 400 Gb/s InfiniBand NDR port per GPU (50 GB/s), as
DGX/HGX H100 systems are built; `--inter-node-gbps` overrides it (100 GbE: 12.5).

A collective costs alpha + beta (Hockney's model) as NCCL's own tuner prices it (NVIDIA/nccl
src/graph/tuning.cc at b6475625, the table NCCL 2.18 and later ship): a ring all-reduce over t
GPUs takes 2 (t - 1) steps; each step pays the link's latency (LL protocol: NVLink 0.6 us, PCIe
1.0, the network 2.7; Simple: 3.4 / 5.7 / 14.0), on top of a base latency (LL 6.6 us, Simple 8.4).
Once the ring leaves the node every intra-node step costs at least the network post overhead
(1 us; 3 us with Simple). Each GPU sends 2 (t - 1) / t of the message over the ring's slowest link
(LL reaches half of its bandwidth, Simple all of it). NCCL picks the faster protocol for the size;
so does `ring_all_reduce`. InfiniBand, RoCE and Ethernet are the same "network" to NCCL's tuner:
only the send rate differs.

What NCCL moves is less than the line rate (`Link.nccl_bytes_per_second`). NVLink: NCCL's topology
prices each link at its app-level rate, 20.0 GB/s on Volta and Ampere and 20.6 on Hopper of a
25 GB/s line (src/graph/topo.h at b6475625, `SM70/SM80/SM90_NVLINK_BW`; 40.1 of 50 on Blackwell at
v2.30.7), "with the protocol overhead (~20%)" (sjeaugey, NVIDIA/nccl-tests#212: 8 H100s reach a ring
bus bandwidth of 370 GB/s of 450; nccl-tests#149: 8 A100s about 230 of 300; NVIDIA/nccl#1054:
"roughly, the app-level bandwidth is 80% of the peak bandwidth", the share taken for other NVLink
cards). PCIe: `width*speed/80` in topo.cc, 24 GB/s for a Gen4 x16 of 32 (75 %). The network: NCCL
prices a NIC at its line rate, and measured 24 GB/s per 200 Gb/s HDR NIC ("we usually consider
24GB/s is the peak performance per 200G NIC", sjeaugey, nccl-tests#119), 192 GB/s all-reduce bus
bandwidth on DGX A100's 8 of them (AddyLaddy, NVIDIA/nccl#812), 48-49 per 400 Gb/s NDR NIC
(nccl-tests#267): 96 %. Infinity Fabric (RCCL): no published figure, so its line rate.
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


# NCCL src/graph/tuning.cc at b6475625fbcaa2c3c0e50eed2fa1255d7514d4a2 (ring rows of baseLat and
# hwLat; the same at ab2b89c4, 2.21.5-1, where ring LL's bus bandwidth became half the link's,
# `busBw * .5`: a quarter for an all-reduce before it): the table since NVLS Tree came
# in (NCCL 2.18, the one PyTorch 2.1+ bundles). NCCL 2.17 and earlier had LL 3.6 us base and 0.47 us
# per NVLink step, which made an 8-GPU all-reduce of a decode step's activations 10 us, not 15.
NCCL_LL = Protocol("LL", 6.6e-6, {"nvlink": 0.6e-6, "pcie": 1.0e-6, "network": 2.7e-6}, 0.5)
NCCL_SIMPLE = Protocol("Simple", 8.4e-6, {"nvlink": 3.4e-6, "pcie": 5.7e-6, "network": 14.0e-6}, 1.0)
NCCL_PROTOCOLS = (NCCL_LL, NCCL_SIMPLE)
# tuning.cc: once a ring leaves the node, each intra-node step costs at least the network post
# overhead (getNetOverhead: 1 us on x86, x3 with Simple)
NET_OVERHEAD_SECONDS = {"LL": 1.0e-6, "Simple": 3.0e-6}
SIMPLE_MULTI_NODE_PLATEAU = 1.4  # ncclTopoGetAlgoTime: a multi-node Simple ring's latency plateau (1.9 before sm80)


# The share of a link's line rate NCCL moves (module docstring)
NVLINK_NCCL_SHARE = {"volta": 20.0 / 25, "ampere": 20.0 / 25, "hopper": 20.6 / 25, "blackwell": 40.1 / 50}
NVLINK_NCCL_SHARE_DEFAULT = 0.80  # NVIDIA/nccl#1054: "roughly ... 80% of the peak bandwidth"
PCIE_NCCL_SHARE = 24.0 / 32  # topo.cc width*speed/80: Gen4 x16 = 24 GB/s (Gen3 12 of 16, Gen5 48 of 64)
NETWORK_NCCL_SHARE = 0.96  # 24 GB/s per 200 Gb/s NIC, 192 of 200 on DGX A100, 48 of 50 per NDR NIC


@dataclass(frozen=True)
class Link:
    bytes_per_second: float  # per GPU, one direction, the line rate
    name: str
    kind: str = "nvlink"  # nvlink | pcie | network: which latency row of NCCL's tuner applies
    nccl_share: float = 1.0  # of the line rate, what NCCL's kernels move over it

    @property
    def gbps(self) -> float:
        return self.bytes_per_second / 1e9

    @property
    def nccl_bytes_per_second(self) -> float:
        return self.bytes_per_second * self.nccl_share


def network_link(bytes_per_second: float) -> Link:
    return Link(bytes_per_second, f"inter-node network ({bytes_per_second / 1e9:g} GB/s per GPU)", "network",
                NETWORK_NCCL_SHARE)


def intra_node_link(gpu: GpuSpec) -> Link:
    if gpu.interconnect_bytes_per_second:
        name = gpu.interconnect or "interconnect"
        kind = "pcie" if "pcie" in name.lower() else "nvlink"  # NVLink, NVSwitch, Infinity Fabric
        if kind == "pcie":
            share = PCIE_NCCL_SHARE
        elif "nvlink" in name.lower():
            share = NVLINK_NCCL_SHARE.get(gpu.architecture, NVLINK_NCCL_SHARE_DEFAULT)
        else:
            share = 1.0  # Infinity Fabric: no published RCCL figure
        return Link(gpu.interconnect_bytes_per_second / 2, f"{name} (one direction)", kind, share)
    return Link(PCIE_FALLBACK_BYTES_PER_SECOND, "PCIe (no published figure)", "pcie", PCIE_NCCL_SHARE)


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
        return network_link(inter_node_bytes_per_second)
    return intra


def _ring_latency(proto: Protocol, steps: int, inter_steps: int, intra_kind: str, nodes: int) -> float:
    """tuning.cc's ring latency: base + intra-node steps x the intra link's latency (at least the
    network post overhead once the ring spans nodes) + inter-node steps x the network's."""
    intra_step = proto.step_seconds[intra_kind]
    if nodes > 1:
        intra_step = max(intra_step, NET_OVERHEAD_SECONDS[proto.name])
    return proto.base_seconds + (steps - inter_steps) * intra_step + inter_steps * proto.step_seconds["network"]


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
                    inter_node_bytes_per_second: float = DEFAULT_INTER_NODE_BYTES_PER_SECOND,
                    ranks_per_node: int | None = None) -> AllReduceCost:
    """A ring all-reduce of `message_bytes` per GPU over `group` GPUs, with the faster NCCL protocol:
    2 (t - 1) steps, 2 (nodes - 1) of them over the network, each GPU sending 2 (t - 1) / t of the
    message at the ring's bus bandwidth (`ring_bus_bytes_per_second`; `ranks_per_node`: how many of
    the group's GPUs share a node, all of the node's by default). `nodes`: the nodes the group spans."""
    link = collective_link(gpu, group, gpus_per_node=gpus_per_node, inter_node_bytes_per_second=inter_node_bytes_per_second)
    if group <= 1:
        return AllReduceCost(0.0, 0.0, 0.0, "", link, 1)
    nodes = _group_nodes(group, gpus_per_node, ranks_per_node)
    if nodes > 1:
        link = collective_link(gpu, gpus_per_node + 1, gpus_per_node=gpus_per_node,
                               inter_node_bytes_per_second=inter_node_bytes_per_second)
    steps, inter_steps = 2 * (group - 1), 2 * (nodes - 1)
    bus = ring_bus_bytes_per_second(gpu, group, gpus_per_node=gpus_per_node,
                                    inter_node_bytes_per_second=inter_node_bytes_per_second, ranks_per_node=ranks_per_node)
    intra_kind = intra_node_link(gpu).kind
    best: AllReduceCost | None = None
    for proto in NCCL_PROTOCOLS:
        latency = _ring_latency(proto, steps, inter_steps, intra_kind, nodes)
        if proto is NCCL_SIMPLE and nodes > 1 and message_bytes >= group / 16 * 65536:
            latency *= SIMPLE_MULTI_NODE_PLATEAU
        transfer = 2 * (group - 1) / group * message_bytes / (bus * proto.bandwidth_share)
        cost = AllReduceCost(latency + transfer, latency, transfer, proto.name, link, nodes)
        if best is None or cost.seconds < best.seconds:
            best = cost
    assert best is not None
    return best


def _group_nodes(group: int, gpus_per_node: int, ranks_per_node: int | None) -> int:
    per_node = min(group, gpus_per_node if ranks_per_node is None else max(1, ranks_per_node))
    return -(-group // per_node)


def ring_bus_bytes_per_second(gpu: GpuSpec, group: int, *, gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
                              inter_node_bytes_per_second: float = DEFAULT_INTER_NODE_BYTES_PER_SECOND,
                              ranks_per_node: int | None = None) -> float:
    """What one rank of a ring moves per second, as NCCL's kernels move it (`nccl_share`). Inside a
    node: its interconnect. Across nodes, NCCL builds one ring (channel) per NIC, and a
    rail-optimized node has one NIC per GPU, so each ring carries 1/NICs of the data through its own
    NIC: a rank's bus bandwidth is its node's group members' NICs together (`nChannels * bwInter`
    in NCCL's tuning.cc), never above its own interconnect (DGX A100: 8 x 200 Gb/s HDR, 192 GB/s
    all-reduce bus bandwidth, AddyLaddy in NVIDIA/nccl#812). `ranks_per_node`: how many of the
    group's GPUs share a node (Megatron's data-parallel group with TP 8 has one on each node)."""
    intra = intra_node_link(gpu)
    if _group_nodes(group, gpus_per_node, ranks_per_node) <= 1:
        return intra.nccl_bytes_per_second
    net = collective_link(gpu, gpus_per_node + 1, gpus_per_node=gpus_per_node,
                          inter_node_bytes_per_second=inter_node_bytes_per_second)
    if net.kind != "network":
        return intra.nccl_bytes_per_second
    rails = min(gpus_per_node if ranks_per_node is None else max(1, ranks_per_node), group)
    return min(intra.nccl_bytes_per_second, net.nccl_bytes_per_second * rails)


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
        latency = _ring_latency(proto, steps, inter_steps, intra_kind, nodes)
        transfer = (group - 1) / group * full_bytes / (bus * proto.bandwidth_share)
        cost = AllReduceCost(latency + transfer, latency, transfer, proto.name, link, nodes)
        if best is None or cost.seconds < best.seconds:
            best = cost
    assert best is not None
    return best


# What one NCCL communicator keeps on each of its GPUs, outside PyTorch's allocator: NVIDIA/nccl
# issue #964 (2023-08-16), PyTorch on 4 A100s with NVLink, one 4 MB all-reduce on each new process
# group: 544 MB per GPU for a group of 2, 688 MB for a group of 3 or 4 (taken here as MiB). NCCL
# (2.18, what PyTorch 2.1 bundles) connects every channel's ring and tree at init, each connection
# with an LL, an LL128 and a Simple FIFO (NCCL_BUFFSIZE, 4 MiB by default), so the memory grows with
# the channels (sjeaugey in NVIDIA/nccl issue #864, quoted in #986) and each communicator has its
# own unless it was made by ncclCommSplit with shared resources, which PyTorch 2.1 does not do.
# Measured on A100 NVLink only: other links and GPUs (more channels on H100, NVLS buffers) are
# priced the same, for want of a measurement.
NCCL_COMMUNICATOR_BYTES = {2: 544 << 20, 3: 688 << 20}


def nccl_communicator_bytes(group: int) -> int:
    """GPU memory one NCCL communicator over `group` ranks holds on each rank (0 for one rank:
    PyTorch never creates one for a group it runs no collective on)."""
    if group <= 1:
        return 0
    return NCCL_COMMUNICATOR_BYTES[min(group, 3)]


def all_to_all(buffer_bytes: float, group: int, gpu: GpuSpec, *, gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
               inter_node_bytes_per_second: float = DEFAULT_INTER_NODE_BYTES_PER_SECOND) -> AllReduceCost:
    """An all-to-all of `buffer_bytes` per GPU over `group` GPUs placed on consecutive ranks (whole
    nodes of `gpus_per_node`, as Megatron-Core and DeepSpeed lay out expert-parallel groups).

    NCCL has no all-to-all kernel: it is one ncclSend and one ncclRecv per peer inside a
    ncclGroupStart/End (NCCL user guide, "Point-to-point communication", the all-to-all example;
    PyTorch's all_to_all_single on NCCL runs exactly that). Each GPU keeps 1/t of its buffer and
    sends (t - 1)/t of it: the share for peers on its node over the node's interconnect, the share
    for peers on other nodes over the network, both at once, so the transfer takes the slower of
    the two. Alpha: the sends run concurrently, so one Simple-protocol launch (NCCL's point-to-point
    protocol for large messages) and one step over the slowest link used (tuning.cc's latencies)."""
    intra = intra_node_link(gpu)
    if group <= 1:
        return AllReduceCost(0.0, 0.0, 0.0, "", intra, 1)
    if inter_node_bytes_per_second <= 0:
        raise BadInputError("The inter-node link must be faster than 0 GB/s.", hint="Pass --inter-node-gbps 50, say.")
    nodes = nodes_for(group, gpus_per_node)
    local = min(group, gpus_per_node)
    net = network_link(inter_node_bytes_per_second)
    intra_seconds = (local - 1) / group * buffer_bytes / intra.nccl_bytes_per_second
    inter_seconds = (group - local) / group * buffer_bytes / net.nccl_bytes_per_second
    link = net if inter_seconds > intra_seconds else intra
    kind = "network" if nodes > 1 else intra.kind
    latency = NCCL_SIMPLE.base_seconds + NCCL_SIMPLE.step_seconds[kind]
    transfer = max(intra_seconds, inter_seconds)
    return AllReduceCost(latency + transfer, latency, transfer, NCCL_SIMPLE.name, link, nodes)
