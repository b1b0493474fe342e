"""Inputs the planner must refuse (exit 2, with what to do) or plan correctly: context past the
model's positions, tensor-parallel degrees that do not divide the heads, unknown model types."""

from __future__ import annotations

import json

import pytest

from gpulens.cli.main import main
from gpulens.plan import PlanRequest, from_hf_config, plan
from gpulens.plan.models import UnknownModelTypeError

# DeepSeek-V2-Lite's config.json (the fields the planner reads; MLA and its MoE are not a dense LLaMA)
DEEPSEEK_V2_LITE = {
    "model_type": "deepseek_v2", "hidden_size": 2048, "num_hidden_layers": 27, "num_attention_heads": 16,
    "num_key_value_heads": 16, "intermediate_size": 10944, "moe_intermediate_size": 1408, "vocab_size": 102400,
    "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1, "kv_lora_rank": 512,
    "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "max_position_embeddings": 163840,
}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["plan", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_gpt2_past_its_1024_positions_is_refused(capsys):
    rc, out, err = run(capsys, "--model", "gpt2", "--workload", "train", "--seq", "8192", "--gpu", "h100-sxm")
    assert rc == 2
    assert "1,024" in out + err and "--seq" in out + err
    assert run(capsys, "--model", "gpt2", "--workload", "train", "--seq", "1024", "--batch", "1")[0] == 0


def test_serving_context_counts_prompt_and_new_tokens():
    with pytest.raises(Exception, match="at most 1,024"):
        plan(PlanRequest(model="gpt2", workload="infer", prompt=1000, new_tokens=100))


def test_rope_scaling_extends_the_context():
    base = {"model_type": "qwen2", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 32768}
    assert from_hf_config(base).max_context == 32768
    yarn = base | {"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
    m = from_hf_config(yarn)
    assert m.max_context == 131072 and m.max_positions == 32768
    plan(PlanRequest(model="x", workload="train", seq=65536, batch=1, grad_ckpt=True), model=m)  # accepted
    llama3 = base | {"max_position_embeddings": 131072,
                     "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}}
    assert from_hf_config(llama3).max_context == 131072  # already the extended length


@pytest.mark.parametrize("model,tp", [("llama-3-8b", "3"), ("qwen2-7b", "16"), ("qwen2-7b", "8")])
def test_tensor_parallel_must_divide_the_heads(capsys, model, tp):
    rc, out, err = run(capsys, "--model", model, "--workload", "infer", "--runtime", "vllm", "--tp", tp)
    assert rc == 2
    assert "heads" in out + err and "--tp" in out + err


def test_tensor_parallel_that_replicates_kv_heads_is_accepted(capsys):
    # Llama-3-8B: 32 heads, 8 KV heads; vLLM takes TP 2, 4, 8 (split) and 16, 32 (KV replicated)
    for tp in ("2", "8", "16"):
        assert run(capsys, "--model", "llama-3-8b", "--workload", "infer", "--runtime", "vllm", "--tp", tp)[0] == 0


def test_unknown_model_type_is_refused_with_the_supported_list(tmp_path, capsys):
    hybrid = {**DEEPSEEK_V2_LITE, "model_type": "jamba"}  # a Mamba/attention hybrid: no family here
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(hybrid))
    with pytest.raises(UnknownModelTypeError) as e:
        from_hf_config(hybrid)
    assert "jamba" in str(e.value) and "llama" in e.value.hint and "--assume-dense" in e.value.hint
    rc, out, err = run(capsys, "--model", str(cfg), "--workload", "infer")
    assert rc == 2 and "--assume-dense" in out + err


def test_assume_dense_plans_it_and_warns(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**DEEPSEEK_V2_LITE, "model_type": "brand_new_lm"}))
    rc, out, _ = run(capsys, "--model", str(cfg), "--workload", "infer", "--assume-dense", "--format", "json")
    assert rc == 0
    d = json.loads(out)
    assert d["model"]["assumed_dense"] is True
    assert any("not a family the planner models" in n for n in d["notes"])


def _train_json(capsys, *argv: str) -> dict:
    rc, out, _ = run(capsys, "--model", "llama-3-70b", "--workload", "train", "--batch", "1", "--seq", "4096",
                     "--grad-ckpt", "--zero", "3", "--format", "json", *argv)
    assert rc == 0
    return json.loads(out)["speed"]


def test_across_nodes_the_gradients_cross_the_network(capsys):
    one_node = _train_json(capsys, "--gpus", "8")
    assert one_node["nodes"] == 1 and "NVLink" in one_node["communication_link"]
    assert one_node["communication_link_bytes_per_second"] == 450e9  # 900 GB/s is both directions together
    big = _train_json(capsys, "--gpus", "512")
    assert big["nodes"] == 64 and big["communication_link_bytes_per_second"] == 50e9
    # ZeRO-3 gathers and reduce-scatters one block at a time over the node's eight 50 GB/s NICs
    # together (one NCCL ring per NIC): each block's collectives hide behind its compute, leaving the
    # first gather and the last reduce-scatter exposed, the rest costing only the compute it slows
    # (plan/overlap.py: half its time on an H100); it was ~13.7 s when the whole model's gradients
    # went through one NIC per ring
    assert 0 < big["communication_seconds"] < 2.0
    slower = _train_json(capsys, "--nodes", "64", "--inter-node-gbps", "12.5")  # 100 GbE: no longer hidden
    assert slower["communication_seconds"] > 4 * big["communication_seconds"]


def test_nodes_and_gpus_must_agree(capsys):
    rc, out, err = run(capsys, "--model", "llama-3-8b", "--gpus", "16", "--nodes", "4")
    assert rc == 2 and "--gpus-per-node" in out + err


@pytest.mark.parametrize(("argv", "words"), [
    (["--gpus", "8", "--inter-node-gbps", "25"], "this plan's 8 GPUs fit in one node of 8"),
    (["--nodes", "1", "--inter-node-gbps", "25"], "this plan's 8 GPUs fit in one node of 8"),
    (["--gpus", "4", "--gpus-per-node", "4"], "--gpus-per-node 4 changes nothing here"),
    (["--workload", "infer", "--inter-node-gbps", "25"], "this plan runs on one GPU"),
    (["--workload", "infer", "--tp", "4", "--gpus-per-node", "16"], "this plan's 4 GPUs fit in one node either way"),
    # qwen2.5-7b's 28 heads stop a replica plan at TP 4
    (["--workload", "infer", "--target-rps", "2", "--gpus-per-node", "4"], "the widest replica its replica plan tries (4 GPUs)"),
])
def test_the_cluster_options_are_refused_within_one_node(capsys, argv, words):
    rc, out, err = run(capsys, "--model", "qwen2.5-7b", "--batch", "1", *argv)
    assert rc == 2 and words in err, err


@pytest.mark.parametrize("argv", [
    ["--gpus", "16", "--inter-node-gbps", "25"], ["--gpus", "8", "--gpus-per-node", "4"], ["--nodes", "2", "--gpus-per-node", "4"],
    ["--workload", "infer", "--tp", "4", "--gpus-per-node", "2"], ["--workload", "infer", "--target-rps", "2", "--gpus-per-node", "2"],
])
def test_the_cluster_options_are_taken_where_a_plan_crosses_nodes(capsys, argv):
    rc, out, err = run(capsys, "--model", "qwen2.5-7b", "--batch", "1", *argv)
    assert rc == 0, err


def test_zero_layout_is_named_and_checked(capsys):
    rc, out, _ = run(capsys, "--model", "llama-2-7b", "--gpus", "8", "--zero", "2", "--zero-layout", "deepspeed",
                     "--batch", "1", "--format", "json")
    assert rc == 0
    d = json.loads(out)
    assert d["setup"]["zero_layout"] == "deepspeed" and any("deepspeed layout" in n for n in d["notes"])
    rc, out, err = run(capsys, "--model", "llama-2-7b", "--gpus", "8", "--zero", "2", "--zero-layout", "megatron")
    assert rc == 2 and "fsdp" in out + err


def test_deepseek_v2_lite_is_planned_as_mla_and_moe():
    m = from_hf_config(DEEPSEEK_V2_LITE, name="deepseek-v2-lite")
    assert m.params == pytest.approx(15.7e9, rel=0.01)  # published: 15.7 B total
    # published: 2.4 B activated (the output head counted, the input lookup not)
    assert m.active_params - m.vocab_size * m.hidden_size == pytest.approx(2.4e9, rel=0.03)
    assert m.kv_bytes_per_token(2) == 27 * (512 + 64) * 2  # MLA latent: ~31 KB per token, not 221 KB
    res = plan(PlanRequest(model="x", workload="infer", runtime="vllm", batch=1), model=m)
    assert res.fits and res.speed["kv_cache_bytes_per_token"] == 31104
    with pytest.raises(Exception, match="latent attention"):
        plan(PlanRequest(model="x", workload="train", batch=1), model=m)


def test_mla_decode_reads_the_latent_in_an_engine_and_decompresses_it_in_transformers():
    m = from_hf_config(DEEPSEEK_V2_LITE, name="deepseek-v2-lite")
    long = dict(model="x", workload="infer", batch=32, prompt=8000, new_tokens=100)
    vllm = plan(PlanRequest(**long, runtime="vllm"), model=m).speed["tpot_seconds"]
    hf = plan(PlanRequest(**long, runtime="hf"), model=m).speed["tpot_seconds"]
    assert hf > 3 * vllm


def test_lora_without_precision_plans_the_16_bit_base_and_an_explicit_autocast_is_refused(capsys):
    # --precision defaults to amp_bf16 for full training; LoRA keeps its frozen base in 16-bit, so there it
    # defaults to bf16 (the setting the refusal below names) rather than refusing the user's own defaults
    rc, out, err = run(capsys, "--model", "llama-3-8b", "--finetune", "lora", "--batch", "1", "--format", "json")
    assert rc == 0, err
    assert json.loads(out)["setup"]["precision"] == "bf16"
    rc, out, err = run(capsys, "--model", "llama-3-8b", "--batch", "1", "--format", "json")
    assert rc == 0 and json.loads(out)["setup"]["precision"] == "amp_bf16"
    rc, out, err = run(capsys, "--model", "llama-3-8b", "--finetune", "qlora", "--precision", "amp_bf16")
    assert rc == 2 and "--precision bf16" in out + err
