"""ZeRO-3 / FSDP: per-block all-gathers and reduce-scatters, hidden only behind one block's
compute, over rings whose cross-node bandwidth is the node's NICs together (plan/links.py,
plan/speed.py `zero3_exposed_seconds`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpulens.plan import TrainSetup, find_gpu, preset, training_speed
from gpulens.plan.links import ring_bus_bytes_per_second, ring_gather_or_scatter
from gpulens.plan.speed import Efficiency, zero3_exposed_seconds


def test_a_cross_node_ring_uses_every_nic_of_the_node():
    h100 = find_gpu("h100-sxm")
    assert ring_bus_bytes_per_second(h100, 8) == 450e9  # NVLink, one direction
    assert ring_bus_bytes_per_second(h100, 64) == 400e9  # 8 x 50 GB/s NICs, under NVLink's 450
    assert ring_bus_bytes_per_second(h100, 64, inter_node_bytes_per_second=12.5e9) == 100e9
    # a gather is half an all-reduce: t - 1 steps and (t - 1) / t of the gathered bytes
    g = ring_gather_or_scatter(1e9, 8, h100)
    assert g.transfer_seconds == pytest.approx(7 / 8 * 1e9 / 450e9)
    assert ring_gather_or_scatter(1e9, 1, h100).seconds == 0.0


def test_fsdp_communication_hides_behind_a_block_until_the_block_is_too_short():
    m, h100 = preset("llama-3-8b"), find_gpu("h100-sxm")
    base = TrainSetup("amp_bf16", "adamw", 2, 2048, num_gpus=64, zero_stage=3, zero_layout="fsdp-bf16")
    eff = Efficiency()
    # compute per block dwarfs the block's gathers over 400 GB/s: only the first gather and the last
    # reduce-scatter are exposed, the same at 16 and 64 GPUs (what llm-foundry's flat MFU shows)
    at16 = training_speed(m, replace(base, num_gpus=16), h100, eff).communication_seconds
    at64 = training_speed(m, base, h100, eff).communication_seconds
    assert 0 < at64 < 0.02 and at64 == pytest.approx(at16, rel=0.2)
    # over 100 GbE (12.5 GB/s per GPU) the same blocks cannot hide their collectives
    slow = training_speed(m, replace(base, inter_node_bytes_per_second=12.5e9), h100, eff)
    assert slow.communication_seconds > 10 * at64
    # and a tiny micro-batch exposes them even on InfiniBand
    tiny = zero3_exposed_seconds(m, base, h100, per_micro_seconds=1e-3)
    gather = ring_gather_or_scatter(m.block_params / m.num_layers * 2, 64, h100).seconds
    assert tiny > m.num_layers * gather
