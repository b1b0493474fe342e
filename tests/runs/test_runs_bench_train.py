"""`gpulens bench train` on the CPU: a tiny real PyTorch run, recorded as a run with its fingerprint."""

from __future__ import annotations

import json

import pytest

from gpulens.cli.main import main
from gpulens.errors import BadInputError
from gpulens.runs import get_run, list_runs
from gpulens.store import Store

torch = pytest.importorskip("torch")

from gpulens.bench.train import (  # noqa: E402
    SweepPoint,
    TrainBenchConfig,
    build_model,
    find_knee,
    flops_per_token,
    run_train_bench,
    sweep_batch,
)

TINY = ["--size", "tiny", "--seq-len", "32", "--batch-size", "2", "--warmup", "1", "--steps", "6", "--precision", "fp32", "--device", "cpu"]


def test_bench_train_cli_records_a_run_with_its_fingerprint(store_path, capsys):
    assert main(["bench", "train", *TINY, "--store", str(store_path), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    with Store(store_path) as st:
        (run,) = list_runs(st)
        run = get_run(st, run.id)
    assert out["run_id"] == run.id and run.kind == "bench-train" and run.name == "tiny-fp32-cpu"
    assert len(run.samples["step_seconds"]) == 6 and all(s > 0 for s in run.samples["step_seconds"])
    assert run.fingerprint["packages"]["torch"] == torch.__version__ and "python" in run.fingerprint
    assert run.config["layers"] == 2 and run.config["device"] == "cpu"
    s = run.summary
    assert s["tokens_per_step"] == 64 and s["tokens_per_second"] == pytest.approx(64 / s["step_seconds_median"])
    assert 0 < s["mfu_ratio"] < 1 and "estimate" in s["peak"]["source"]  # a CPU peak is labelled as an estimate
    assert s["peak_memory_bytes"] > 0


def test_second_run_records_the_config_change_and_compares(store_path, capsys):
    assert main(["bench", "train", *TINY, "--store", str(store_path), "--name", "t"]) == 0
    args = [*TINY, "--grad-ckpt", "--store", str(store_path), "--name", "t"]
    assert main(["bench", "train", *args]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "activation checkpointing" in out and "recorded as run #2" in out
    # the first run has nothing to compare with, so its hint is not `compare baseline 1` (which refuses)
    assert "recorded as run #1" in out and "the first of its kind and name" in out
    assert "compare baseline 1`" not in out and "compare baseline 2`" in out
    rc = main(["compare", "1", "2", "--store", str(store_path), "--format", "json", "--no-record"])
    d = json.loads(capsys.readouterr().out)
    assert rc in (0, 1) and [c["key"] for c in d["config_changes"]] == ["grad_checkpointing"]
    assert {m["metric"] for m in d["metrics"]} == {"step_seconds", "tokens_per_second"}


def test_no_record(store_path, capsys):
    assert main(["bench", "train", *TINY, "--no-record", "--store", str(store_path)]) == 0
    assert not store_path.exists()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--size", "huge"], "unknown model size"),
        (["--hidden", "100", "--heads", "3"], "multiple of --heads"),
        (["--steps", "1"], "at least 2"),
        (["--precision", "fp8"], "unknown precision"),
        (["--device", "tpu"], "unknown device"),
        # a 0 was taken as "not given" and replaced by the size's value (or 8): the benchmark ran
        (["--layers", "0"], "--layers must be at least 1"),
        (["--hidden", "0"], "--hidden must be at least 8"),
        (["--heads", "0"], "--heads must be at least 1"),
        (["--batch-size", "0"], "--batch-size must be at least 1"),
        (["--batch-size", "0", "--sweep-batch"], "--batch-size must be at least 1"),
    ],
)
def test_bad_arguments(store_path, capsys, args, needle):
    assert main(["bench", "train", *TINY, *args, "--store", str(store_path)]) == 2
    assert needle in " ".join(capsys.readouterr().err.lower().split())


def test_flops_per_token_matches_the_parameter_count():
    layers, hidden = 2, 64
    model = build_model(torch, layers, hidden, 4, 4, False)
    n = sum(p.numel() for p in model.parameters())
    # 12 h^2 + 13 h per block (qkv, proj, 2 MLP matrices, biases, 2 LayerNorms) + the final LayerNorm
    assert n == layers * (12 * hidden**2 + 13 * hidden) + 2 * hidden
    assert flops_per_token(n, layers, hidden, 128) == 6 * n + 12 * layers * hidden * 128


def test_grad_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    plain = build_model(torch, 2, 32, 4, 4, False)
    ckpt = build_model(torch, 2, 32, 4, 4, True)
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(2, 8, 32)
    for m in (plain, ckpt):
        m(x).pow(2).mean().backward()
    for p, q in zip(plain.parameters(), ckpt.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-6)


def test_sweep_on_cpu_stops_at_max_batch():
    cfg = TrainBenchConfig(size="tiny", seq_len=16, warmup_steps=1, steps=2, precision="fp32", device="cpu")
    sw = sweep_batch(cfg, max_batch=4)
    assert [p.batch_size for p in sw.points] == [1, 2, 4] and all(p.fits for p in sw.points)
    assert sw.largest_fitting_batch == 4 and "max-batch 4" in sw.stopped_because
    assert sw.knee_batch in (1, 2, 4) and sw.best is not None and sw.best.config["batch_size"] == sw.knee_batch
    with pytest.raises(BadInputError, match="empty"):
        sweep_batch(cfg, max_batch=0)


def test_knee_is_where_doubling_stops_paying():
    pts = [SweepPoint(b, True, tps) for b, tps in ((1, 100.0), (2, 190.0), (4, 350.0), (8, 360.0), (16, 365.0))]
    assert find_knee(pts, 0.05) == 4
    assert find_knee(pts + [SweepPoint(32, False)], 0.05) == 4
    assert find_knee(pts[:1], 0.05) == 1 and find_knee([], 0.05) is None


def test_gpu_peak_comes_from_the_planner_catalog():
    from gpulens.bench.train import peak_flops

    p = peak_flops(torch, torch.device("cuda"), "NVIDIA H200", "bf16")
    assert p.flops_per_second == pytest.approx(989.5e12, rel=0.01) and "catalog" in p.source
    assert peak_flops(torch, torch.device("cuda"), "Some Unknown Accelerator", "bf16") is None


def test_sweep_from_the_cli(store_path, capsys):
    args = ["--size", "tiny", "--seq-len", "16", "--warmup", "1", "--steps", "2", "--precision", "fp32", "--device", "cpu"]
    assert main(["bench", "train", *args, "--sweep-batch", "--max-batch", "4", "--store", str(store_path), "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [p["batch_size"] for p in d["sweep"]["points"]] == [1, 2, 4] and d["sweep"]["largest_fitting_batch"] == 4
    with Store(store_path) as st:
        assert get_run(st, d["run_id"]).kind == "bench-train-sweep"


def test_cuda_asked_without_a_gpu_is_exit_3(store_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(Exception) as e:
        run_train_bench(TrainBenchConfig(size="tiny", device="cuda"))
    assert getattr(e.value, "exit_code", None) == 3 and "--device cpu" in str(e.value)


@pytest.mark.gpu
def test_on_a_gpu_bf16_reports_mfu_against_the_datasheet_peak():
    r = run_train_bench(TrainBenchConfig(size="small", seq_len=256, batch_size=8, warmup_steps=2, steps=5, device="cuda"))
    assert r.device.startswith("cuda") and r.peak is not None and 0 < r.mfu_ratio < 1
    assert r.peak_memory_source.startswith("cuda") and r.peak_memory_bytes > 0


def test_a_smaller_batch_is_not_called_a_faster_step(store_path, capsys):
    """Batch 4, then batch 2: the step takes less time because it does half the work. `compare` shows
    step time as not comparable and judges tokens/s; the automatic baseline of a later batch-4 run is
    the batch-4 run, even after the comparison (threshold 900 %: surely no change) marked batch 2 good."""
    store = ["--store", str(store_path)]
    batch = TINY.index("--batch-size") + 1
    four, two = [*TINY[:batch], "4", *TINY[batch + 1:]], TINY
    assert main(["bench", "train", *four, *store]) == 0
    assert "the next run with the same settings is compared against it" in " ".join(capsys.readouterr().out.split())
    assert main(["bench", "train", *two, *store]) == 0
    capsys.readouterr()
    assert main(["compare", "1", "2", *store, "--threshold", "900%"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    # the table's verdict cell may wrap beside its neighbours ("not better comparable"): the reason line says it whole
    assert "batch_size differs: 4 → 2: a step does different work in A and B" in out and "config: batch_size: 4 → 2" in out
    assert "improvement" not in out and "verdict: no change" in out
    with Store(store_path) as st:
        assert get_run(st, 2).verdict == "good"
    assert main(["bench", "train", *four, *store]) == 0
    capsys.readouterr()
    main(["compare", "3", *store, "--format", "json", "--no-record"])
    d = json.loads(capsys.readouterr().out)
    assert (d["a"]["id"], d["b"]["id"]) == (1, 3) and d["config_changes"] == []
    assert {m["metric"]: m["verdict"] for m in d["metrics"]}["step_seconds"] != "not comparable"
