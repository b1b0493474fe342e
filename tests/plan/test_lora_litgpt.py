"""LoRA as LitGPT runs it (--lora-engine litgpt, plan/lora_litgpt.py) against autograd: a small
copy of the forward code of LitGPT's `lit_gpt/lora.py` GPT at commit 8641822 (the resource tables'
version; Apache-2.0, Lightning AI) on the CPU, its saved tensors walked as tests/plan/test_lora.py
walks peft's. Two things differ from the tables' CUDA + PyTorch 2.1 run and are passed to the
formula: the CPU's dropout keeps a 16-bit noise tensor (CUDA: a bool mask), and this PyTorch's
torch.mean keeps no input (2.1's did)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from gpulens.errors import BadInputError  # noqa: E402
from gpulens.plan import TrainSetup, from_hf_config, preset, training_memory  # noqa: E402
from gpulens.plan import lora_litgpt as litgpt  # noqa: E402

H, INTER, HEADS, VOCAB, R = 256, 704, 4, 512, 8


def _param(*shape):
    return torch.nn.Parameter(torch.randn(*shape, dtype=torch.bfloat16) * 0.02, requires_grad=False)


class RMSNorm(torch.nn.Module):  # lit_gpt/rmsnorm.py: no fp32 upcast
    def __init__(self):
        super().__init__()
        self.weight = _param(H)

    def forward(self, x):
        norm_x = torch.mean(x * x, dim=-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(norm_x + 1e-5))


class Block(torch.nn.Module):
    """LoRAQKVLinear (q and v adapted, dropout 0.05), CausalSelfAttention, LLaMAMLP."""

    def __init__(self, kv_heads: int):
        super().__init__()
        hs = H // HEADS
        self.g, self.qkv_out = kv_heads, H + 2 * kv_heads * hs
        self.norm_1, self.norm_2 = RMSNorm(), RMSNorm()
        self.attn, self.proj = _param(self.qkv_out, H), _param(H, H)
        self.fc_1, self.fc_2, self.mlp_proj = _param(INTER, H), _param(INTER, H), _param(H, INTER)
        self.lora_A = torch.nn.Parameter(torch.randn(2 * R, H, dtype=torch.bfloat16) * 0.02)
        self.qkv_shapes = [H, kv_heads * hs]
        self.lora_B = torch.nn.Parameter(torch.randn(sum(self.qkv_shapes), R, dtype=torch.bfloat16) * 0.02)
        self.lora_ind = list(range(H)) + list(range(H + kv_heads * hs, self.qkv_out))
        self.dropout = torch.nn.Dropout(0.05)

    def qkv(self, x):
        pretrained = F.linear(x, self.attn)
        after_a = F.linear(self.dropout(x), self.lora_A)
        inp, w = after_a.transpose(-2, -1), self.lora_B.unsqueeze(-1)
        if self.g == HEADS:
            after_b = F.conv1d(inp, w, groups=2)
        else:
            after_b = torch.cat([F.conv1d(a, b) for a, b in zip(inp.chunk(2, dim=1), w.split(self.qkv_shapes), strict=True)], dim=1)
        x = after_b.transpose(-2, -1).transpose(0, 1)  # zero_pad
        result = x.new_zeros((*x.shape[:-1], self.qkv_out)).view(-1, self.qkv_out)
        result = result.index_copy(1, torch.tensor(self.lora_ind), x.reshape(-1, sum(self.qkv_shapes)))
        return pretrained + result.view((*x.shape[:-1], self.qkv_out)).transpose(0, 1) * 2.0

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        hs, q_per_kv = H // HEADS, HEADS // self.g
        qkv = self.qkv(self.norm_1(x)).view(B, T, self.g, q_per_kv + 2, hs).permute(0, 2, 3, 1, 4)
        q, k, v = qkv.split((q_per_kv, 1, 1), dim=2)
        if self.g != 1:
            k, v = k.expand(B, self.g, q_per_kv, T, hs), v.expand(B, self.g, q_per_kv, T, hs)
        q, k, v = (t.reshape(B, -1, T, hs) for t in (q, k, v))

        def rope(t):
            rotated = torch.cat((-t[..., hs // 2:], t[..., :hs // 2]), dim=-1)
            return ((t * cos) + (rotated * sin)).type_as(t)

        q, k = torch.cat((rope(q), q[..., hs:]), dim=-1), torch.cat((rope(k), k[..., hs:]), dim=-1)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, scale=1 / math.sqrt(hs), is_causal=True)
        x = x + F.linear(y.transpose(1, 2).reshape(B, T, C), self.proj)
        n_2 = self.norm_2(x)
        return x + F.linear(F.silu(F.linear(n_2, self.fc_1)) * F.linear(n_2, self.fc_2), self.mlp_proj)


def _saved_bytes(kv_heads: int, layers: int, T: int) -> int:
    torch.manual_seed(0)
    wte, head, ln_f = _param(VOCAB, H), _param(VOCAB, H), RMSNorm()
    blocks = [Block(kv_heads) for _ in range(layers)]
    theta = 1.0 / (10000 ** (torch.arange(0, H // HEADS, 2) / (H // HEADS)))
    angles = torch.outer(torch.arange(T).float(), theta).repeat(1, 2)
    cos, sin = torch.cos(angles), torch.sin(angles)  # fp32 (max_seq_length is set outside bf16-true)
    params = {p.untyped_storage().data_ptr() for b in blocks for p in b.parameters()}
    params |= {t.untyped_storage().data_ptr() for t in (wte, head, ln_f.weight, cos, sin)}
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(0, VOCAB, (1, T))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        x = F.embedding(ids, wte)
        for b in blocks:
            x = b(x, cos, sin)
        logits = [F.linear(c, head).float() for c in ln_f(x).split(128, dim=1)]  # Fabric's convert_output: fp32
        torch.cat([F.cross_entropy(lg.reshape(-1, VOCAB), t.reshape(-1), reduction="none")
                   for lg, t in zip(logits, ids.split(128, dim=1), strict=True)]).mean()
    return sum(n for p, n in seen.items() if p not in params)


@pytest.mark.parametrize("kv_heads", [HEADS, 2])
def test_litgpt_lora_saved_activations_match_autograd(kv_heads):
    T, layers = 160, 3
    measured = _saved_bytes(kv_heads, layers, T)
    spec = from_hf_config({"model_type": "llama", "hidden_size": H, "intermediate_size": INTER, "num_hidden_layers": layers,
                           "num_attention_heads": HEADS, "num_key_value_heads": kv_heads, "vocab_size": VOCAB})
    kw = {"mask_bytes": 2, "mean_keeps_input": False}  # this CPU PyTorch (see the module's docstring)
    per_token = (litgpt.layer_bytes_per_token(spec, "qv", R, False, first=True, **kw)
                 + (layers - 1) * litgpt.layer_bytes_per_token(spec, "qv", R, False, **kw)
                 + litgpt.head_bytes_per_token(spec, False, mean_keeps_input=False))
    index = layers * 8 * (H + spec.kv_size)  # zero_pad's int64 index, per layer (not per token)
    predicted = T * per_token + index + T * 4 * VOCAB  # + the fp32 log_softmax output
    assert predicted == pytest.approx(measured, rel=0.02)


def test_litgpt_weights_and_peaks_of_llama2_7b():
    m = preset("llama-2-7b")
    setup = dict(micro_batch=1, seq_len=1304, lora_rank=8, lora_targets="qv", lora_dtype="bf16", lora_engine="litgpt")
    lora = training_memory(m, TrainSetup("bf16", finetune="lora", **setup), capacity_bytes=40 << 30)
    dq = training_memory(m, TrainSetup("bf16", finetune="qlora", **setup), capacity_bytes=40 << 30)
    nf4 = training_memory(m, TrainSetup("bf16", finetune="qlora", qlora_double_quant=False, **setup),
                          capacity_bytes=40 << 30)
    assert lora.breakdown["weights"] == 2 * m.params and lora.peak_at == "backward start"
    linears = m.num_layers * (4 * 4096 * 4096 + 3 * 4096 * 11008) + 32000 * 4096  # the output head in NF4 too
    assert nf4.breakdown["weights"] - dq.breakdown["weights"] == pytest.approx(linears * (4 / 64 - 1 / 64 - 4 / 16384), abs=2)
    assert dq.peak_at == "output head backward" and dq.breakdown["dequantized_weight"] == 4 * 32000 * 4096
    assert lora.breakdown["logits_and_loss"] == 1304 * 8 * 32000  # fp32 logits and their fp32 log_softmax


def test_litgpt_engine_refuses_what_it_does_not_model():
    m = preset("llama-2-7b")
    base = dict(finetune="lora", lora_engine="litgpt", lora_dtype="bf16")
    for setup, match in ((TrainSetup("bf16", **base, grad_ckpt=True), "checkpoints"),
                         (TrainSetup("fp32", **base), "--precision bf16"),
                         (TrainSetup("bf16", finetune="lora", lora_engine="litgpt"), "adapters in bf16"),
                         (TrainSetup("bf16", **base, num_gpus=2), "one GPU"),
                         (TrainSetup("bf16", finetune="lora", lora_engine="unsloth"), "Unknown LoRA engine")):
        with pytest.raises(BadInputError, match=match):
            training_memory(m, setup, capacity_bytes=80 << 30)


def test_litgpt_options_on_the_command_line(capsys):
    import json

    from gpulens.cli.main import main

    base = ["plan", "--model", "llama-2-7b", "--workload", "train", "--gpu", "a100-40gb", "--precision", "bf16",
            "--batch", "1", "--seq", "1304", "--lora-rank", "8", "--lora-targets", "qv"]
    assert main([*base, "--finetune", "qlora", "--lora-engine", "litgpt", "--no-qlora-double-quant",
                 "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["setup"]["lora_engine"] == "litgpt" and d["setup"]["lora_dtype"] == "bf16"  # bf16-true's default
    assert d["setup"]["qlora_double_quant"] is False
    assert any("PagedAdamW" in n for n in d["memory"]["notes"])
    for extra, msg in ((["--finetune", "lora", "--no-qlora-double-quant"], "--finetune is lora"),
                       (["--lora-engine", "litgpt"], "--finetune is full"),
                       (["--finetune", "lora", "--lora-engine", "litgpt", "--lora-dtype", "fp32"], "adapters in bf16"),
                       (["--finetune", "lora", "--lora-engine", "axolotl"], "Unknown LoRA engine")):
        assert main([*base, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err
