"""NeMo's distributed Adam (--zero-layout apex-distributed-adam[-bf16]), Megatron-Core's
vocab-parallel cross-entropy (--loss vocab-parallel) and --megatron-core (plan/nemo_optim.py)."""

from __future__ import annotations

import json
from dataclasses import replace

from gpulens.cli.main import main
from gpulens.plan.catalog import find_gpu
from gpulens.plan.memory import TrainSetup, megatron_stage_params, training_memory
from gpulens.plan.models import preset
from gpulens.plan.nemo_optim import apex_adam_states, apex_grad_sync_bytes

GiB = 1 << 30


def test_apex_layout_hand_values():
    # fp32 optimizer: 2 (bf16 module) + 4 (whole fp32 grad buffer) + (4 grad shard + 8 moments + 2 remainders) / d
    s = apex_adam_states(1000.0, layout="apex-distributed-adam", group=8)
    assert (s.weights_bytes, s.gradients_bytes, s.optimizer_states_bytes) == (2000.0, 4000.0, 1750.0)
    # bf16 optimizer: 2 + 2 + (2 + 4) / d, the 100 embedding parameters' gradients fp32
    b = apex_adam_states(1000.0, layout="apex-distributed-adam-bf16", group=4, fp32_grad_params=100.0)
    assert b.gradients_bytes == 2 * 900 + 4 * 100
    assert b.optimizer_states_bytes == (2 * 900 + 4 * 100 + 4 * 1000) / 4


def _setup(**kw):
    base = TrainSetup("fp8", "adamw", 1, 4096, grad_accum=16, zero_stage=1, num_gpus=8, megatron_core=True,
                      attention_kernel="cudnn")
    return replace(base, **kw)


def test_megatron_core_at_tp1_uses_the_megatron_path_and_the_apex_states():
    m = preset("llama-2-7b")
    cap = find_gpu("h100-sxm").memory_bytes
    meg = training_memory(m, _setup(), capacity_bytes=cap)
    apex = training_memory(m, _setup(zero_layout="apex-distributed-adam"), capacity_bytes=cap)
    n = megatron_stage_params(m, _setup())
    assert abs(apex.breakdown["gradients"] - 4 * n) <= 1
    assert abs(apex.breakdown["optimizer_states"] - 14 * n / 8) <= 1
    # Megatron's distributed optimizer: 12/d; NeMo's: 14/d (the gradient shards kept to the step)
    assert abs((apex.breakdown["optimizer_states"] - meg.breakdown["optimizer_states"]) - 2 * n / 8) <= 2


def test_vocab_parallel_loss_keeps_6_bytes_per_entry_per_token_split_over_tp():
    m = preset("llama-3-8b")
    cap = find_gpu("h100-sxm").memory_bytes
    s = _setup(loss="vocab-parallel", tensor_parallel=2, num_gpus=8, megatron_core=False)
    mem = training_memory(m, s, capacity_bytes=cap)
    torch_loss = training_memory(m, replace(s, loss="torch"), capacity_bytes=cap)
    expected = 4096 * 6 * m.vocab_size / 2
    assert mem.candidates["last stage loss"] - torch_loss.candidates["last stage loss"] == -int(expected)


def test_refusals_through_the_cli(capsys):
    base = ["plan", "-m", "llama-3-8b", "--gpus", "8", "--precision", "fp8"]
    assert main([*base, "--zero", "1", "--zero-layout", "apex-distributed-adam"]) == 2  # no Megatron plan
    assert main([*base, "--loss", "vocab-parallel"]) == 2
    assert main([*base, "--megatron-core", "--zero", "2", "--zero-layout", "apex-distributed-adam"]) == 2
    assert main([*base[:-2], "--precision", "fp32", "--megatron-core", "--zero", "1",
                 "--zero-layout", "apex-distributed-adam"]) == 2
    assert main(["plan", "-m", "llama-3-8b", "-w", "infer", "--megatron-core"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--megatron-core" in err
    assert main([*base, "--megatron-core", "--zero", "1", "--zero-layout", "apex-distributed-adam",
                 "--loss", "vocab-parallel", "--format", "json"]) == 0


def test_bf16_grad_sync_beside_fp32_moments_is_4_plus_12_over_d():
    # NeMo 24.07's H100 FP8 scripts: +training.model.optim.grad_sync_dtype=bf16 over fp32 moments
    s = apex_adam_states(1000.0, layout="apex-distributed-adam", group=8, fp32_grad_params=100.0, grad_sync_bytes=2)
    assert s.gradients_bytes == 2 * 900 + 4 * 100  # the embeddings' gradients stay fp32
    assert s.optimizer_states_bytes == (2 * 900 + 4 * 100 + (8 + 2) * 1000) / 8
    assert apex_grad_sync_bytes("apex-distributed-adam", None) == 4
    assert apex_grad_sync_bytes("apex-distributed-adam-bf16", None) == 2
    assert apex_grad_sync_bytes("apex-distributed-adam-bf16", "fp32") == 4


def _json_plan(capsys, *extra):
    capsys.readouterr()
    args = ["plan", "-m", "llama-3-8b", "--gpus", "8", "--gpu", "h100-sxm", "--precision", "fp8", "--batch", "1",
            "--seq", "8192", "--grad-accum", "32", "--cp", "2", "--zero", "1", "--zero-layout", "apex-distributed-adam",
            "--loss", "vocab-parallel", "--attention-kernel", "cudnn", "--format", "json", *extra]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def test_reduce_dtype_sets_the_apex_gradient_buffer_and_halves_its_share_of_the_ring(capsys):
    fp32 = _json_plan(capsys)
    bf16 = _json_plan(capsys, "--reduce-dtype", "bf16")
    n = megatron_stage_params(preset("llama-3-8b"), _setup(context_parallel=2))
    saved = fp32["memory"]["breakdown"]["gradients"] - bf16["memory"]["breakdown"]["gradients"]
    ends = preset("llama-3-8b").embedding_params + preset("llama-3-8b").lm_head_params  # fp32 either way
    assert abs(saved - 2 * (n - ends)) <= 2
    assert bf16["memory"]["peak_bytes"] < fp32["memory"]["peak_bytes"]
    # the reduce-scatter moves 2 bytes instead of 4; the bf16 parameters' all-gather is the same
    assert bf16["speed"]["communication_seconds"] < fp32["speed"]["communication_seconds"]


def test_distributed_optimizer_traffic_is_a_gradient_reduce_scatter_and_a_parameter_all_gather():
    from gpulens.plan.speed import _gradient_ring_bytes_per_param
    plain = _setup(zero_stage=0, num_gpus=16)
    assert _gradient_ring_bytes_per_param(plain) == 4  # Megatron all-reduces its fp32 main_grad
    assert _gradient_ring_bytes_per_param(_setup(num_gpus=16)) == (4 + 2) / 2
    apex_bf16 = _setup(num_gpus=16, zero_layout="apex-distributed-adam", reduce_dtype="bf16")
    assert _gradient_ring_bytes_per_param(apex_bf16) == (2 + 2) / 2


def test_reduce_dtype_refusals_stay_one_sentence(capsys):
    base = ["plan", "-m", "llama-3-8b", "--gpus", "8", "--precision", "fp8", "--megatron-core", "--zero", "1"]
    # --backward-prefetch is FSDP's, not NeMo's distributed Adam's
    assert main([*base, "--zero-layout", "apex-distributed-adam", "--backward-prefetch", "none"]) == 2
    # Megatron's own distributed optimizer has no such knob here
    assert main([*base, "--reduce-dtype", "bf16"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "apex-distributed-adam" in err
