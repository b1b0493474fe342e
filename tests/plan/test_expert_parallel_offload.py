"""Expert parallelism (--ep, plan/expert_parallel.py) and optimizer offload (--offload optimizer,
plan/offload.py): hand-computed memory, the all-to-all's link dependence, the offload's linear
cost, and every refusal as one sentence with exit code 2."""

from __future__ import annotations

import json

import pytest

from gpulens.cli.main import main
from gpulens.plan.catalog import find_gpu
from gpulens.plan.links import all_to_all
from gpulens.plan.memory import TrainSetup, training_memory
from gpulens.plan.models import load_model
from gpulens.plan.offload import CPU_ADAM_PARAMS_PER_SECOND, offload_time
from gpulens.plan.speed import Efficiency, training_speed

GiB = 1 << 30
MIXTRAL = load_model("mixtral-8x7b")
H100 = find_gpu("h100")
# Mixtral-8x7B: 32 MoE layers x 8 experts x a SwiGLU MLP of 3 x 4096 x 14336
EXPERT_PARAMS = 32 * 8 * 3 * 4096 * 14336


def plan_json(capsys, *argv: str) -> dict:
    rc = main(["plan", "--format", "json", *argv])
    out, _ = capsys.readouterr()
    assert rc == 0
    return json.loads(out)


def mixtral(capsys, *argv: str) -> dict:
    return plan_json(capsys, "--model", "mixtral-8x7b", "--gpu", "h100", "--gpus", "8", "--batch", "1",
                     "--seq", "4096", "--grad-ckpt", *argv)


def test_the_expert_count_is_mixtrals():
    assert MIXTRAL.moe_layers * MIXTRAL.expert_params_per_layer() == EXPERT_PARAMS == 45_097_156_608


def test_ep8_holds_one_eighth_of_the_expert_weights(capsys):
    one = mixtral(capsys, "--zero", "1", "--zero-layout", "deepspeed")
    eight = mixtral(capsys, "--zero", "1", "--zero-layout", "deepspeed", "--ep", "8")
    ep = eight["memory"]["mechanisms"]["expert_parallel"]
    assert ep["expert_weights_bytes"] == 2 * EXPERT_PARAMS // 8  # 16-bit weights, 1 of 8 experts per layer
    assert ep["expert_data_parallel"] == 1 and ep["experts_per_gpu"] == 1
    replicated = MIXTRAL.params - EXPERT_PARAMS
    assert one["memory"]["breakdown"]["weights"] == 2 * MIXTRAL.params
    assert eight["memory"]["breakdown"]["weights"] == 2 * replicated + 2 * EXPERT_PARAMS // 8
    # the expert part of the weights: 8x smaller
    assert (one["memory"]["breakdown"]["weights"] - 2 * replicated) == 8 * ep["expert_weights_bytes"]
    assert eight["memory"]["peak_bytes"] < one["memory"]["peak_bytes"]


def test_zero_shards_the_experts_over_the_expert_data_parallel_group():
    s = TrainSetup(micro_batch=1, seq_len=1024, num_gpus=16, zero_stage=1, zero_layout="deepspeed", expert_parallel=8)
    mech = training_memory(MIXTRAL, s, capacity_bytes=80 * GiB).mechanisms["expert_parallel"]
    # fp32 master + two fp32 moments (12 bytes) of 1/8 of the experts, sharded over the 16 / 8 = 2 GPUs holding them
    assert mech["expert_data_parallel"] == 2
    assert mech["expert_optimizer_states_bytes"] == pytest.approx(12 * EXPERT_PARAMS / 8 / 2)


def test_all_to_all_hand_value_and_link():
    buf = 4096 * 2 * 4096 * 2  # tokens x top-2 x hidden x bf16
    one = all_to_all(buf, 8, H100, gpus_per_node=8)
    assert one.transfer_seconds == pytest.approx(7 / 8 * buf / (450e9 * 20.6 / 25))  # NVLink 4: 450 GB/s each way, NCCL moves 20.6 of each link's 25
    two_nodes = all_to_all(buf, 8, H100, gpus_per_node=4, inter_node_bytes_per_second=50e9)
    assert two_nodes.transfer_seconds == pytest.approx(4 / 8 * buf / (50e9 * 0.96))  # half the peers over the network (48 of 50 GB/s)
    slower = all_to_all(buf, 8, H100, gpus_per_node=4, inter_node_bytes_per_second=12.5e9)
    assert one.seconds < two_nodes.seconds < slower.seconds
    assert all_to_all(buf, 1, H100).seconds == 0.0


def test_all_to_all_time_grows_as_the_link_slows(capsys):
    nvlink = mixtral(capsys, "--ep", "8")["speed"]
    inter = mixtral(capsys, "--ep", "8", "--gpus-per-node", "4")["speed"]
    slow = mixtral(capsys, "--ep", "8", "--gpus-per-node", "4", "--inter-node-gbps", "12.5")["speed"]
    assert nvlink["expert_all_to_all_count"] == 32 * 6  # 4 per layer, 2 more with full recomputation
    assert 0 < nvlink["expert_all_to_all_seconds"] < inter["expert_all_to_all_seconds"] < slow["expert_all_to_all_seconds"]
    assert "NVLink" in nvlink["expert_all_to_all_link"] and "network" in inter["expert_all_to_all_link"]
    assert nvlink["step_seconds"] < inter["step_seconds"] < slow["step_seconds"]


def test_offload_removes_the_optimizer_states_from_the_gpu(capsys):
    args = ("--model", "llama-3-8b", "--gpu", "h100", "--gpus", "8", "--batch", "1", "--zero", "2", "--zero-layout",
            "deepspeed")
    on = plan_json(capsys, *args)
    off = plan_json(capsys, *args, "--offload", "optimizer")
    n = on["model"]["params"]
    # DeepSpeed's layout: fp32 master + Adam m and v = 12 bytes per parameter, sharded over 8 GPUs
    assert on["memory"]["breakdown"]["optimizer_states"] == 12 * n // 8
    assert "optimizer_states" not in off["memory"]["breakdown"]
    cpu = off["memory"]["mechanisms"]["optimizer_offload"]
    assert cpu["cpu_bytes_per_gpu"] == int(16 * n / 8)  # + the fp32 gradient partition
    assert cpu["cpu_bytes_per_node"] == int(16 * n / 8) * 8
    s = off["speed"]
    assert s["offload_pcie_seconds"] == pytest.approx(4 * n / 8 / 64e9)  # H100 SXM: PCIe Gen5 x16, 64 GB/s each way
    assert s["offload_cpu_adam_seconds"] == pytest.approx(n / CPU_ADAM_PARAMS_PER_SECOND)  # the node's 8 partitions
    assert off["speed"]["step_seconds"] > on["speed"]["step_seconds"]


def test_offload_time_is_linear_in_the_parameters():
    a, b = offload_time(1e9, 8, H100), offload_time(3e9, 8, H100)
    assert b.pcie_seconds == pytest.approx(3 * a.pcie_seconds)
    assert b.cpu_adam_seconds == pytest.approx(3 * a.cpu_adam_seconds)
    small, big = load_model("llama-3-8b"), load_model("llama-3-70b")
    kw = dict(micro_batch=1, seq_len=1024, num_gpus=8, zero_stage=2, zero_layout="deepspeed", grad_ckpt=True)
    eff = Efficiency()
    t8 = training_speed(small, TrainSetup(offload="optimizer", **kw), H100, eff)
    t70 = training_speed(big, TrainSetup(offload="optimizer", **kw), H100, eff)
    ratio = big.params / small.params
    assert t70.offload_cpu_adam_seconds / t8.offload_cpu_adam_seconds == pytest.approx(ratio)
    assert t70.offload_pcie_seconds / t8.offload_pcie_seconds == pytest.approx(ratio)


def test_text_shows_both(capsys):
    rc = main(["plan", "--model", "mixtral-8x7b", "--gpu", "h100", "--gpus", "8", "--batch", "1", "--grad-ckpt",
               "--ep", "8", "--zero", "2", "--zero-layout", "deepspeed", "--offload", "optimizer"])
    out, _ = capsys.readouterr()
    assert rc == 0
    for words in ("EP 8", "experts (1 of 8 per layer)", "CPU memory per node", "expert all-to-alls", "CPU Adam"):
        assert words in out
    assert "Traceback" not in out


@pytest.mark.parametrize(("argv", "words"), [
    (("--model", "mixtral-8x7b", "--gpus", "8", "--ep", "3"), "does not divide mixtral-8x7b's 8 experts"),
    (("--model", "mixtral-8x7b", "--gpus", "4", "--ep", "8"), "does not divide the 4 data-parallel GPUs"),
    (("--model", "mixtral-8x7b", "--gpus", "8", "--ep", "2", "--zero", "3"), "MoE not supported with Stage 3"),
    (("--model", "mixtral-8x7b", "--gpus", "8", "--ep", "2", "--tp", "2"), "inside data parallelism"),
    (("--model", "llama-3-8b", "--gpus", "8", "--ep", "2"), "dense model"),
    (("--model", "mixtral-8x7b", "--workload", "infer", "--ep", "2"), "training option"),
    (("--model", "llama-3-8b", "--offload", "optimizer"), "--zero is 0"),
    (("--model", "llama-3-8b", "--gpus", "8", "--zero", "2", "--offload", "optimizer"), "FSDP's CPUOffload"),
    (("--model", "llama-3-8b", "--gpus", "8", "--zero", "2", "--zero-layout", "deepspeed", "--precision", "bf16",
      "--offload", "optimizer"), "fp32 master weights"),
    (("--model", "llama-3-8b", "--gpus", "8", "--zero", "2", "--zero-layout", "deepspeed", "--optimizer", "sgd",
      "--offload", "optimizer"), "DeepSpeedCPUAdam"),
    (("--model", "llama-3-8b", "--offload", "nvme"), "Unknown offload"),
    (("--model", "llama-3-8b", "--workload", "infer", "--offload", "optimizer"), "training option"),
])
def test_refusals_exit_2_with_one_sentence(capsys, argv, words):
    rc = main(["plan", "--gpu", "h100", "--batch", "1", *argv])
    _, err = capsys.readouterr()
    assert rc == 2
    assert words in err and "Traceback" not in err
