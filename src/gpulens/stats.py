"""The one percentile definition gpulens uses, so a p99 is the same number in a diagnosis finding,
a dashboard chart, a report, an alert rule and `bench serve`.

Definition: linear interpolation between the closest ranks, Hyndman & Fan's type 7. For n sorted
values x[0..n-1] and a percentile p in [0, 100], let h = (n - 1) * p / 100; the percentile is
x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)]).

Why type 7: it is numpy's default (`method="linear"`), R's default, and what PromQL's
`quantile_over_time` computes, so the local store and a Prometheus backend agree on the same
samples, and so do users checking a number with numpy. Nearest-rank (the alternative) always
returns an observed value but jumps a whole sample on small sets; type 7 is continuous in p.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

# numpy is imported in the functions that use it: importing this module (the alert rules do) must
# not cost a process numpy's start-up (the agent's start-up CPU, issue 28).


def _check(p: float) -> None:
    if not 0.0 <= p <= 100.0 or math.isnan(p):
        raise ValueError(f"a percentile is between 0 and 100, not {p!r}")


def percentiles(values: Iterable[float], ps: Sequence[float]) -> list[float | None]:
    """The percentiles `ps` (each in [0, 100]) of `values`; None for each when there are none."""
    import numpy as np

    for p in ps:
        _check(p)
    a = np.asarray(values if isinstance(values, np.ndarray | list | tuple) else list(values), dtype=float)
    if a.size == 0:
        return [None] * len(ps)
    return [float(v) for v in np.percentile(a, list(ps), method="linear")]


def percentile(values: Iterable[float], p: float) -> float | None:
    """The p-th percentile (p in [0, 100]) of `values`, or None when there are none."""
    return percentiles(values, [p])[0]


def quantile(values: Iterable[float], q: float) -> float | None:
    """The q-quantile (q in [0, 1]) of `values`: `percentile(values, 100 * q)`."""
    return percentile(values, 100.0 * q)


def percentiles_of_counts(buckets: Iterable[tuple[float, int]], ps: Sequence[float]) -> list[float | None]:
    """The same definition over a histogram: `buckets` are (value, count) in ascending value,
    each bucket standing for `count` copies of its value. Equal to `percentiles` of the expanded
    values; for a histogram of rounded values it is exact to within the rounding."""
    for p in ps:
        _check(p)
    vals: list[float] = []
    cum: list[int] = []  # number of values up to and including each bucket
    total = 0
    for v, c in buckets:
        if c > 0:
            total += int(c)
            vals.append(float(v))
            cum.append(total)
    if total == 0:
        return [None] * len(ps)

    def order_stat(k: int) -> float:  # the k-th smallest value, 0-based
        lo, hi = 0, len(cum) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if cum[mid] > k:
                hi = mid
            else:
                lo = mid + 1
        return vals[lo]

    out: list[float | None] = []
    for p in ps:
        h = (total - 1) * p / 100.0
        k = math.floor(h)
        lo_v = order_stat(k)
        hi_v = order_stat(min(k + 1, total - 1))
        out.append(lo_v + (h - k) * (hi_v - lo_v))
    return out


def bootstrap_medians(values: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """The medians of `resamples` resamples (with replacement, same size) of `values`, drawn from
    `rng`: the one percentile bootstrap of a median that `compare` and `tune` both use."""
    import numpy as np

    return np.median(values[rng.integers(0, values.size, size=(resamples, values.size))], axis=1)


def interval95(draws: np.ndarray) -> tuple[float, float]:
    """The 95 % percentile interval of bootstrap draws (2.5th and 97.5th percentiles, type 7)."""
    import numpy as np

    lo, hi = np.percentile(draws, [2.5, 97.5])
    return float(lo), float(hi)


def median_ci95(values: np.ndarray, *, seed: int, resamples: int) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the median of `values` (one sample)."""
    import numpy as np

    return interval95(bootstrap_medians(values, np.random.default_rng(seed), resamples))


def median_ratio_ci95(a: np.ndarray, b: np.ndarray, *, seed: int, resamples: int) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of median(b) / median(a) - 1, the two samples resampled
    independently from one generator (a first); NaNs when every resample of `a` has median 0."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ma, mb = bootstrap_medians(a, rng, resamples), bootstrap_medians(b, rng, resamples)
    ok = ma != 0
    if not ok.any():
        return (math.nan, math.nan)
    return interval95(mb[ok] / ma[ok] - 1.0)
