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
