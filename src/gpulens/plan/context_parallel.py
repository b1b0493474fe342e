"""Context parallelism (`--cp N`): the sequence of every micro-batch split over N GPUs, attention
computed as ring attention (Liu, Zaharia, Abbeel 2023, "Ring Attention with Blockwise Transformers
for Near-Infinite Context", section 3), as Megatron-Core runs it (NVIDIA Megatron-Core docs,
"context parallelism"; the kernel is TransformerEngine's AttnFuncWithCP, p2p flavour).

- Layout: GPUs = data x tensor x context x pipeline parallel; Megatron orders its groups
  tp-cp-dp-pp, so a CP group spans t x N neighbouring GPUs (its ring leaves the node once t x N
  exceeds --gpus-per-node). Weights are replicated over CP: gradients are all-reduced (and the
  distributed optimizer sharded) over the data x context-parallel group, as Megatron does
  (its data_parallel_group_with_cp).
- Activations: every tensor a layer saves is per token, so each GPU holds 1/N of them (the local
  K/V shard, its queries, the flash kernel's output and log-sum-exp); the ring's receive buffers
  are transient and not counted.
- Compute: each GPU runs 1/N of the tokens through the matmuls and, with Megatron's load
  balancing (the sequence cut into 2N chunks, GPU i taking chunks i and 2N - 1 - i, hence a
  sequence divisible by 2N), 1/N of the causal attention, in N equal steps.
- Communication per layer: the forward passes the local K/V shard around the ring, N - 1 sends
  of 2 b (s/N) (KV heads / t) d 16-bit values; the backward passes K/V again together with
  their gradients dK/dV, twice the bytes; a recomputed forward (selective or full recomputation)
  passes K/V once more. Each send overlaps the attention step it feeds (the block being computed
  while the next one travels), so what is exposed per step is max(0, send - step compute).
  A send is priced as one step of NCCL's Simple ring (plan/links.py: its per-step latency on
  the link, the bytes at the link's send rate).
- Approximation: the attention kernel is priced at its measured rate for the full sequence
  length, though each step's blocks are s/N long (the rates plateau from 16k tokens on, where
  CP is used; at shorter sequences this flatters CP a little).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpulens.errors import BadInputError
from gpulens.plan.catalog import GpuSpec
from gpulens.plan.links import NCCL_SIMPLE, collective_link
from gpulens.plan.models import ModelSpec

if TYPE_CHECKING:
    from gpulens.plan.memory import TrainSetup


def check_context_parallel(context_parallel: int, seq_len: int) -> None:
    """Refuse a CP degree Megatron-Core would not run (one sentence, exit 2)."""
    n = context_parallel
    if n < 1:
        raise BadInputError(f"--cp must be at least 1, not {n}.", hint="Pass --cp 1 (none) or 2 or more.")
    if n > 1 and seq_len % (2 * n):
        raise BadInputError(f"--seq {seq_len} does not split into 2 x --cp {n} = {2 * n} equal chunks (Megatron's "
                            "load-balanced context parallelism).",
                            hint=f"Pass a --seq that is a multiple of {2 * n}, or another --cp.")


@dataclass(frozen=True)
class RingAttentionCost:
    """One micro-batch on one GPU, all of its stage's layers."""

    transfer_seconds: float  # every K/V (and dK/dV) send of the ring
    exposed_seconds: float  # what the attention steps do not hide
    attention_seconds: float  # the attention core this GPU computes (forward, backward, recomputation)
    send_bytes: float  # one send: the local K/V shard of one layer
    link: str


def ring_attention_cost(m: ModelSpec, setup: TrainSetup, gpu: GpuSpec, attention_seconds: float) -> RingAttentionCost:
    """The ring's sends and what they leave exposed, given the attention core's time for one
    micro-batch on this GPU (forward + backward + any recomputed forward, already 1/N of it)."""
    n, t, p = setup.context_parallel, setup.tensor_parallel, setup.pipeline_parallel
    link = collective_link(gpu, t * n, gpus_per_node=setup.gpus_per_node,
                           inter_node_bytes_per_second=setup.inter_node_bytes_per_second)
    if n <= 1:
        return RingAttentionCost(0.0, 0.0, attention_seconds, 0.0, "")
    kv_heads = max(m.num_kv_heads / t, 1.0)  # TP splits the KV heads (one replicated head at least)
    send = 2 * setup.micro_batch * (setup.seq_len / n) * kv_heads * m.head_dim * 2  # K and V, 16-bit
    step = NCCL_SIMPLE.step_seconds[link.kind] + send / link.nccl_bytes_per_second
    recompute = setup.recompute != "none"
    # plan/kernels.py attention_flops_run: forward 1, backward 2.5, a recomputed forward 1 more
    forwards = 2 if recompute else 1
    layers = m.num_layers / p
    per_layer = attention_seconds / layers
    fwd = per_layer / (3.5 + (1.0 if recompute else 0.0))
    bwd = 2.5 * fwd
    steps = n - 1  # the first step uses the local shard; N - 1 shards arrive
    exposed = steps * (forwards * max(0.0, step - fwd / n) + max(0.0, 2 * step - bwd / n))
    transfer = steps * (forwards + 2) * step
    return RingAttentionCost(transfer * layers, exposed * layers, attention_seconds, send, link.name)
