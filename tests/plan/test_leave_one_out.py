"""Calibration keeps its promise: every figure is checked on runs the fit did not see, per
runtime and workload, and factors that do not beat the defaults there are not used."""

from __future__ import annotations

import statistics

import pytest

from gpulens.data import bundled_trace
from gpulens.plan import find_gpu
from gpulens.plan.calibration import (
    FigureCheck,
    calibrate,
    drop_unhelpful,
    fit,
    leave_one_out_by_figure,
    load_measurements,
)
from gpulens.plan.speed import Efficiency

CALIBRATION_FILE = bundled_trace() / "memory_calibration.jsonl"


@pytest.fixture(scope="module")
def checks() -> dict[tuple[str, str], FigureCheck]:
    ms = load_measurements(CALIBRATION_FILE)
    return {(c.figure, c.scope): c for c in leave_one_out_by_figure(ms, find_gpu("h200"))}


def test_each_figure_is_checked_per_scope(checks):
    assert {("train_step", "train"), ("peak_memory", "train"), ("decode_tpot", "hf"), ("prefill", "hf")} <= set(checks)
    assert len(checks[("train_step", "train")].held_out) == 12 and len(checks[("decode_tpot", "hf")].held_out) == 6


def test_held_out_errors_on_the_bundled_h200_runs(checks):
    """The issue's targets that hold today (HF decode and prefill worst cases do not: 22 % and 26 %)."""
    train = checks[("train_step", "train")].calibrated_errors
    assert statistics.median(train) <= 0.08 and max(train) <= 0.15
    mem = checks[("peak_memory", "train")].calibrated_errors
    assert statistics.median(mem) <= 0.01 and max(mem) <= 0.07
    dec = checks[("decode_tpot", "hf")]
    assert dec.used and statistics.median(dec.calibrated_errors) <= 0.10
    assert dec.worst_ratio < dec.defaults_worst_ratio / 3
    pre = checks[("prefill", "hf")]
    assert pre.used and statistics.median(pre.calibrated_errors) <= 0.12


def test_a_fit_no_better_than_the_defaults_is_not_used():
    base = Efficiency()
    fitted = fit(load_measurements(CALIBRATION_FILE), find_gpu("h200")).efficiency
    worse = FigureCheck("train_step", "train", held_out=[0.3, 0.4], defaults=[0.1, 0.1])
    kept = drop_unhelpful(fitted, [worse], base)
    assert kept.compute_ratio == base.compute_ratio and kept.layer_overhead_seconds == base.layer_overhead_seconds
    assert kept.runtime("hf") == fitted.runtime("hf")  # other figures keep their fit
    worse_decode = FigureCheck("decode_tpot", "hf", held_out=[0.3, 0.4], defaults=[0.1, 0.1])
    kept = drop_unhelpful(fitted, [worse_decode], base)
    assert kept.runtime("hf").decode_step_overhead_seconds == base.runtime("hf").decode_step_overhead_seconds
    assert kept.runtime("hf").prefill_overhead_seconds == fitted.runtime("hf").prefill_overhead_seconds
    assert kept.compute_ratio == fitted.compute_ratio


def test_calibrate_reports_the_checks_and_applies_them():
    (rep,) = calibrate(CALIBRATION_FILE, gpu_name="h200", save=False)
    assert rep.checks
    for c in rep.checks:
        if c.figure == "peak_memory" and not c.used:
            assert rep.efficiency.activation_scale == Efficiency().activation_scale
