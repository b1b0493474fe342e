"""LoRA against a real peft model: what autograd saves for backward on a tiny LLaMA on the CPU
(as tests/plan/test_saved_tensors.py does for full fine-tuning), and the parameter counts."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from test_saved_tensors import SMALL, _measured_saved_bytes  # noqa: E402

from gpulens.errors import BadInputError  # noqa: E402
from gpulens.plan import TrainSetup, from_hf_config, preset, training_memory  # noqa: E402
from gpulens.plan.lora import TARGETS, LoraSetup, adapter_params, base_weight_bytes  # noqa: E402
from gpulens.plan.memory import lora_layer_and_head_bytes  # noqa: E402

MODULES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
           "down": "down_proj"}


@pytest.mark.parametrize("mode", ["bf16", "fp32"])
@pytest.mark.parametrize("targets", ["all", "qv"])
def test_lora_saved_activations_match_autograd(mode, targets):
    torch.manual_seed(0)
    config = tf.LlamaConfig(**SMALL)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    if mode == "bf16":
        model = model.to(torch.bfloat16)
    lora = LoraSetup("lora", rank=8, targets=targets)
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                       target_modules=[MODULES[t] for t in TARGETS[targets]]))
    model.train()
    b, s = 2, 96
    ids = torch.randint(0, 8000, (b, s))
    measured = _measured_saved_bytes(model, mode, ids)

    spec = from_hf_config(json.loads(config.to_json_string()) | {"model_type": "llama"})
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert adapter_params(spec, lora) == trainable
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)  # peft's fp32 adapters
    per_layer, head = lora_layer_and_head_bytes(spec, lora, mode, b, s)
    predicted = spec.num_layers * per_layer + head + b * s * spec.vocab_size * 4  # + the saved fp32 log-softmax
    assert predicted == pytest.approx(measured, rel=0.05)


def test_lora_and_qlora_memory_of_an_8b_model():
    m = preset("llama-3-8b")
    full = training_memory(m, TrainSetup("bf16", "adamw", 1, 2048), capacity_bytes=80 << 30)
    lora = training_memory(m, TrainSetup("bf16", "adamw", 1, 2048, finetune="lora"), capacity_bytes=80 << 30)
    qlora = training_memory(m, TrainSetup("bf16", "adamw", 1, 2048, finetune="qlora", grad_ckpt=True),
                            capacity_bytes=24 << 30)
    n_ad = adapter_params(m, LoraSetup("lora", 16, "all"))
    assert n_ad == 41_943_040  # r = 16 on all seven projections of 32 layers
    assert lora.breakdown["weights"] == 2 * m.params and lora.breakdown["optimizer_states"] == 8 * n_ad
    assert lora.peak_bytes < full.peak_bytes / 2  # no base gradients, states only for 0.5 % of the parameters
    # QLoRA: 6.98 B block weights in NF4 (0.516 B each) + 1.05 B embedding/head/norms in 16-bit = 5.7 GB
    assert base_weight_bytes(m, LoraSetup("qlora"), 2) == pytest.approx(6.98e9 * 0.5157 + 1.05e9 * 2, rel=0.01)
    assert qlora.fits and qlora.peak_bytes < lora.peak_bytes - 10e9


def test_lora_refuses_what_it_does_not_model():
    with pytest.raises(BadInputError, match="autocast"):
        training_memory(preset("llama-3-8b"), TrainSetup("amp_bf16", finetune="lora"), capacity_bytes=80 << 30)
    with pytest.raises(BadInputError, match="LLaMA-like"):
        training_memory(preset("mixtral-8x7b"), TrainSetup("bf16", finetune="lora"), capacity_bytes=80 << 30)


@pytest.mark.parametrize("targets", ["all", "qv"])
def test_bf16_adapters_saved_activations_match_autograd(targets):
    """peft with autocast_adapter_dtype=False keeps the adapters in the base's bf16: no fp32 copy of
    each adapter's input, A's output in bf16 (--lora-dtype bf16)."""
    torch.manual_seed(0)
    config = tf.LlamaConfig(**SMALL)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(torch.bfloat16)
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                       target_modules=[MODULES[t] for t in TARGETS[targets]]),
                                autocast_adapter_dtype=False)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters() if p.requires_grad)
    model.train()
    b, s = 2, 96
    ids = torch.randint(0, 8000, (b, s))
    measured = _measured_saved_bytes(model, "bf16", ids)
    spec = from_hf_config(json.loads(config.to_json_string()) | {"model_type": "llama"})
    lora = LoraSetup("lora", rank=8, targets=targets, dtype="bf16")
    per_layer, head = lora_layer_and_head_bytes(spec, lora, "bf16", b, s)
    predicted = spec.num_layers * per_layer + head + b * s * spec.vocab_size * 4
    assert predicted == pytest.approx(measured, rel=0.05)
    fp32_layer, _ = lora_layer_and_head_bytes(spec, LoraSetup("lora", rank=8, targets=targets), "bf16", b, s)
    assert per_layer < fp32_layer  # the fp32 copies are gone


def test_adapter_and_optimizer_dtypes_in_the_memory():
    m = preset("llama-3-8b")
    n_ad = adapter_params(m, LoraSetup("lora", 16, "all"))

    def mem(**kw):
        return training_memory(m, TrainSetup("bf16", "adamw", 1, 2048, finetune="lora", **kw),
                               capacity_bytes=80 << 30).candidates["optimizer step"]

    fp32, bf16 = mem(), mem(lora_dtype="bf16")
    mixed, states16 = mem(lora_dtype="bf16", lora_optimizer_dtype="fp32"), mem(lora_optimizer_dtype="bf16")
    # at the step: adapters + gradients + two moments + one temporary, each in its dtype
    assert fp32 - bf16 == n_ad * ((4 - 2) * 2 + (8 - 4) + (4 - 2))
    assert mixed - bf16 == n_ad * (4 + 4) + n_ad * 2  # fp32 moments, an fp32 master copy, an fp32 temporary
    assert fp32 - states16 == n_ad * (8 - 4)
    with pytest.raises(BadInputError, match="--lora-dtype"):
        training_memory(m, TrainSetup("bf16", finetune="lora", lora_dtype="fp8"), capacity_bytes=80 << 30)


def test_lora_dtype_options_on_the_command_line(capsys):
    from gpulens.cli.main import main

    base = ["plan", "--model", "llama-3-8b", "--workload", "train", "--gpu", "h100-sxm", "--precision", "bf16"]
    assert main([*base, "--lora-dtype", "bf16"]) == 2  # without --finetune lora it would be ignored
    assert "--lora-dtype applies to LoRA" in capsys.readouterr().err
    assert main([*base, "--finetune", "lora", "--lora-optimizer-dtype", "fp16"]) == 2
    err = capsys.readouterr().err
    assert "Unknown --lora-optimizer-dtype 'fp16'" in err and "Traceback" not in err
    assert main([*base, "--finetune", "qlora", "--lora-dtype", "bf16", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["setup"]["lora_dtype"] == "bf16" and "(bf16; optimizer states bf16)" in d["memory"]["notes"][0]
