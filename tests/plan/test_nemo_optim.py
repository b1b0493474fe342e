"""NeMo's distributed Adam (--zero-layout apex-distributed-adam[-bf16]), Megatron-Core's
vocab-parallel cross-entropy (--loss vocab-parallel) and --megatron-core (plan/nemo_optim.py)."""

from __future__ import annotations

from dataclasses import replace

from gpulens.cli.main import main
from gpulens.plan.catalog import find_gpu
from gpulens.plan.memory import TrainSetup, megatron_stage_params, training_memory
from gpulens.plan.models import preset
from gpulens.plan.nemo_optim import apex_adam_states

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
