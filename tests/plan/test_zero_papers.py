"""ZeRO sharding checked against its sources: ZeRO paper Table 1 (Rajbhandari et al. 2020) and
DeepSpeed's own estimators (deepspeed/runtime/zero/stage_1_and_2.py and stage3.py, written out
below from their published source)."""

from __future__ import annotations

import pytest

from gpulens.plan import TrainSetup, preset, training_memory
from gpulens.plan.zero import largest_module_params, zero_states

GB = 1e9

# ZeRO paper Table 1: per-device model-state memory (GB) of a 7.5 B-parameter model with
# mixed-precision Adam (K = 12), by data-parallel degree N_d: baseline, P_os, P_os+g, P_os+g+p.
TABLE_1 = {
    1: (120, 120, 120, 120),
    4: (120, 52.5, 41.3, 30),
    16: (120, 35.6, 21.6, 7.5),
    64: (120, 31.4, 16.6, 1.88),
    256: (120, 30.4, 15.4, 0.47),
    1024: (120, 30.1, 15.1, 0.12),
}


@pytest.mark.parametrize("n_d", sorted(TABLE_1))
def test_deepspeed_layout_reproduces_zero_table_1(n_d):
    for stage, paper_gb in enumerate(TABLE_1[n_d]):
        # Adam's own states (two fp32 moments) = 8 bytes; the fp32 master copy makes K = 12
        z = zero_states(7.5e9, stage=stage, gpus=n_d, layout="deepspeed", weight_bytes=4,
                        state_bytes_per_param=8, amp=True)
        assert z.persistent_bytes / GB == pytest.approx(paper_gb, rel=0.03), (n_d, stage)


def test_fsdp_layout_keeps_fp32_weights_unsharded_below_stage_3():
    z = zero_states(7.5e9, stage=1, gpus=64, layout="fsdp", weight_bytes=4, state_bytes_per_param=8, amp=True)
    assert z.weights == 4 * 7.5e9 and z.gradients == 4 * 7.5e9  # PyTorch: the module is the fp32 master
    assert z.persistent_bytes / GB == pytest.approx(60 + 60 / 64)


def ds_estimate_zero2_gpu(total_params: float, num_gpus_per_node: int, num_nodes: int) -> int:
    """estimate_zero2_model_states_mem_needs(..., cpu_offload=False): its GPU figure."""
    total_gpus = num_nodes * num_gpus_per_node
    return int(4 * total_params + int(16 * total_params / total_gpus))


def ds_estimate_zero3_gpu(total_params: float, largest_layer_params: float, num_gpus_per_node: int,
                          num_nodes: int) -> int:
    """estimate_zero3_model_states_mem_needs(..., cpu_offload=False): its GPU figure."""
    total_gpus = num_nodes * num_gpus_per_node
    largest_layer_memory = 4 * largest_layer_params
    return int(largest_layer_memory + int(18 * total_params / total_gpus))


CASES = [("llama-2-7b", 8, 1), ("llama-3-8b", 8, 8)]  # 8 GPUs on one node; 64 GPUs on 8 nodes


def _states(model: str, stage: int, gpus: int):
    m = preset(model)
    return m, zero_states(m.params, stage=stage, gpus=gpus, layout="deepspeed", weight_bytes=4,
                          state_bytes_per_param=8, amp=True, largest_module_params=largest_module_params(m))


@pytest.mark.parametrize("model,per_node,nodes", CASES)
def test_deepspeed_zero3_estimator(model, per_node, nodes):
    m, z = _states(model, 3, per_node * nodes)
    # DeepSpeed's model_to_params: the largest module's own parameters = the embedding table
    assert largest_module_params(m) == m.vocab_size * m.hidden_size
    assert z.at_step_bytes == pytest.approx(ds_estimate_zero3_gpu(m.params, largest_module_params(m), per_node, nodes),
                                            rel=0.05)


@pytest.mark.parametrize("model,per_node,nodes", CASES)
def test_deepspeed_zero2_estimator_counts_whole_16_bit_gradients(model, per_node, nodes):
    """DeepSpeed's "zero2" estimator keeps the 16-bit gradients whole (4 Psi + 16 Psi / N): that is
    stage 1's step; stage 2 shards those gradients, 2 Psi (1 - 1/N) less."""
    gpus = per_node * nodes
    m, one = _states(model, 1, gpus)
    est = ds_estimate_zero2_gpu(m.params, per_node, nodes)
    assert one.at_step_bytes == pytest.approx(est, rel=0.05)
    _, two = _states(model, 2, gpus)
    assert est - two.at_step_bytes == pytest.approx(2 * m.params * (1 - 1 / gpus), rel=0.01)


def test_the_plan_uses_the_layout_it_names():
    m = preset("llama-2-7b")
    fsdp = training_memory(m, TrainSetup("amp_bf16", "adamw", 1, 1024, zero_stage=2, num_gpus=8), capacity_bytes=80 << 30)
    ds = training_memory(m, TrainSetup("amp_bf16", "adamw", 1, 1024, zero_stage=2, num_gpus=8, zero_layout="deepspeed"),
                         capacity_bytes=80 << 30)
    assert fsdp.breakdown["weights"] == 4 * m.params and ds.breakdown["weights"] == 2 * m.params
    assert ds.candidates["optimizer step"] < fsdp.candidates["optimizer step"]
    assert "autocast_weight_copies" not in ds.breakdown  # DeepSpeed runs the module in 16-bit
