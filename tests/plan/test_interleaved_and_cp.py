"""The interleaved 1F1B schedule (`--virtual-stages`, Narayanan et al. 2021, 2.2.2) and context
parallelism (`--cp`, ring attention as Megatron-Core runs it): hand values, trends, refusals."""

from __future__ import annotations

import json

import pytest

from gpulens.cli.main import main
from gpulens.plan import PlanRequest, TrainSetup, plan, preset
from gpulens.plan.catalog import find_gpu
from gpulens.plan.context_parallel import ring_attention_cost
from gpulens.plan.interleaved import (
    bubble_over_compute_ratio,
    first_stage_layers_in_flight,
    last_stage_layers_in_flight,
)

# llama-3-70b (80 layers) on 32 H100s: TP 8 x PP 4, m = 8 micro-batches per step
PIPE = dict(model="llama-3-70b", gpu="h100-sxm", gpus=32, tensor_parallel=8, pipeline_parallel=4, grad_accum=8,
            batch=1, seq=4096, sequence_parallel=True, zero=1)
# qwen2.5-7b (32k positions) at 32k tokens, TP 4
LONG = dict(model="qwen2.5-7b", gpu="h100-sxm", tensor_parallel=4, batch=1, seq=32768, zero=1)


def _plan(**kw):
    return plan(PlanRequest(**kw))


# ---------------------------------------------------------------- interleaved 1F1B


def test_bubble_fraction_hand_values():
    # the paper's bubble time fraction (p - 1) / (V m): p = 4, m = 8
    assert bubble_over_compute_ratio(4, 1, 8) == pytest.approx(3 / 8)
    assert bubble_over_compute_ratio(4, 2, 8) == pytest.approx(3 / 16)
    one, two = _plan(**PIPE).speed, _plan(**PIPE, virtual_stages=2).speed
    assert one["pipeline_bubble_over_compute_ratio"] == pytest.approx(3 / 8)
    assert two["pipeline_bubble_over_compute_ratio"] == pytest.approx(3 / 16)
    # its share of the whole step: 3 of 8 + 3 slots; 1.5 of 8 + 1.5
    assert one["pipeline_bubble_ratio"] == pytest.approx(3 / 11)
    assert two["pipeline_bubble_ratio"] == pytest.approx(1.5 / 9.5)


def test_interleaving_shortens_the_step_and_sends_more():
    steps, p2p = [], []
    for v in (1, 2, 4):  # 80 layers split into 4, 8, 16 chunks
        s = _plan(**PIPE, virtual_stages=v).speed
        steps.append(s["step_seconds"])
        p2p.append(s["pipeline_p2p_seconds"])
        assert s["pipeline_virtual_stages"] == v
    assert steps[0] > steps[1] > steps[2]
    assert p2p[0] < p2p[1] < p2p[2]
    # per micro-batch V times the sends, over m + (p - 1)/V slots: 2 x 9.5 / 11
    assert p2p[1] / p2p[0] == pytest.approx(2 * 9.5 / 11)


def test_first_stage_holds_more_activations_when_interleaved():
    # Megatron's warm-up on rank 0: 2 (p - 1) + (V - 1) p + 1 = 11 chunks of 80 / 8 layers = 110 layers,
    # L (1 + (p - 1) / (p V)) = 80 x 1.375 (Korthikanti et al. 2022, 4.2.3); 1F1B: L = 80
    assert first_stage_layers_in_flight(80, 4, 1, 8) == pytest.approx(80)
    assert first_stage_layers_in_flight(80, 4, 2, 8) == pytest.approx(110)
    assert first_stage_layers_in_flight(80, 4, 2, 4) == pytest.approx(80)  # m = p: all 8 chunks, all warm-up
    assert last_stage_layers_in_flight(80, 4, 1, 8) == pytest.approx(20)
    assert last_stage_layers_in_flight(80, 4, 2, 8) == pytest.approx(50)  # (V - 1) p + 1 = 5 chunks of 10
    one = _plan(**PIPE).memory.breakdown["activations"]
    two = _plan(**PIPE, virtual_stages=2).memory.breakdown["activations"]
    assert two / one == pytest.approx(1 + 3 / 8, rel=1e-6)


# ---------------------------------------------------------------- context parallelism


def test_cp2_halves_activations_and_attention_per_gpu():
    base = _plan(**LONG, gpus=4)
    cp = _plan(**LONG, gpus=8, context_parallel=2)
    assert cp.memory.breakdown["activations"] / base.memory.breakdown["activations"] == pytest.approx(0.5, rel=1e-6)
    ratio = cp.speed["attention_seconds"] / base.speed["attention_seconds"]
    assert 0.45 < ratio < 0.55
    assert cp.speed["step_seconds"] < 0.6 * base.speed["step_seconds"]
    # one replica of the batch: 32k tokens a step, counted once though 8 GPUs hold it
    assert cp.speed["tokens_per_second"] * cp.speed["step_seconds"] == pytest.approx(32768)
    assert cp.speed["context_parallel"] == 2 and "NVLink" in cp.speed["context_parallel_link"]


def test_ring_send_is_the_local_kv_shard():
    m, gpu = preset("qwen2.5-7b"), find_gpu("h100-sxm")
    setup = TrainSetup(micro_batch=1, seq_len=32768, num_gpus=8, tensor_parallel=4, context_parallel=2)
    cost = ring_attention_cost(m, setup, gpu, attention_seconds=1.0)
    # K and V: 2 x 1 x 16384 tokens x (4 KV heads / TP 4) x 128 x 2 bytes
    assert cost.send_bytes == 2 * 16384 * 1 * 128 * 2
    # forward 1 send, backward 2 (K/V with dK/dV) per layer, N - 1 = 1 step, 28 layers
    step = cost.transfer_seconds / (28 * 3)
    assert step == pytest.approx(3.4e-6 + cost.send_bytes / (450e9 * 20.6 / 25))


def test_cp_communication_grows_as_the_link_slows():
    kw = dict(LONG, tensor_parallel=1, gpus=2, context_parallel=2, seq=4096)
    fast = _plan(**kw).speed
    inter = _plan(**kw, gpus_per_node=1).speed
    slow = _plan(**kw, gpus_per_node=1, inter_node_bytes_per_second=1e9).speed
    assert fast["context_parallel_transfer_seconds"] < inter["context_parallel_transfer_seconds"] \
        < slow["context_parallel_transfer_seconds"]
    assert "network" in inter["context_parallel_link"]
    # on NVLink the attention hides the ring; over a 1 GB/s network it cannot
    assert fast["context_parallel_exposed_seconds"] == 0.0
    assert slow["context_parallel_exposed_seconds"] > 0.0
    assert slow["step_seconds"] > fast["step_seconds"]


def test_distributed_optimizer_shards_over_data_and_context_parallel():
    base = _plan(**LONG, gpus=4).memory.breakdown["optimizer_states"]
    cp = _plan(**LONG, gpus=8, context_parallel=2).memory.breakdown["optimizer_states"]
    # Megatron's table: 12 bytes of fp32 master + moments per parameter, / d over d = dp x cp ranks
    assert cp / base == pytest.approx(0.5, rel=1e-6)


# ---------------------------------------------------------------- the CLI


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["plan", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


BASE = ["--model", "llama-3-70b", "--gpu", "h100-sxm", "--batch", "1", "--seq", "4096"]


@pytest.mark.parametrize("argv,needle", [
    (["--gpus", "8", "--tp", "8", "--virtual-stages", "2"], "--virtual-stages 2 interleaves"),
    (["--gpus", "32", "--tp", "8", "--pp", "4", "--grad-accum", "8", "--virtual-stages", "3"], "do not split"),
    (["--gpus", "32", "--tp", "8", "--pp", "4", "--grad-accum", "6", "--virtual-stages", "2"], "multiple of --pp 4"),
    (["--gpus", "32", "--tp", "8", "--pp", "4", "--virtual-stages", "0"], "--virtual-stages must be between 1"),
    (["--gpus", "16", "--tp", "8", "--cp", "0"], "--cp must be between 1"),
    (["--gpus", "16", "--tp", "8", "--cp", "2", "--seq", "4098"], "2 x --cp 2 = 4 equal chunks"),
    (["--gpus", "12", "--tp", "8", "--cp", "2"], "x --cp 2"),
])
def test_refusals_exit_2_in_one_sentence(capsys, argv, needle):
    rc, out, err = _cli(capsys, *BASE, *argv)
    assert rc == 2
    assert needle in err and "Traceback" not in err + out


@pytest.mark.parametrize("flag", ["--cp", "--virtual-stages"])
def test_serving_refuses_training_parallelism(capsys, flag):
    rc, out, err = _cli(capsys, "--model", "llama-3-70b", "--gpu", "h100-sxm", "--gpus", "4", "--workload", "infer",
                        flag, "2")
    needle = f"{flag} is a training option"
    assert rc == 2
    assert needle in err and "Traceback" not in err + out


def test_text_and_json_show_both(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    argv = [*BASE, "--gpus", "64", "--tp", "8", "--pp", "4", "--cp", "2", "--virtual-stages", "2", "--grad-accum", "8",
            "--sp", "--zero", "1"]
    rc, out, _ = _cli(capsys, *argv)
    assert rc == 0
    words = " ".join(out.split())  # rich wraps at 80 columns
    assert "PP 4 × 2 chunks · CP 2" in words and "interleaved 1F1B, 2 chunks per stage" in words
    assert "stage-to-stage sends" in words and "context parallel (ring)" in words
    assert max(len(line) for line in out.splitlines()) <= 80
    rc, out, _ = _cli(capsys, *argv, "--format", "json")
    d = json.loads(out)
    assert d["setup"]["virtual_stages"] == 2 and d["setup"]["context_parallel"] == 2
    assert d["speed"]["pipeline_bubble_over_compute_ratio"] == pytest.approx(3 / 16)
    assert d["speed"]["context_parallel_transfer_seconds"] > 0


def test_global_batch_counts_data_parallel_replicas_only():
    # 64 GPUs = TP 8 x PP 4 x CP 2 x DP 1: one replica, 8 micro-batches of 4096 tokens a step
    s = _plan(**dict(PIPE, gpus=64), context_parallel=2).speed
    assert s["global_batch_tokens"] == 8 * 4096
    assert s["tokens_per_second"] * s["step_seconds"] == pytest.approx(8 * 4096)
