"""Megatron activation memory per layer against Korthikanti et al. 2022 (equations of section 4,
the GPT-3 175B, 530B and 1T shapes of its Table 3: s = 2048, micro-batch 1), and training plans
with tensor / pipeline / sequence parallelism."""

from __future__ import annotations

import pytest

from gpulens.errors import BadInputError
from gpulens.plan import PlanRequest, TrainSetup, plan, preset, training_memory
from gpulens.plan.megatron import (
    MegatronShape,
    activation_bytes,
    layer_activation_items,
    llama_layer_items,
    model_state_bytes_per_param,
)

# (name, heads a, hidden h, layers L, tensor-parallel t) from the paper's Table 3
SHAPES = [("gpt-3 175b", 96, 12288, 96, 8), ("530b", 128, 20480, 105, 8), ("1t", 160, 25600, 128, 8)]
S, B = 2048, 1


def _paper(a, h, t, mode):
    sbh = S * B * h
    return {
        "none": sbh * (34 + 5 * a * S / h),
        "tp": sbh * (10 + 24 / t + 5 * a * S / (h * t)),
        "tp+sp": sbh / t * (34 + 5 * a * S / h),
        "selective": 34 * sbh / t,
        "full": 2 * sbh,
    }[mode]


@pytest.mark.parametrize("name,a,h,layers,t", SHAPES)
def test_layer_activation_matches_the_paper(name, a, h, layers, t):
    x = MegatronShape(seq=S, micro_batch=B, hidden=h, heads=a, layers=layers)
    one = MegatronShape(seq=S, micro_batch=B, hidden=h, heads=a)
    cases = {
        "none": dict(tensor_parallel=1),
        "tp": dict(tensor_parallel=t),
        "tp+sp": dict(tensor_parallel=t, sequence_parallel=True),
        "selective": dict(tensor_parallel=t, sequence_parallel=True, recompute="selective"),
        "full": dict(tensor_parallel=t, recompute="full"),
    }
    for mode, kw in cases.items():
        got = sum(layer_activation_items(one, **kw).values())
        assert got == pytest.approx(_paper(a, h, t, mode), rel=0.05), (name, mode)
        assert activation_bytes(x, **kw) == pytest.approx(layers * got)


def test_the_papers_175b_figures():
    # "for GPT-3 175B, 5as/h = 80": the attention core outweighs the 34 of everything else
    a, h = 96, 12288
    assert 5 * a * S / h == 80
    one = MegatronShape(seq=S, micro_batch=B, hidden=h, heads=a)
    full = sum(layer_activation_items(one, tensor_parallel=8, sequence_parallel=True).values())
    selective = sum(layer_activation_items(one, tensor_parallel=8, sequence_parallel=True, recompute="selective").values())
    assert 1 - selective / full == pytest.approx(80 / 114, rel=0.01)  # selective recompute saves 70 %


def test_tensor_parallel_must_divide_heads():
    with pytest.raises(BadInputError):
        layer_activation_items(MegatronShape(S, B, 12288, 96), tensor_parallel=7)


# ---------------------------------------------------------------- training plans with --tp / --pp / --sp


def test_megatron_model_state_bytes_per_parameter():
    # Megatron-LM's distributed-optimizer table: bf16 weights, fp32 gradients: 18 bytes; 6 + 12/d sharded
    assert model_state_bytes_per_param("amp_bf16", 8, distributed_optimizer=False) == 18
    assert model_state_bytes_per_param("amp_bf16", 8, distributed_optimizer=True) == 6 + 12 / 8
    assert model_state_bytes_per_param("fp32", 4, distributed_optimizer=True) == 8 + 8 / 4


def test_llama_layer_follows_the_same_rules():
    kw = dict(seq=4096, micro_batch=1, hidden=8192, heads=64, kv_heads=8, head_dim=128, intermediate=28672)
    full = sum(llama_layer_items(**kw).values())
    tp = sum(llama_layer_items(**kw, tensor_parallel=8).values())
    tp_sp = sum(llama_layer_items(**kw, tensor_parallel=8, sequence_parallel=True).values())
    assert tp_sp == pytest.approx(full / 8)  # sequence parallelism splits what TP alone replicates
    replicated = 2 * 4096 * 8192 * (2 + 1 + 1)  # norms' inputs, the qkv and MLP inputs
    assert tp == pytest.approx((full - replicated) / 8 + replicated)
    assert sum(llama_layer_items(**kw, tensor_parallel=8, recompute="full").values()) == 2 * 4096 * 8192


@pytest.mark.parametrize("kw", [{}, {"tensor_parallel": 8}, {"tensor_parallel": 8, "sequence_parallel": True},
                                {"tensor_parallel": 8, "sequence_parallel": True, "recompute": "selective"}])
def test_a_gpt_layer_with_dropout_is_the_papers_layer(kw):
    """A plain-MLP layer with dropout and unfused attention is Korthikanti et al.'s: sbh (34 + 5as/h)
    before parallelism (fc1's output and the GeLU's output, 8 sbh each; two 1-byte dropout masks)."""
    x = MegatronShape(S, B, 12288, 96)
    paper = sum(layer_activation_items(x, **kw).values())
    ours = sum(llama_layer_items(seq=S, micro_batch=B, hidden=12288, heads=96, kv_heads=96, head_dim=128,
                                 intermediate=4 * 12288, flash=False, gated=False, dropout=True, **kw).values())
    assert ours == pytest.approx(paper)
    # a gated MLP's fused SwiGLU keeps [gate | up] and its output: 3 tensors, not 4
    gated = llama_layer_items(seq=S, micro_batch=B, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336)
    assert gated["fc1_output_and_act"] == 3 * 2 * S * B * 14336


def test_a_tensor_parallel_training_plan():
    m = preset("llama-3-70b")
    tp8 = training_memory(m, TrainSetup("amp_bf16", "adamw", 1, 4096, num_gpus=64, tensor_parallel=8, pipeline_parallel=8,
                                        sequence_parallel=True, grad_accum=32, zero_stage=1), capacity_bytes=80 << 30)
    assert tp8.fits
    per_gpu_params = (m.block_params / 8 + m.vocab_size * m.hidden_size) / 8
    assert tp8.breakdown["weights"] == pytest.approx(2 * per_gpu_params, rel=0.001)
    assert tp8.breakdown["optimizer_states"] == pytest.approx((12 / 1) * per_gpu_params, rel=0.001)  # DP 1: unsharded


def test_tensor_parallelism_across_nodes_is_slow_and_pipelines_have_a_bubble():
    base = dict(model="llama-3-70b", workload="train", gpu="h100-sxm", batch=1, seq=4096, grad_ckpt=True)
    in_node = plan(PlanRequest(**base, gpus=8, tensor_parallel=8)).speed
    across = plan(PlanRequest(**base, gpus=16, tensor_parallel=16)).speed
    assert "NVLink" in in_node["tensor_parallel_link"] and "inter-node" in across["tensor_parallel_link"]
    # eight 400 Gb/s NICs a node carry a two-node ring almost as fast as NVLink (NCCL's rails), so
    # what the network adds is its latency; 100 Gb/s NICs make it the bandwidth as well
    assert across["communication_seconds"] > 1.2 * in_node["communication_seconds"]
    slow = plan(PlanRequest(**base, gpus=16, tensor_parallel=16, inter_node_bytes_per_second=12.5e9)).speed
    assert slow["communication_seconds"] > 3 * in_node["communication_seconds"]
    pp = plan(PlanRequest(**base, gpus=64, tensor_parallel=8, pipeline_parallel=8, grad_accum=8)).speed
    assert pp["pipeline_bubble_ratio"] == pytest.approx(7 / 15)
    more = plan(PlanRequest(**base, gpus=64, tensor_parallel=8, pipeline_parallel=8, grad_accum=64)).speed
    assert more["pipeline_bubble_ratio"] < pp["pipeline_bubble_ratio"] / 4


def test_degrees_that_do_not_divide_are_refused():
    m = preset("llama-3-70b")  # 80 layers, 64 heads
    for kw in (dict(num_gpus=12, tensor_parallel=8), dict(num_gpus=24, tensor_parallel=8, pipeline_parallel=3),
               dict(num_gpus=8, tensor_parallel=1, sequence_parallel=True)):
        with pytest.raises(BadInputError):
            training_memory(m, TrainSetup("amp_bf16", "adamw", 1, 4096, **kw), capacity_bytes=80 << 30)


# ---------------------------------------------------------------- selective recomputation (--recompute selective)
# Table 2 of the paper, activations per layer (rows as quoted in secondary sources that reproduce
# the table; the paper itself was not readable from here): no parallelism sbh(34 + 5as/h),
# tensor + sequence parallel + selective recomputation 34sbh/t, full recomputation 2sbh.


@pytest.mark.parametrize("name,a,h,layers,t", SHAPES)
def test_table_2_without_parallelism(name, a, h, layers, t):
    one = MegatronShape(seq=S, micro_batch=B, hidden=h, heads=a)
    sbh = S * B * h
    rows = {"none": sbh * (34 + 5 * a * S / h), "selective": 34 * sbh, "full": 2 * sbh}
    for mode, want in rows.items():
        assert sum(layer_activation_items(one, recompute=mode).values()) == pytest.approx(want, rel=1e-9), (name, mode)
    # tensor parallel without sequence parallelism: selective drops exactly the 5as/(ht) term of the
    # tensor-parallel row sbh(10 + 24/t + 5as/(ht)), leaving sbh(10 + 24/t)
    tp_sel = sum(layer_activation_items(one, tensor_parallel=t, recompute="selective").values())
    assert tp_sel == pytest.approx(_paper(a, h, t, "tp") - sbh * 5 * a * S / (h * t), rel=1e-9)


def test_selective_recompute_in_a_plan_drops_only_the_attention_core():
    from dataclasses import replace

    from gpulens.plan.memory import layer_activation_bytes, recomputed_attention_bytes

    # Gemma-2 runs eager attention: selective drops its S x S scores (8 bytes each in bf16: the
    # soft-capping tanh's output, the fp32 softmax and its 16-bit cast) and the repeated K/V
    g = preset("gemma-2-9b")
    b, s = 1, 4096
    full = layer_activation_bytes(g, "bf16", b, s)
    sel = layer_activation_bytes(g, "bf16", b, s, recompute="selective")
    assert full["mlp"] == sel["mlp"] and full["norms"] == sel["norms"]
    a, kv, d = g.num_heads, g.num_kv_heads, g.head_dim
    assert full["attention"] - sel["attention"] == b * a * s * s * 8 + b * s * 2 * (4 * a * d - (2 * a * d + 2 * kv * d))
    assert recomputed_attention_bytes(g, "bf16", b, s) == full["attention"] - sel["attention"]
    # a flash-attention family keeps q, k, v and the output either way: only the log-sum-exp goes
    m = preset("llama-3-8b")
    assert (layer_activation_bytes(m, "bf16", b, s)["attention"]
            - layer_activation_bytes(m, "bf16", b, s, recompute="selective")["attention"]) == b * s * 4 * m.num_heads
    # Megatron's LLaMA layer (flash): the same
    kw = dict(seq=s, micro_batch=b, hidden=m.hidden_size, heads=m.num_heads, kv_heads=m.num_kv_heads,
              head_dim=m.head_dim, intermediate=m.intermediate_size)
    lose = sum(llama_layer_items(**kw).values()) - sum(llama_layer_items(**kw, recompute="selective").values())
    assert lose == 4 * s * b * m.num_heads
    eager = replace(m, attention_impl="eager")
    assert recomputed_attention_bytes(eager, "bf16", b, s) > b * m.num_heads * s * s * 4


def test_selective_recompute_costs_the_attention_core_forward_again():
    from gpulens.plan.speed import train_flops_per_token

    m = preset("llama-3-8b")
    s = 4096
    none, sel, full = (train_flops_per_token(m, s, recompute=r) for r in ("none", "selective", "full"))
    core_forward = 4 * m.num_layers * m.num_heads * m.head_dim * s  # QK^T and attention over V, 2 FLOPs per MAC
    assert sel - none == pytest.approx(core_forward)
    # full also runs every Linear's forward again, but the output head's: it lies outside the checkpointed layers
    assert full - sel == pytest.approx(2 * (m.matmul_params - m.vocab_size * m.hidden_size))
    assert train_flops_per_token(m, s, recompute=True) == full


def test_recompute_options_in_plans():
    base = dict(model="gemma-2-9b", workload="train", gpu="h100-sxm", batch=1, seq=4096, precision="bf16")
    none, sel, full = (plan(PlanRequest(**base, recompute=r)) for r in ("none", "selective", "full"))
    ckpt = plan(PlanRequest(**base, grad_ckpt=True))
    assert full.memory.to_dict() == ckpt.memory.to_dict() and full.speed == ckpt.speed  # full = --grad-ckpt
    assert full.memory.peak_bytes < sel.memory.peak_bytes < none.memory.peak_bytes
    assert none.speed["step_seconds"] < sel.speed["step_seconds"] < full.speed["step_seconds"]
    assert sel.speed["mfu_ratio"] < none.speed["mfu_ratio"]  # the recomputation is not model FLOPs
    # Megatron-style plans take it too (flash: only the log-sum-exp goes, a little)
    mg = dict(model="llama-3-70b", workload="train", gpu="h100-sxm", batch=1, seq=4096, gpus=64, tensor_parallel=8,
              pipeline_parallel=8, sequence_parallel=True, grad_accum=32, zero=1)
    act = [plan(PlanRequest(**mg, recompute=r)).memory.candidates["backward start"] for r in ("none", "selective", "full")]
    assert act[2] < act[1] < act[0]
    with pytest.raises(BadInputError):
        TrainSetup(grad_ckpt=True, selective_recompute=True).validate()


def test_contradictory_recompute_options_are_one_sentence(capsys):
    from gpulens.cli.main import main

    base = ["plan", "--model", "llama-3-8b", "--workload", "train", "--gpu", "h100-sxm"]
    for extra, words in ((["--grad-ckpt", "--recompute", "selective"], "--grad-ckpt recomputes whole layers"),
                         (["--grad-ckpt", "--recompute", "none"], "--grad-ckpt recomputes whole layers"),
                         (["--recompute", "some"], "Unknown recomputation 'some'")):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err
        assert err.strip().splitlines()[0].count(". ") == 0  # one sentence, then the hint
    assert main([*base, "--grad-ckpt", "--recompute", "full", "--format", "json"]) == 0
    assert main(["plan", "--model", "llama-3-8b", "--workload", "infer", "--recompute", "selective"]) == 2
    assert "training option" in capsys.readouterr().err
