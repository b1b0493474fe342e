"""gpulens.stats: one percentile definition (linear interpolation, type 7), and HdrHistogram's
summaries in `bench serve` reported through it."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gpulens.bench.serve.stats import Distribution
from gpulens.stats import percentile, percentiles, percentiles_of_counts, quantile


def test_linear_interpolation_between_closest_ranks():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5  # nearest-rank would say 2 or 3
    assert percentile([float(i) for i in range(1, 101)], 99) == pytest.approx(99.01)
    assert percentile([3.0, 1.0, 2.0], 0) == 1.0 and percentile([3.0, 1.0, 2.0], 100) == 3.0
    assert quantile([10.0, 20.0], 0.25) == 12.5
    assert percentile([], 99) is None and percentiles([], [50, 99]) == [None, None]
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_agrees_with_numpy_default_on_random_data():
    rng = random.Random(7)
    vals = [rng.lognormvariate(0, 1) for _ in range(1001)]
    ps = [1, 25, 50, 90, 99, 99.9]
    assert percentiles(vals, ps) == pytest.approx(list(np.percentile(vals, ps)))


def test_counts_give_the_same_answer_as_the_expanded_values():
    buckets = [(1.0, 3), (2.0, 0), (5.0, 2), (7.0, 1)]
    expanded = [1.0] * 3 + [5.0] * 2 + [7.0]
    ps = [0, 10, 50, 75, 99, 100]
    assert percentiles_of_counts(buckets, ps) == pytest.approx(percentiles(expanded, ps))
    assert percentiles_of_counts([], [50]) == [None]


def test_bench_serve_histogram_agrees_with_stats_within_its_resolution():
    rng = random.Random(3)
    seconds = [rng.lognormvariate(-3, 0.8) for _ in range(5000)]
    d = Distribution()
    for s in seconds:
        d.record(s)
    summary = d.summary()
    assert summary is not None
    for p, got in ((50, summary.p50), (99, summary.p99), (99.9, summary.p99_9)):
        exact = percentile(seconds, p)
        assert exact is not None
        # 3 significant digits: a bucket is at most 0.1% of its value wide, plus the 1 µs unit.
        assert abs(got - exact) <= exact * 2e-3 + 2e-6, (p, got, exact)
    # A small set, where nearest-rank and interpolation differ by a whole sample:
    small = Distribution()
    for s in (0.010, 0.020, 0.030, 0.040):
        small.record(s)
    assert small.percentile(50) == pytest.approx(0.025, rel=2e-3)
