"""The headline agrees with the numbers under it, options a plan would ignore are refused, and
tensor parallelism costs what its link costs (issue 25, items 1, 5 and 6)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from gpulens.cli.main import main
from gpulens.cli.plan_render import verdict_line
from gpulens.plan import PlanRequest, plan
from gpulens.plan.catalog import find_gpu
from gpulens.plan.links import ring_all_reduce
from gpulens.plan.memory import FIT_MARGIN_RATIO
from gpulens.plan.models import load_model
from gpulens.plan.serve import ServeSetup, serving_speed
from gpulens.plan.speed import Efficiency

GiB = 1 << 30


def run(capsys, *argv: str) -> tuple[int, str]:
    rc = main(["plan", *argv])
    out, err = capsys.readouterr()
    return rc, out + err


def _card(cfg: Path, capacity_bytes: float) -> None:
    cfg.write_text(yaml.safe_dump({"gpus": [{"name": "testcard", "memory_mib": capacity_bytes / (1 << 20),
                                            "bandwidth_gbps": 1000, "bf16_tflops": 300}]}))


def _peak_and_context(model: str) -> tuple[int, int]:
    mem = plan(PlanRequest(model=model, workload="train", gpu="h200", batch=1, seq=512)).memory
    return mem.peak_bytes, mem.cuda_context_bytes


# ---------------------------------------------------------------- headlines


@pytest.mark.parametrize("request_", [
    PlanRequest(model="llama-3-8b", batch=2, seq=1024),  # PyTorch + transformers
    PlanRequest(model="llama-3-8b", batch=1, gpus=2, pipeline_parallel=2, precision="bf16"),  # Megatron layout
    PlanRequest(model="llama-3-8b", batch=1, finetune="lora", precision="bf16"),
    PlanRequest(model="gemma-2-9b", workload="infer", batch=8, prompt=128, new_tokens=512, gpu="a100-40gb"),
    PlanRequest(model="gemma-2-9b", workload="infer", batch=1, prompt=128, new_tokens=512, gpu="rtx-4090", dtype="int4"),
], ids=["train", "megatron", "lora", "serve-hf", "serve-hf-int4"])
def test_the_peak_is_its_breakdown_and_the_largest_candidate_to_the_byte(request_):
    # the parts are whole bytes, so the candidate totals are too: a fractional KV part once put the
    # listed candidate one byte above the peak it was reported as
    mem = plan(request_).memory
    assert mem.peak_bytes == sum(mem.breakdown.values()) == max(mem.candidates.values())
    assert mem.candidates[mem.peak_at] == mem.peak_bytes


def test_a_no_fit_inside_the_usable_memory_says_the_margin_tipped_it(isolated_plan_config):
    """Before: "needs 47.4 GiB ...; the card has 47.5 usable" under a no-fit, with no word of why."""
    peak, ctx = _peak_and_context("qwen2.5-0.5b")
    _card(isolated_plan_config, peak + ctx + 0.1 * GiB)  # 0.1 GiB more than the peak, less than the margin
    res = plan(PlanRequest(model="qwen2.5-0.5b", workload="train", gpu="testcard", batch=1, seq=512))
    assert not res.fits
    line = verdict_line(res)
    limit = res.memory.capacity_bytes * (1 - FIT_MARGIN_RATIO) - ctx
    assert "Does not fit" in line and f"{FIT_MARGIN_RATIO:.0%} of the card" in line
    assert f"{(peak - limit) / GiB:,.1f} GiB over" in line


def test_a_fit_whose_allocator_cache_would_pass_the_card_says_so(isolated_plan_config, capsys):
    """Before: "✔ Fits" beside "reserved 84.8 GiB" on an 80 GiB card."""
    peak, ctx = _peak_and_context("qwen2.5-0.5b")
    _card(isolated_plan_config, (peak * 1.04 + ctx) / (1 - FIT_MARGIN_RATIO))  # fits; x1.10 reserved does not
    rc, out = run(capsys, "--model", "qwen2.5-0.5b", "--workload", "train", "--gpu", "testcard", "--batch", "1",
                  "--seq", "512")
    assert rc == 0 and "Fits, tightly" in out and "capped by the card" in out


def test_an_engine_verdict_is_what_its_kv_pool_holds():
    res = plan(PlanRequest(model="llama-3-8b", workload="infer", gpu="l4", runtime="vllm", batch=4096,
                           prompt=4000, new_tokens=96))
    assert not res.fits
    assert "KV pool" in verdict_line(res) and "fewer than the batch of 4096" in verdict_line(res)


# ---------------------------------------------------------------- options a plan would ignore


@pytest.mark.parametrize("argv, word", [
    (["--workload", "infer", "--gpus", "2", "--tp", "1"], "--tp 2"),  # accepted silently before
    (["--workload", "infer", "--zero", "3"], "--zero"),
    (["--workload", "infer", "--grad-ckpt"], "--grad-ckpt"),
    (["--workload", "train", "--runtime", "vllm"], "--runtime"),
    (["--workload", "train", "--tpot-target", "50ms"], "--tpot-target"),
    (["--workload", "train", "--lora-rank", "8"], "--finetune lora"),
    (["--workload", "train", "--zero-layout", "deepspeed"], "--zero"),
    # planned as plain replicas under a "ZeRO-2" header before
    (["--workload", "train", "--precision", "bf16", "--finetune", "lora", "--gpus", "4", "--zero", "2"], "--zero"),
    # SGD keeps no moments: the option was ignored
    (["--workload", "train", "--precision", "bf16", "--finetune", "lora", "--optimizer", "sgd",
      "--lora-optimizer-dtype", "fp32"], "--optimizer adamw"),
    (["--workload", "train", "--precision", "bf16", "--finetune", "lora", "--no-qlora-double-quant"], "qlora"),
    (["--workload", "infer", "--dtype", "int8", "--int4-group-size", "32"], "--dtype int4"),
    # each of these left the plan the same to the byte before (a run of every option against nine set-ups)
    (["--workload", "train", "--gpus", "2", "--tp", "2", "--precision", "bf16", "--optimizer", "adafactor"], "--optimizer adamw"),
    (["--workload", "infer", "--max-num-batched-tokens", "4096"], "--runtime vllm"),
    (["--workload", "infer", "--runtime", "vllm", "--nccl-communicators", "2"], "--tp 2"),
    (["--workload", "infer", "--nccl-record-streams"], "--tp 2"),
    (["--workload", "infer", "--no-tp-shards-head"], "--tp 2"),
    (["--workload", "infer", "--quantize-head"], "--dtype int8"),
    (["--workload", "infer", "--runtime", "vllm", "--batch", "16", "--prefill-chunk-tokens", "512"], "--target-rps"),
    (["--workload", "train", "--assume-dense"], "Drop --assume-dense"),
])
def test_option_combinations_that_mean_nothing_are_refused(capsys, argv, word):
    rc, out = run(capsys, "--model", "qwen2.5-0.5b", *argv)
    assert rc == 2 and word in out and "Traceback" not in out


@pytest.mark.parametrize("argv", [
    ["--workload", "infer", "--tp", "2", "--runtime", "vllm", "--nccl-communicators", "2", "--nccl-record-streams"],
    ["--workload", "infer", "--tp", "2", "--runtime", "vllm", "--no-tp-shards-head", "--dtype", "int8", "--quantize-head"],
    ["--workload", "infer", "--runtime", "vllm", "--ttft-target", "1s", "--prefill-chunk-tokens", "512"],
    ["--workload", "train", "--gpus", "2", "--tp", "2", "--precision", "bf16", "--optimizer", "adamw"],
])
def test_the_same_options_where_they_mean_something_are_planned(capsys, argv):
    rc, out = run(capsys, "--model", "qwen2.5-0.5b", *argv)
    assert rc == 0, out


def test_serving_on_n_gpus_is_still_tensor_parallel_n(capsys):
    rc, out = run(capsys, "--model", "qwen2.5-0.5b", "--workload", "infer", "--gpus", "2", "--format", "json")
    assert rc == 0 and json.loads(out)["setup"]["tensor_parallel"] == 2
    rc, out = run(capsys, "--model", "qwen2.5-0.5b", "--workload", "infer", "--gpus", "2", "--tp", "2")
    assert rc == 0


# ---------------------------------------------------------------- a config file's name


def test_a_config_is_named_by_its_name_or_path_else_by_the_file(tmp_path):
    src = tmp_path / "snapshots" / "3f2a9c" / "config.json"
    src.parent.mkdir(parents=True)
    cfg = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
           "num_key_value_heads": 8, "intermediate_size": 1024, "vocab_size": 1000, "max_position_embeddings": 2048}
    src.write_text(json.dumps(cfg))
    assert load_model(src.parent).name == str(src)  # before: "3f2a9c", the folder
    src.write_text(json.dumps(cfg | {"_name_or_path": "acme/tiny-llama"}))
    assert load_model(src).name == "acme/tiny-llama"


# ---------------------------------------------------------------- tensor parallelism by link


def _tpot(tp: int, **kw) -> object:
    m = load_model("llama-3-70b")
    setup = ServeSetup(runtime="vllm", batch=8, prompt_tokens=512, new_tokens=128, tensor_parallel=tp, **kw)
    return serving_speed(m, setup, find_gpu("h100-sxm"), Efficiency())


def test_tp16_across_two_nodes_is_slower_per_token_than_tp8_in_one_and_the_link_is_why():
    """Before: a flat 10 us per all-reduce made TP16 over InfiniBand faster than TP8 over NVLink."""
    m, gpu = load_model("llama-3-70b"), find_gpu("h100-sxm")
    tp8, tp16 = _tpot(8), _tpot(16)
    assert tp16.tpot_seconds > tp8.tpot_seconds
    assert "NVLink" in tp8.tensor_parallel_link and "inter-node" in tp16.tensor_parallel_link
    # the same sixteen GPUs in one NVSwitch domain (gpus_per_node=16): only the link changes, and
    # TP16 is then faster than TP8, so the whole difference is the inter-node link's term
    one_domain = _tpot(16, gpus_per_node=16)
    assert one_domain.tpot_seconds < tp8.tpot_seconds
    msg = 8 * m.hidden_size * 2  # batch x hidden x bf16
    link_term = 2 * m.num_layers * (ring_all_reduce(msg, 16, gpu).seconds
                                    - ring_all_reduce(msg, 16, gpu, gpus_per_node=16).seconds)
    assert link_term > tp16.tpot_seconds - tp8.tpot_seconds > 0
    assert tp16.tpot_seconds - one_domain.tpot_seconds == pytest.approx(link_term, rel=1e-9)


def test_the_serving_plan_names_the_link_its_all_reduces_run_over(capsys):
    """Issue 25: TP16 across two nodes is slower per token than TP8 in one, and the plan says why."""
    args = ["--model", "llama-3-70b", "--workload", "infer", "--gpu", "h100-sxm", "--runtime", "vllm", "--batch", "8"]
    rc8, out8 = run(capsys, *args, "--tp", "8")
    rc16, out16 = run(capsys, *args, "--tp", "16")
    assert rc8 == 0 and rc16 == 0
    flat8, flat16 = " ".join(out8.split()), " ".join(out16.split())  # a narrow terminal wraps the row
    assert "all-reduces" in flat8 and "all-reduces" in flat16
    assert "NVLink" in flat8 and "inter-node" not in flat8
    assert "inter-node network" in flat16


def _tpot_ms(capsys, *argv: str) -> tuple[float, str]:
    rc, out = run(capsys, "--model", "llama-3-70b", "--workload", "infer", "--gpu", "h100-sxm", "--batch", "8",
                  "--format", "json", *argv)
    assert rc == 0
    res = json.loads(out)
    return res["speed"]["tpot_seconds"] * 1000, res["setup"]["runtime"]


def test_a_sharded_replica_without_runtime_is_planned_on_an_engine_so_tp16_is_slower(capsys):
    """As a new user types it (no --runtime): TP16 over two nodes is slower per token than TP8."""
    tp8, rt8 = _tpot_ms(capsys, "--tp", "8")
    tp16, rt16 = _tpot_ms(capsys, "--tp", "16")
    assert rt8 == rt16 == "vllm" and tp16 > tp8
    assert _tpot_ms(capsys, "--tp", "8", "--runtime", "vllm")[0] == tp8  # the same plan as naming vLLM
    assert _tpot_ms(capsys)[1] == "hf"  # one GPU keeps transformers' generate
    rc, out = run(capsys, "--model", "llama-3-70b", "--workload", "infer", "--gpu", "h100-sxm", "--tp", "16")
    assert rc == 0 and "No --runtime given" in " ".join(out.split())
    rc, out = run(capsys, "--model", "llama-3-70b", "--workload", "infer", "--gpu", "h100-sxm", "--tp", "16",
                  "--runtime", "hf")
    flat = " ".join(out.split())
    assert rc == 0 and 'tp_plan="auto"' in flat and "one node" in flat and "No --runtime given" not in flat
    rc = main(["plan", "compare", "--model", "llama-3-70b", "--workload", "infer", "--gpu", "h100-sxm", "--gpu",
               "a100-80gb", "--gpus", "4"])
    assert rc == 0 and "serve · vllm · TP 4 · compared on 2 GPUs" in capsys.readouterr().out


def test_a_tp_group_wider_than_a_node_is_shown_its_one_node_alternative(capsys):
    def tips(*argv: str) -> list[dict]:
        rc, out = run(capsys, "--model", "llama-3-70b", "--workload", "infer", "--gpu", "h100-sxm", "--batch", "8",
                      "--format", "json", *argv)
        assert rc == 0
        return [a for a in json.loads(out)["advice"] if "spans" in a["text"]]

    (tip,) = tips("--tp", "16")
    assert tip["change"] == {"tensor_parallel": 8}
    assert "TP 16 spans 2 nodes" in tip["text"] and "10.9 ms" in tip["text"] and "2 replicas" in tip["text"]
    assert tips("--tp", "8") == [] and tips("--tp", "16", "--gpus-per-node", "16") == []  # one node: nothing to trade
    (eager,) = tips("--tp", "16", "--runtime", "hf")  # eager TP16 is faster per token: no replicas are promised
    assert "43.1 ms" in eager["text"] and "replicas" not in eager["text"]


def test_the_all_reduce_grows_with_size_degree_and_link():
    gpu = find_gpu("h100-sxm")
    small, big = ring_all_reduce(16 << 10, 8, gpu), ring_all_reduce(64 << 20, 8, gpu)
    assert small.protocol == "LL" and big.protocol == "Simple" and big.seconds > small.seconds
    assert ring_all_reduce(16 << 10, 4, gpu).seconds < small.seconds < ring_all_reduce(16 << 10, 16, gpu).seconds
    # alpha-beta: 2 (t - 1) steps of latency; 2 (t - 1) / t of the message over the slowest link
    assert big.transfer_seconds == pytest.approx(2 * 7 / 8 * (64 << 20) / (450e9 * 20.6 / 25))  # NCCL's app-level NVLink rate
    assert ring_all_reduce(1 << 20, 1, gpu).seconds == 0.0


def test_the_prefill_pays_its_all_reduces_too():
    tp8 = _tpot(8)
    assert tp8.prefill_tensor_parallel_seconds > 0
    assert replace(tp8).ttft_seconds >= tp8.prefill_tensor_parallel_seconds


# ---------------------------------------------------------------- vLLM's profiling at TP > 1


def test_record_stream_keeps_every_all_reduced_activation_of_the_profiling_forward():
    """vLLM <= 0.2.6 on PyTorch's NCCL process group with record_stream: the 2 L + 1 all-reduced
    activations (tokens x hidden x 2 bytes each) stay reserved through the profiling forward, and
    the KV pool is that much smaller; not at TP 1, not with the flag off."""
    from gpulens.plan.serve import serving_memory

    m, gpu = load_model("llama-2-70b"), find_gpu("a100-80gb")
    base = ServeSetup(runtime="vllm", tensor_parallel=4, max_num_batched_tokens=4096)
    off = serving_memory(m, base, capacity_bytes=gpu.memory_bytes, eff=Efficiency())
    on = serving_memory(m, replace(base, nccl_record_streams=True), capacity_bytes=gpu.memory_bytes, eff=Efficiency())
    held = (2 * m.num_layers + 1) * 4096 * m.hidden_size * 2
    assert "nccl_held_activations" not in off.breakdown
    assert on.breakdown["nccl_held_activations"] == held
    assert off.breakdown["kv_cache"] - on.breakdown["kv_cache"] == pytest.approx(held, abs=2)
    tp1 = replace(base, tensor_parallel=1, nccl_record_streams=True)
    assert "nccl_held_activations" not in serving_memory(m, tp1, capacity_bytes=gpu.memory_bytes, eff=Efficiency()).breakdown


def test_each_nccl_communicator_takes_its_buffers_out_of_the_kv_pool():
    """NVIDIA/nccl issue #964: one communicator of 3-4 A100s holds 688 MB per GPU, of 2 GPUs 544 MB,
    outside PyTorch; vLLM reads free device memory, so its pool loses that per communicator (vLLM
    0.2.x: 2, the default group's warm-up and the TP group). Nothing at TP 1 or for hf."""
    from gpulens.plan.links import nccl_communicator_bytes
    from gpulens.plan.serve import serving_memory

    assert (nccl_communicator_bytes(1), nccl_communicator_bytes(2), nccl_communicator_bytes(8)) == (0, 544 << 20, 688 << 20)
    m, gpu = load_model("llama-2-70b"), find_gpu("a100-80gb")
    base = ServeSetup(runtime="vllm", tensor_parallel=4)
    one = serving_memory(m, base, capacity_bytes=gpu.memory_bytes, eff=Efficiency())
    two = serving_memory(m, replace(base, nccl_communicators=2), capacity_bytes=gpu.memory_bytes, eff=Efficiency())
    assert one.breakdown["nccl_buffers"] == 688 << 20 and two.breakdown["nccl_buffers"] == 2 * (688 << 20)
    assert one.breakdown["kv_cache"] - two.breakdown["kv_cache"] == pytest.approx(688 << 20, abs=2)
    tp1 = serving_memory(m, replace(base, tensor_parallel=1, nccl_communicators=2), capacity_bytes=gpu.memory_bytes,
                         eff=Efficiency())
    assert "nccl_buffers" not in tp1.breakdown


def test_an_engine_that_splits_only_the_blocks_reads_the_whole_head_on_every_gpu():
    """gpt-fast's apply_tp shards model.layers only: each of the t GPUs reads the output head whole,
    (t - 1) head reads more per step than an engine that splits it (vLLM); nothing changes at TP 1."""
    from gpulens.plan.serve import decode_head_bytes

    m, gpu, eff = load_model("llama-2-7b"), find_gpu("a100-80gb"), Efficiency()
    base = ServeSetup(runtime="vllm", batch=1, prompt_tokens=5, new_tokens=100, tensor_parallel=8)
    split, whole = serving_speed(m, base, gpu, eff), serving_speed(m, replace(base, tp_shards_head=False), gpu, eff)
    bw = gpu.memory_bandwidth_bytes_per_second * eff.runtime("vllm").decode_bandwidth_ratio * 8
    assert decode_head_bytes(m, 1) == pytest.approx(m.vocab_size * m.hidden_size * 2 + m.hidden_size * 2, rel=1e-3)
    assert whole.tpot_seconds - split.tpot_seconds == pytest.approx(7 * decode_head_bytes(m, 1) / bw)
    tp1 = replace(base, tensor_parallel=1)
    assert serving_speed(m, tp1, gpu, eff).tpot_seconds == serving_speed(m, replace(tp1, tp_shards_head=False), gpu, eff).tpot_seconds


def test_a_quantized_head_is_read_in_the_weight_format_and_dequantized():
    """gpt-fast's quantize.py replaces every nn.Linear, the output head included; by default the head
    stays 16-bit (GPTQ/AWQ checkpoints). int8: the head's bytes halve (plus one fp16 scale per row)."""
    from gpulens.plan.serve import dequantize_seconds, head_quantization_saving, serving_memory

    m, gpu, eff = load_model("llama-2-7b"), find_gpu("a100-80gb"), Efficiency()
    s = ServeSetup(runtime="vllm", dtype="int8", batch=1, prompt_tokens=5, new_tokens=100)
    q = replace(s, quantize_head=True)
    head = m.vocab_size * m.hidden_size
    assert head_quantization_saving(m, s) == 0.0
    assert head_quantization_saving(m, q) == pytest.approx(head - m.vocab_size * 2)
    assert head_quantization_saving(m, replace(q, dtype="bf16")) == 0.0
    mem = serving_memory(m, s, capacity_bytes=gpu.memory_bytes, eff=eff).breakdown["weights"]
    assert mem - serving_memory(m, q, capacity_bytes=gpu.memory_bytes, eff=eff).breakdown["weights"] == pytest.approx(
        head - m.vocab_size * 2, abs=2)
    assert dequantize_seconds(m, q, gpu) - dequantize_seconds(m, s, gpu) == pytest.approx(3 * head / gpu.fp32_flops)


def test_int4_scales_follow_the_group_size():
    """One fp16 scale and one fp16 zero point per group (gpt-fast's quantize.py packs both in bf16):
    4 bytes per 128 block weights by default, per 32 with --int4-group-size 32 (gpt-fast's figures),
    read every decode step and held in memory."""
    from gpulens.plan.serve import decode_weight_bytes, serving_memory, weight_bytes

    m, gpu, eff = load_model("llama-2-7b"), find_gpu("a100-80gb"), Efficiency()
    assert weight_bytes(m, "int4", 32) - weight_bytes(m, "int4") == pytest.approx(m.block_params * (4 / 32 - 4 / 128))
    assert decode_weight_bytes(m, "int4", 1, 32) - decode_weight_bytes(m, "int4", 1) == pytest.approx(
        m.block_params * (4 / 32 - 4 / 128))
    assert weight_bytes(m, "int8", 32) == weight_bytes(m, "int8")
    s = ServeSetup(runtime="vllm", dtype="int4", batch=1, prompt_tokens=5, new_tokens=100)
    g32 = replace(s, int4_group_size=32)
    assert serving_speed(m, g32, gpu, eff).tpot_seconds > serving_speed(m, s, gpu, eff).tpot_seconds
    w = serving_memory(m, g32, capacity_bytes=gpu.memory_bytes, eff=eff).breakdown["weights"]
    assert w - serving_memory(m, s, capacity_bytes=gpu.memory_bytes, eff=eff).breakdown["weights"] == pytest.approx(
        m.block_params * (4 / 32 - 4 / 128), abs=2)


def test_a_plan_says_how_its_kind_of_prediction_fared_on_published_figures(capsys, tmp_path):
    """Training and serving plans state the published figures' median and worst error for what they
    predict (text and JSON); a calibrated GPU's speed answers to its own calibration instead."""
    rc, out = run(capsys, "--model", "llama-3-8b", "--gpu", "h100", "--batch", "1", "--seq", "1024", "--grad-ckpt",
                  "--finetune", "lora")
    assert rc == 0
    flat = " ".join(out.split())
    assert "Accuracy: training throughput against 222 published measurements" in flat and "worst 42.8%" in flat
    assert "Accuracy: LoRA / QLoRA memory against 7" in flat
    rc, out = run(capsys, "--model", "mixtral-8x7b", "--workload", "infer", "--gpu", "h100", "--gpus", "2",
                  "--runtime", "vllm", "--format", "json")
    assert rc == 0
    assert [a["kind"] for a in json.loads(out)["accuracy"]] == ["moe", "serving_memory"]
    req = PlanRequest(model="llama-3-8b", workload="train", gpu="h100", batch=1, seq=1024)
    assert [a.kind for a in plan(req, calibration_path=tmp_path / "none.json").accuracy] == ["training_time"]
    calibrated = tmp_path / "calibration.json"
    calibrated.write_text(json.dumps({"version": 1, "gpus": {"H100-SXM": Efficiency().to_dict()}}))
    assert plan(req, calibration_path=calibrated).efficiency.calibrated
    assert plan(req, calibration_path=calibrated).accuracy == []
