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
    """The targets for calibration on unseen runs: training step median <= 8 %, worst <= 15 %; HF
    decode TPOT 10 % / 20 %; prefill 12 % / 25 %; peak memory 1 % / 7 %."""
    for key, median_goal, worst_goal in ((("train_step", "train"), 0.08, 0.15), (("decode_tpot", "hf"), 0.10, 0.20),
                                         (("prefill", "hf"), 0.12, 0.25), (("peak_memory", "train"), 0.01, 0.07)):
        errors = checks[key].calibrated_errors
        assert statistics.median(errors) <= median_goal and max(errors) <= worst_goal, key
    for key in (("train_step", "train"), ("decode_tpot", "hf"), ("prefill", "hf")):
        assert checks[key].used and checks[key].worst_ratio < checks[key].defaults_worst_ratio  # better than uncalibrated


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


def test_up_to_folds_runs_each_is_held_out_alone():
    """The bundled 18 runs: each predicted by a fit of exactly the 17 others (leave-one-out)."""
    from gpulens.plan.calibration import FOLDS, held_out_fits

    gpu = find_gpu("h200")
    ms = [m for m in load_measurements(CALIBRATION_FILE) if m.status == "ok"]
    assert len(ms) <= FOLDS
    held = held_out_fits(ms, gpu)
    assert [m for m, _ in held] == ms
    for i in (0, 7, len(ms) - 1):
        assert held[i][1] == fit(ms[:i] + ms[i + 1:], gpu).efficiency


def test_past_folds_runs_cost_folds_fits_and_no_run_is_predicted_by_a_fit_that_saw_it(monkeypatch):
    """Ten copies of the bundled runs (180 distinct runs): 20 fits, not 180, so a few hundred runs take
    seconds; each run is predicted once, by a fit that never read it."""
    from dataclasses import replace

    from gpulens.plan import calibration

    gpu = find_gpu("h200")
    base = [m for m in load_measurements(CALIBRATION_FILE) if m.status == "ok"]
    ms = [replace(m, label=f"{m.label} #{k}") for k in range(10) for m in base]
    fits: list[tuple[set[int], Efficiency]] = []
    real_fit = calibration.fit

    def counting_fit(rows, gpu, base=None):  # noqa: ANN001, ANN202  (the real fit, watched)
        report = real_fit(rows, gpu, base)
        fits.append(({id(r) for r in rows}, report.efficiency))
        return report

    monkeypatch.setattr(calibration, "fit", counting_fit)
    held = calibration.held_out_fits(ms, gpu)
    assert len(fits) == calibration.FOLDS
    assert sorted(id(m) for m, _ in held) == sorted(id(m) for m in ms)
    for m, eff in held:
        (read,) = [rows for rows, e in fits if e is eff]
        assert id(m) not in read and len(read) == len(ms) - len(ms) // calibration.FOLDS
