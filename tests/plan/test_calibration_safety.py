"""Calibration never lies: only healthy steps, a report of what was used and left out, no fit
written that predicts worse than the defaults, and nothing written unless every fit succeeded."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpulens.cli.main import main
from gpulens.data import bundled_trace
from gpulens.errors import BadInputError
from gpulens.plan.calibration import CalibrationRefusedError, calibrate, load_measurements
from gpulens.runs.measurements import measurements_from_store
from gpulens.vocab import names as N

CALIBRATION_FILE = bundled_trace() / "memory_calibration.jsonl"
JOB = {N.TRAIN_JOB_LABEL: "pretrain", "rank": "0", "host": "a"}


def _calibration() -> Path:
    return Path(os.environ["GPULENS_CALIBRATION"])


def _step(store, t: float, mfu: float, *, wait: float = 0.0, ckpt: float = 0.0, batch: int = 8) -> None:
    store.write(N.TRAIN_MFU_RATIO, JOB, t, mfu)
    store.write(N.TRAIN_DATA_WAIT_RATIO, JOB, t, wait)
    store.write(N.TRAIN_BATCH_SIZE, JOB, t, batch)
    if ckpt:
        store.write(N.TRAIN_CHECKPOINT_SECONDS, JOB, t, ckpt)


def test_the_demo_store_is_refused_and_nothing_is_written(replayed_store, capsys):
    # the demo job's MFU at batch 8 and at batch 1 disagree with each other far more than with the
    # defaults: the fit (matmul ratio ~0.1) used to be stored and made every H200 plan 3x slower
    rc = main(["plan", "calibrate", "--store", str(replayed_store), "--gpu", "h200"])
    out, err = capsys.readouterr()
    assert rc == 2
    assert "refused" in err and "nothing stored" in err and "Traceback" not in out + err
    assert not _calibration().exists()


def test_the_dry_run_says_what_it_used_and_what_it_left_out(replayed_store, capsys):
    rc = main(["plan", "calibrate", "--store", str(replayed_store), "--gpu", "h200", "--dry-run", "--format", "json"])
    out, _ = capsys.readouterr()
    assert rc == 0
    (g,) = json.loads(out)["gpus"]
    reasons = " ".join(r["reason"] for r in g["rejected"])
    assert "warm-up" in reasons and "input-bound" in reasons and "checkpoint" in reasons
    assert any("batch 8" in u for u in g["used"]) and g["refused"]
    assert not _calibration().exists()
    rc = main(["plan", "calibrate", "--store", str(replayed_store), "--gpu", "h200", "--dry-run"])
    out, _ = capsys.readouterr()
    assert rc == 0 and "left out" in out and "input-bound" in out and "would be refused" in out


def test_only_healthy_steps_count(store):
    mfus = [0.05, 0.2, 0.3]  # warm-up
    for i, v in enumerate(mfus):
        _step(store, 100.0 + i, v)
    for i in range(4):
        _step(store, 110.0 + i, 0.10, wait=0.6)  # waiting for data
    _step(store, 120.0, 0.02, ckpt=5.0)  # writing a checkpoint
    for i, v in enumerate([0.40, 0.41, 0.42, 0.43, 0.44]):
        _step(store, 130.0 + i, v)
    _step(store, 140.0, 0.9, batch=16)  # the first step after the batch changed: warm-up again
    store.flush()
    got = measurements_from_store(store)
    (m,) = got.measurements
    assert m.mfu_ratio == pytest.approx(0.42) and "5 healthy steps" in m.label
    by_reason = {r.reason.split(" (")[0]: r.label for r in got.rejected}
    assert by_reason["warm-up"].endswith("4 steps") and by_reason["input-bound"].endswith("4 steps")
    assert by_reason["checkpoint step"].endswith("1 step")


def test_an_impossible_mfu_is_left_out_with_its_likely_cause(store):
    for i in range(6):
        _step(store, 100.0 + i, 1.52)
    store.flush()
    got = measurements_from_store(store)
    assert not got.measurements
    assert any("impossible" in r.reason and "FLOPs per token" in r.reason for r in got.rejected)
    with pytest.raises(BadInputError, match="impossible"):
        calibrate(got.measurements, gpu_name="h100", rejected=got.rejected, save=False)


def test_a_fit_worse_than_the_defaults_is_refused_and_the_file_kept(store):
    calibrate(CALIBRATION_FILE, gpu_name="h200")  # a good fit, stored
    before = _calibration().read_bytes()
    from gpulens.runs import save_run

    for label, tps in (("big", 120_000.0), ("tiny", 12_000.0)):  # 0.49 and 0.05 of the H100's peak
        save_run(store, "bench-train", label, config={"precision": "bf16", "device": "cuda:0", "device_name": "H100-SXM"},
                 summary={"tokens_per_second": tps, "flops_per_token": 4.0e9}, fingerprint={})
    store.flush()
    ms = measurements_from_store(store).measurements
    with pytest.raises(CalibrationRefusedError, match="refused") as e:
        calibrate(ms + load_measurements(CALIBRATION_FILE), gpu_name="h200")
    assert e.value.exit_code == 2
    assert _calibration().read_bytes() == before  # H200's good fit not written twice, H100's bad one not at all
    assert sorted(p.name for p in _calibration().parent.iterdir() if "calibration" in p.name) == ["calibration.json"]


def test_a_good_fit_is_stored_with_what_it_used(capsys):
    rc = main(["plan", "calibrate", "--measurements", "bundled"])
    out, _ = capsys.readouterr()
    assert rc == 0 and "leave-one-out" in out and "stored in" in out
    entry = json.loads(_calibration().read_text())["gpus"]["H200"]
    assert len(entry["used"]) == 18


def test_rate_only_measurements_render_without_crashing(store, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    # a monitored job gives a rate but no memory or step-time figures: the report used to crash
    # (max() of an empty list) after it had already written the fit
    for i, v in enumerate([0.05, 0.3, 0.39, 0.41, 0.43, 0.42, 0.44, 0.40]):
        _step(store, 100.0 + i, v)
    store.flush()
    rc = main(["plan", "calibrate", "--store", str(store.path), "--gpu", "h100-sxm"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "matmul rate" in out and "Traceback" not in out + err
    assert json.loads(_calibration().read_text())["gpus"]["H100-SXM"]["compute_ratio"] == pytest.approx(0.42)
