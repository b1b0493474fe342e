"""The one-sample statistics of a tune: a median with its bootstrap interval, and when an estimate
is tight enough to stop repeating. Comparisons between trials use `gpulens.bench.compare`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpulens.stats import median_ci95

RESAMPLES = 2000


@dataclass(frozen=True, slots=True)
class Estimate:
    """The median of per-step values with its 95 % percentile-bootstrap interval."""

    n: int
    median: float | None
    ci95_low: float | None
    ci95_high: float | None

    @property
    def half_width_ratio(self) -> float | None:
        """Half the interval's width as a share of the median (None when undefined)."""
        if self.median in (None, 0) or self.ci95_low is None or self.ci95_high is None:
            return None
        return (self.ci95_high - self.ci95_low) / 2 / abs(self.median)  # type: ignore[arg-type]

    def tight(self, ratio: float, min_n: int) -> bool:
        hw = self.half_width_ratio
        return self.n >= min_n and hw is not None and hw <= ratio


def estimate(values: Sequence[float], *, seed: int = 0, resamples: int = RESAMPLES) -> Estimate:
    xs = np.asarray([v for v in values if math.isfinite(v)], dtype=float)
    if xs.size == 0:
        return Estimate(0, None, None, None)
    med = float(np.median(xs))
    if xs.size == 1:
        return Estimate(1, med, None, None)
    lo, hi = median_ci95(xs, seed=seed, resamples=resamples)
    return Estimate(int(xs.size), med, lo, hi)
