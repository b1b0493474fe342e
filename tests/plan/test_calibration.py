"""Calibration: fit on measured runs, store, and later plans on that GPU use the factors and say so."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpulens.data import bundled_trace
from gpulens.errors import BadInputError
from gpulens.plan import PlanRequest, find_gpu, from_hf_config, plan
from gpulens.plan.calibration import calibrate, fit, load_efficiency, load_measurements
from gpulens.runs.measurements import measurements_from_store, read_store_measurements

CALIBRATION_FILE = bundled_trace() / "memory_calibration.jsonl"


def _train_row_request(row: dict) -> PlanRequest:
    return PlanRequest(model=row["model"], workload="train", gpu="h200", precision=row["precision"],
                       optimizer=row["optimizer"], batch=row["batch"], seq=row["seq"], grad_ckpt=row["grad_ckpt"])


def test_training_tokens_per_second_within_30_percent_after_calibration(calibration_rows):
    calibrate(CALIBRATION_FILE, gpu_name="h200")  # stored in $GPULENS_CALIBRATION (a temp file)
    for row in calibration_rows:
        if row["kind"] != "train":
            continue
        model = from_hf_config({"model_type": "llama", **row["shapes"]}, name=row["model"])
        res = plan(_train_row_request(row), model=model)
        assert res.efficiency.calibrated
        got = res.speed["tokens_per_second"]
        assert got == pytest.approx(row["tokens_per_s"], rel=0.30), row["model"]


def test_leave_one_out_predicts_the_unseen_run_within_30_percent():
    ms = load_measurements(CALIBRATION_FILE)
    gpu = find_gpu("h200")
    from gpulens.plan.speed import training_speed

    for held in [m for m in ms if m.kind == "train"]:
        eff = fit([m for m in ms if m is not held], gpu).efficiency
        got = training_speed(held.model, held.train_setup(), gpu, eff).tokens_per_second
        assert got == pytest.approx(held.tokens_per_s, rel=0.30), held.label


def test_calibration_improves_on_the_defaults():
    rep = fit(load_measurements(CALIBRATION_FILE), find_gpu("h200"))
    for figure in ("train_step", "decode_tpot", "prefill"):
        before = sorted(abs(e) for e in rep.before[figure])
        after = sorted(abs(e) for e in rep.after[figure])
        assert after[len(after) // 2] < before[len(before) // 2], figure
    assert max(abs(e) for e in rep.after["decode_tpot"]) < 0.3
    assert 1.0 <= rep.efficiency.reserved_ratio < 1.3


def test_stored_calibration_is_used_and_announced(tmp_path):
    path = Path(os.environ["GPULENS_CALIBRATION"])
    before = plan(PlanRequest(model="llama-3.2-1b", workload="train", gpu="h200", batch=4, seq=2048))
    assert not before.efficiency.calibrated and "not calibrated" in " ".join(before.notes)
    calibrate(CALIBRATION_FILE, gpu_name="NVIDIA H200")
    data = json.loads(path.read_text())
    assert "H200" in data["gpus"] and data["gpus"]["H200"]["runs"] == 18
    after = plan(PlanRequest(model="llama-3.2-1b", workload="train", gpu="h200", batch=4, seq=2048))
    assert after.efficiency.calibrated and "calibrated on" in after.to_dict()["calibration"]["source"]
    assert after.speed["tokens_per_second"] != before.speed["tokens_per_second"]
    other = plan(PlanRequest(model="llama-3.2-1b", workload="train", gpu="h100-sxm", batch=4, seq=2048))
    assert not other.efficiency.calibrated  # per GPU
    assert load_efficiency(find_gpu("h200"), path=tmp_path / "elsewhere.json").calibrated is False


def test_runs_without_a_gpu_name_need_one(tmp_path):
    # a recording's env.json names its device; a bare file needs --gpu
    (rep,) = calibrate(CALIBRATION_FILE, gpu_name=None, save=False)
    assert rep.gpu == "H200"
    bare = tmp_path / "runs.jsonl"
    bare.write_text(CALIBRATION_FILE.read_text())
    with pytest.raises(BadInputError, match="which GPU"):
        calibrate(bare, gpu_name=None, save=False)


def test_failed_runs_are_skipped_and_bad_lines_named(tmp_path):
    rows = [json.loads(line) for line in CALIBRATION_FILE.read_text().splitlines()]
    oom = dict(rows[0], status="oom", step_s=None, tokens_per_s=None, peak_alloc=None)
    f = tmp_path / "runs.jsonl"
    f.write_text("\n".join(json.dumps(r | {"gpu": "h200"}) for r in [rows[0], rows[3], oom]))
    (rep,) = calibrate(f, gpu_name=None, save=False)
    assert rep.runs == 2 and len(rep.skipped) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"kind": "train", "seq": 10}) + "\n")
    with pytest.raises(BadInputError, match="line 1.*shapes"):
        load_measurements(bad)


def test_benchmark_runs_from_the_store_give_the_matmul_efficiency(tmp_path, store):
    from gpulens.runs import save_run

    save_run(store, "bench-train", "small-bf16-cuda", config={"precision": "bf16", "device": "cuda:0",
             "device_name": "NVIDIA H100 80GB HBM3"}, summary={"tokens_per_second": 100_000.0, "flops_per_token": 4.0e9},
             fingerprint={})
    store.flush()
    (rep,) = calibrate(measurements_from_store(store).measurements, gpu_name=None, save=False)
    assert rep.gpu == "H100-SXM"
    assert rep.efficiency.compute_ratio == pytest.approx(4.0e14 / 989.5e12)


def test_the_training_monitors_mfu_series_calibrates_the_matmul_efficiency(store):
    from gpulens.vocab.names import TRAIN_MFU_RATIO

    # three warm-up steps (left out), then the steady ones
    for i, v in enumerate([0.05, 0.30, 0.39, 0.41, 0.43, 0.42, 0.44, 0.40]):
        store.write(TRAIN_MFU_RATIO, {"train_job": "pretrain"}, 1000.0 + i, v)
    store.flush()
    ms = measurements_from_store(store).measurements
    with pytest.raises(BadInputError, match="which GPU"):
        calibrate(ms, gpu_name=None, save=False)
    (rep,) = calibrate(ms, gpu_name="h100-sxm", save=False)
    assert rep.efficiency.compute_ratio == pytest.approx(0.42)
    with pytest.raises(BadInputError, match="no gpulens store"):
        read_store_measurements(store.path.parent / "missing.db")
