"""Run comparison: real regressions are caught, noise is not called a change, bad input is refused."""

from __future__ import annotations

import numpy as np
import pytest

from gpulens.bench.compare import compare_runs, compare_samples, direction_of
from gpulens.errors import BadInputError
from gpulens.runs import get_run, save_run


@pytest.mark.parametrize("seed", range(10))
def test_ten_percent_slower_steps_are_a_regression(seed, step_times):
    rng = np.random.default_rng(1000 + seed)
    r = compare_samples("step_seconds", step_times(rng, 0.200), step_times(rng, 0.220), seed=seed)
    assert r.verdict == "regression", r.reason
    assert 0.05 < r.change_ratio < 0.15 and r.ci95_low_ratio > 0 and r.p_value < 0.05


def test_same_distribution_is_no_change_in_at_least_95_of_100_trials(step_times):
    verdicts = []
    for seed in range(100):
        rng = np.random.default_rng(seed)
        verdicts.append(compare_samples("step_seconds", step_times(rng, 0.2), step_times(rng, 0.2), seed=seed).verdict)
    assert verdicts.count("no change") >= 95, {v: verdicts.count(v) for v in set(verdicts)}


def test_direction_decides_regression_or_improvement(step_times):
    rng = np.random.default_rng(7)
    slow, fast = step_times(rng, 0.22), step_times(rng, 0.20)
    assert compare_samples("step_seconds", slow, fast).verdict == "improvement"
    tps_a = [8192 / s for s in slow]
    tps_b = [8192 / s for s in fast]
    assert direction_of("tokens_per_second") == "higher_is_better"
    assert compare_samples("tokens_per_second", tps_b, tps_a).verdict == "regression"


def test_significant_but_within_threshold_is_no_change():
    rng = np.random.default_rng(3)
    a = (0.2 * rng.lognormal(0, 0.005, 200)).tolist()
    b = (0.204 * rng.lognormal(0, 0.005, 200)).tolist()  # +2 %, very significant
    r = compare_samples("step_seconds", a, b, threshold_ratio=0.05)
    assert r.p_value < 1e-6 and r.verdict == "no change" and "within the 5% threshold" in r.reason
    assert compare_samples("step_seconds", a, b, threshold_ratio=0.01).verdict == "regression"


def test_too_few_samples_is_not_a_verdict():
    r = compare_samples("step_seconds", [0.2, 0.2, 0.21], [0.4, 0.41, 0.42, 0.4, 0.43, 0.44])
    assert r.verdict == "not enough data" and "A has 3" in r.reason and r.p_value is None


def test_identical_constant_samples():
    r = compare_samples("step_seconds", [0.2] * 10, [0.2] * 10)
    assert r.verdict == "no change" and r.change_ratio == 0


def _runs(store, a_samples, b_samples, kind_b="bench-train", cfg_b=None):
    fp = {"driver": "580.1", "host": "x"}
    a = save_run(store, "bench-train", "s", {"workers": 4}, {}, a_samples, fingerprint=fp)
    b = save_run(store, kind_b, "s", cfg_b or {"workers": 4}, {}, b_samples, fingerprint={**fp, "driver": "580.2", "host": "y"})
    return get_run(store, a), get_run(store, b)


def test_compare_runs_reports_what_changed_and_last_known_good(store, step_times):
    rng = np.random.default_rng(11)
    a, b = _runs(store, {"step_seconds": step_times(rng, 0.2)}, {"step_seconds": step_times(rng, 0.23)}, cfg_b={"workers": 8})
    cmp = compare_runs(a, b, store=store, record=True)
    assert cmp.regression and cmp.verdict == "regression"
    assert [(c.key, c.old, c.new) for c in cmp.config_changes] == [("workers", 4, 8)]
    assert [(c.key, c.old, c.new) for c in cmp.fingerprint_changes] == [("driver", "580.1", "580.2")]
    assert cmp.last_known_good.id == a.id  # nothing compared before: the reference itself
    assert get_run(store, b.id).verdict == "regression"
    d = cmp.to_dict()
    assert d["regression"] is True and d["metrics"][0]["verdict"] == "regression"


def test_runs_of_different_kinds_or_the_same_run_are_refused(store):
    a, b = _runs(store, {"x": [1.0] * 5}, {"x": [1.0] * 5}, kind_b="loadtest")
    with pytest.raises(BadInputError, match="only runs of the same kind compare"):
        compare_runs(a, b)
    with pytest.raises(BadInputError, match="cannot be compared with itself"):
        compare_runs(a, a)


def test_metric_on_one_side_only_and_unknown_metric(store):
    a, b = _runs(store, {"step_seconds": [0.2] * 8, "loss": [1.0] * 8}, {"step_seconds": [0.2] * 8})
    cmp = compare_runs(a, b)
    by = {m.metric: m for m in cmp.metrics}
    assert by["loss"].verdict == "not enough data" and "run B has no samples" in by["loss"].reason
    assert cmp.verdict == "no change" and not cmp.regression
    with pytest.raises(BadInputError, match="Neither run has samples of mfu"):
        compare_runs(a, b, metrics=["mfu"])
    with pytest.raises(BadInputError, match=r"Neither run has samples of x{80}… \(5,000 characters\)\. "):
        compare_runs(a, b, metrics=["x" * 5000])


def test_runs_without_samples_never_get_a_verdict(store):
    a, b = _runs(store, {}, {})
    cmp = compare_runs(a, b, store=store, record=True)
    assert cmp.metrics == [] and cmp.verdict == "not enough data" and not cmp.regression
    assert get_run(store, b.id).verdict is None  # nothing judged, nothing recorded


def test_a_smaller_batch_is_not_a_faster_step(store, step_times):
    """Half the batch, half the work a step: step time halves without anything getting faster. Per-step
    figures are not comparable then; tokens/s (the same here) decides, and the run is no improvement."""
    rng = np.random.default_rng(21)
    slow, fast = step_times(rng, 0.4), step_times(rng, 0.2)
    a = save_run(store, "bench-train", "s", {"batch_size": 16, "seq_len": 512}, {},
                 {"step_seconds": slow, "tokens_per_second": [16 * 512 / s for s in slow]}, fingerprint={})
    b = save_run(store, "bench-train", "s", {"batch_size": 8, "seq_len": 512}, {},
                 {"step_seconds": fast, "tokens_per_second": [8 * 512 / s for s in fast]}, fingerprint={})
    cmp = compare_runs(get_run(store, a), get_run(store, b), store=store, record=True)
    by = {m.metric: m for m in cmp.metrics}
    assert by["step_seconds"].verdict == "not comparable" and "batch_size differs: 16 → 8" in by["step_seconds"].reason
    assert by["step_seconds"].change_ratio < -0.4  # the figures stay shown
    assert by["tokens_per_second"].verdict == "no change" and cmp.verdict == "no change"
    assert get_run(store, b).verdict == "good"  # judged on throughput


def test_only_per_step_metrics_of_different_work_judge_nothing(store, step_times):
    rng = np.random.default_rng(22)
    a, b = _runs(store, {"step_seconds": step_times(rng, 0.2)}, {"step_seconds": step_times(rng, 0.3)},
                 cfg_b={"workers": 4, "knobs": {"seq_len": 1024}})
    cmp = compare_runs(a, b, store=store, record=True)
    assert cmp.verdict == "not comparable" and not cmp.regression
    assert "knobs.seq_len differs: (none) → 1024" in cmp.metrics[0].reason
    assert get_run(store, b.id).verdict is None  # nothing judged, nothing recorded


def test_a_setting_that_leaves_the_work_alone_still_compares_step_time(store, step_times):
    rng = np.random.default_rng(23)
    a, b = _runs(store, {"step_seconds": step_times(rng, 0.2)}, {"step_seconds": step_times(rng, 0.3)},
                 cfg_b={"workers": 4, "precision": "fp32", "heads": 8})
    assert compare_runs(a, b).verdict == "regression"
