"""ZeRO-3 / FSDP: per-block all-gathers and reduce-scatters, hidden only behind one block's
compute, over rings whose cross-node bandwidth is the node's NICs together (plan/links.py,
plan/speed.py `zero3_exposed_seconds`)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gpulens.cli.main import main
from gpulens.plan import TrainSetup, find_gpu, preset, training_speed
from gpulens.plan.links import ring_bus_bytes_per_second, ring_gather_or_scatter
from gpulens.plan.overlap import hidden_collective_cost_seconds, overlap_compute_slowdown
from gpulens.plan.speed import Efficiency, zero3_exposed_seconds


def test_a_cross_node_ring_uses_every_nic_of_the_node():
    h100 = find_gpu("h100-sxm")
    nvlink = 450e9 * 20.6 / 25  # NVLink 4, one direction, at NCCL's app-level 20.6 of each link's 25 GB/s
    assert ring_bus_bytes_per_second(h100, 8) == pytest.approx(nvlink)
    assert ring_bus_bytes_per_second(h100, 64) == pytest.approx(nvlink)  # 8 x 48 GB/s NICs, over NVLink's 370.8
    assert ring_bus_bytes_per_second(h100, 64, inter_node_bytes_per_second=12.5e9) == pytest.approx(8 * 12e9)
    # Megatron's data-parallel group under TP 8 has one GPU a node: one NIC carries its ring
    assert ring_bus_bytes_per_second(h100, 6, ranks_per_node=1, inter_node_bytes_per_second=25e9) == pytest.approx(24e9)
    assert ring_bus_bytes_per_second(h100, 6, ranks_per_node=8) == pytest.approx(nvlink)  # six GPUs of one node
    # a gather is half an all-reduce: t - 1 steps and (t - 1) / t of the gathered bytes
    g = ring_gather_or_scatter(1e9, 8, h100)
    assert g.transfer_seconds == pytest.approx(7 / 8 * 1e9 / nvlink)
    assert ring_gather_or_scatter(1e9, 1, h100).seconds == 0.0


def test_fsdp_communication_hides_behind_a_block_until_the_block_is_too_short():
    m, h100 = preset("llama-3-8b"), find_gpu("h100-sxm")
    base = TrainSetup("amp_bf16", "adamw", 2, 2048, num_gpus=64, zero_stage=3, zero_layout="fsdp-bf16")
    eff = Efficiency()
    # compute per block dwarfs the block's gathers over 400 GB/s: only the first gather and the last
    # reduce-scatter are exposed (the rest costs only the compute it slows: plan/overlap.py), the
    # same at 16 and 64 GPUs (what llm-foundry's flat MFU shows)
    at16 = training_speed(m, replace(base, num_gpus=16), h100, eff).communication_seconds
    at64 = training_speed(m, base, h100, eff).communication_seconds
    assert 0 < at64 < 0.1 and at64 == pytest.approx(at16, rel=0.25)  # the ring's latency grows with its steps
    # over 100 GbE (12.5 GB/s per GPU) the same blocks cannot hide their collectives
    slow = training_speed(m, replace(base, inter_node_bytes_per_second=12.5e9), h100, eff)
    assert slow.communication_seconds > 4 * at64
    # and a tiny micro-batch exposes them even on InfiniBand
    tiny = zero3_exposed_seconds(m, base, h100, per_micro_seconds=1e-3)
    gather = ring_gather_or_scatter(m.block_params / m.num_layers * 2, 64, h100).seconds
    assert tiny > m.num_layers * gather


def test_without_backward_prefetch_the_backward_collectives_add_to_its_compute():
    """fsdp.rst, "FSDP Prefetch Nuances": with no backward prefetch the reduce-scatter blocks the
    next all-gather on the one NCCL stream, so each block's backward waits for both."""
    m, h100 = preset("llama-3-8b"), find_gpu("h100-sxm")
    base = TrainSetup("amp_bf16", "adamw", 2, 2048, num_gpus=8, zero_stage=3, zero_layout="fsdp-bf16")
    per_micro = 0.4  # long blocks: with a prefetch everything but the first gather and last scatter hides
    block = m.block_params / m.num_layers
    gather = ring_gather_or_scatter(block * 2, 8, h100).seconds
    scatter = ring_gather_or_scatter(block * 4, 8, h100).seconds  # fp32 under amp
    total = m.num_layers * (2 * gather + scatter)
    hidden = zero3_exposed_seconds(m, base, h100, per_micro)
    assert hidden == pytest.approx(gather + scatter + hidden_collective_cost_seconds(total - gather - scatter, h100))
    for prefetch in ("pre", "post"):  # the same order on the NCCL stream: priced alike
        assert zero3_exposed_seconds(m, replace(base, backward_prefetch=prefetch), h100, per_micro) == hidden
    none = zero3_exposed_seconds(m, replace(base, backward_prefetch="none"), h100, per_micro)
    exposed = m.num_layers * (gather + scatter)  # the backward's collectives, every block; the forward's gathers hide
    assert none == pytest.approx(exposed + hidden_collective_cost_seconds(total - exposed, h100))
    # and the step shows it
    eff = Efficiency()
    pre_step = training_speed(m, base, h100, eff).step_seconds
    none_step = training_speed(m, replace(base, backward_prefetch="none"), h100, eff).step_seconds
    assert none_step > pre_step * 1.05


def test_reduce_dtype_sets_the_reduce_scatter_bytes():
    m, h100 = preset("llama-3-8b"), find_gpu("h100-sxm")
    base = TrainSetup("amp_bf16", "adamw", 2, 2048, num_gpus=8, zero_stage=3, zero_layout="fsdp-bf16",
                      backward_prefetch="none")
    block = m.block_params / m.num_layers
    fp32 = zero3_exposed_seconds(m, base, h100, 0.4)
    bf16 = zero3_exposed_seconds(m, replace(base, reduce_dtype="bf16"), h100, 0.4)
    saved = m.num_layers * (ring_gather_or_scatter(block * 4, 8, h100).seconds
                            - ring_gather_or_scatter(block * 2, 8, h100).seconds)
    assert fp32 - bf16 == pytest.approx(saved)  # every reduce-scatter is exposed without a prefetch
    assert zero3_exposed_seconds(m, replace(base, reduce_dtype="fp32"), h100, 0.4) == fp32  # amp's default


@pytest.mark.parametrize("argv, words", [
    (["--zero", "2", "--gpus", "8", "--backward-prefetch", "none"], "--backward-prefetch shapes FSDP"),
    (["--zero", "3", "--reduce-dtype", "bf16"], "--reduce-dtype shapes FSDP"),  # one GPU: nothing to reduce
    (["--zero", "3", "--gpus", "8", "--tp", "2", "--backward-prefetch", "post"], "no --tp, --pp or --cp"),
    (["--zero", "3", "--gpus", "8", "--backward-prefetch", "sometimes"], "Unknown backward prefetch"),
    (["--zero", "3", "--gpus", "8", "--reduce-dtype", "fp16"], "Unknown gradient reduce dtype"),
])
def test_fsdp_collective_options_are_refused_where_they_mean_nothing(capsys, argv, words):
    rc = main(["plan", "--model", "llama-3-8b", *argv])
    out, err = capsys.readouterr()
    assert rc == 2
    assert words in err and "Traceback" not in err + out


def test_the_plan_says_which_prefetch_it_priced(capsys):
    rc = main(["plan", "--model", "llama-3-8b", "--gpus", "8", "--zero", "3", "--batch", "2",
               "--backward-prefetch", "none", "--reduce-dtype", "bf16", "--format", "json"])
    out, _ = capsys.readouterr()
    assert rc == 0
    notes = " ".join(json.loads(out)["notes"])
    assert "Backward prefetch none" in notes and "reduce-scattered in bf16" in notes
    assert "takes 2.00x as long on H100-SXM" in notes  # what hiding costs, said where it is priced


def test_a_hidden_collective_still_slows_the_compute_beside_it():
    """plan/overlap.py: matmuls beside a NCCL kernel take 2x as long on an H100 (PyTorch #143988),
    1.76x on an A100 (NCCL #1428): T hidden seconds add T (1 - 1/s)."""
    h100, a100, l40s = find_gpu("h100-sxm"), find_gpu("a100-80gb"), find_gpu("l40s")
    assert overlap_compute_slowdown(h100) == 2.0
    assert overlap_compute_slowdown(a100) == pytest.approx(2.08 / 1.18)
    assert overlap_compute_slowdown(l40s) == overlap_compute_slowdown(a100)  # no measurement of its own
    assert hidden_collective_cost_seconds(1.0, h100) == pytest.approx(0.5)
    assert hidden_collective_cost_seconds(-1.0, h100) == 0.0
    # ZeRO-2's gradient all-reduce, hidden behind the last backward, now costs half its time on an H100
    m = preset("llama-3-8b")
    z2 = TrainSetup("amp_bf16", "adamw", 8, 2048, num_gpus=8, zero_stage=2)
    comm = training_speed(m, z2, h100, Efficiency()).communication_seconds
    ar = 2 * 7 / 8 * m.params * 4 / (450e9 * 20.6 / 25)  # fp32 gradients over NVLink, hidden (the backward is longer)
    assert comm == pytest.approx(ar / 2, rel=0.05)


def test_llm_foundry_rows_are_planned_with_composers_fsdp_settings():
    """docs/plan-llm-foundry-sources.md: Composer runs BACKWARD_POST; PURE reduce-scatters in bf16,
    DEFAULT in fp32 (from Composer 0.16.4)."""
    from gpulens.plan.published import _request, load_figures

    rows = [f for f in load_figures() if f["source"].get("repo") == "mosaicml/llm-foundry" and f["config"]["gpus"] > 1]
    modes = {f["config"]["mixed_precision"] for f in rows}
    assert modes == {"DEFAULT", "PURE"}
    for f in rows:
        req = _request(f)
        assert req.backward_prefetch == "post"
        assert req.reduce_dtype == {"DEFAULT": "fp32", "PURE": "bf16"}[f["config"]["mixed_precision"]]
