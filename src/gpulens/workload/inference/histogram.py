"""Percentiles from Prometheus cumulative histogram buckets, between two scrapes.

A histogram's buckets count every observation since the process started; the difference of two
scrapes is the distribution of what happened between them. Quantiles interpolate linearly inside
the bucket that holds the rank, as PromQL's `histogram_quantile` does, so a value is only as exact
as the bucket boundaries around it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Buckets:
    """Cumulative counts per upper bound (ascending, ending with +Inf), plus _sum and _count."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    sum: float
    count: float

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[float, float]], total_sum: float, total_count: float | None = None) -> Buckets:
        ordered = sorted(pairs)
        bounds = tuple(b for b, _ in ordered)
        counts = tuple(c for _, c in ordered)
        if not bounds or bounds[-1] != math.inf:
            bounds += (math.inf,)
            counts += (total_count if total_count is not None else (counts[-1] if counts else 0.0),)
        return cls(bounds, counts, total_sum, total_count if total_count is not None else counts[-1])

    def minus(self, earlier: Buckets | None) -> Buckets:
        """What was observed since `earlier`. A counter reset (a restarted engine) or changed buckets
        make this scrape's counts the delta: they all happened since the restart."""
        if earlier is None or earlier.bounds != self.bounds:
            return self
        counts = tuple(a - b for a, b in zip(self.counts, earlier.counts, strict=True))
        if any(c < 0 for c in counts) or self.count < earlier.count:
            return self
        return Buckets(self.bounds, counts, self.sum - earlier.sum, self.count - earlier.count)

    def plus(self, other: Buckets) -> Buckets:
        """Two label sets of one histogram (e.g. two engines) merged; buckets must match."""
        if other.bounds != self.bounds:
            raise ValueError("histograms with different buckets cannot be merged")
        return Buckets(self.bounds, tuple(a + b for a, b in zip(self.counts, other.counts, strict=True)),
                       self.sum + other.sum, self.count + other.count)

    @property
    def total(self) -> float:
        return self.counts[-1] if self.counts else 0.0

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0 < q < 1), or None when nothing was observed."""
        total = self.total
        if total <= 0:
            return None
        rank = q * total
        prev_bound, prev_count = 0.0, 0.0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            if count >= rank and count > prev_count:
                if math.isinf(bound):
                    return prev_bound  # past the last finite bucket: its bound is all we know
                lower = prev_bound if prev_bound < bound else 0.0
                return lower + (bound - lower) * (rank - prev_count) / (count - prev_count)
            prev_bound, prev_count = bound, count
        return prev_bound
