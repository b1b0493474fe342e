"""Joules a GPU used over a span, from NVML's cumulative energy counter or, where the counter is
missing, from its power readings.

The counter (`gpu_energy_joules_total`, from nvmlDeviceGetTotalEnergyConsumption) is what the
driver itself integrates at its own rate, so a difference of two readings is the best figure there
is; power sampled at 10 Hz misses what happens between samples. Both ends of a span are read by
linear interpolation between the samples around them, so a span shorter than a sample interval
still gets its share. A counter that goes down (the driver reloaded) restarts from zero: only
increases are summed.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Method = Literal["energy_counter", "power_integral"]


@dataclass(frozen=True, slots=True)
class SpanEnergy:
    joules: float
    method: Method
    seconds: float  # the part of the span the samples cover

    @property
    def mean_watts(self) -> float | None:
        return self.joules / self.seconds if self.seconds > 0 else None


def _interp(t: Sequence[float], v: Sequence[float], at: float) -> float:
    i = bisect.bisect_left(t, at)
    if i <= 0:
        return v[0]
    if i >= len(t):
        return v[-1]
    t0, t1, v0, v1 = t[i - 1], t[i], v[i - 1], v[i]
    if t1 <= t0:
        return v1
    return v0 + (v1 - v0) * (at - t0) / (t1 - t0)


def _clip(t: Sequence[float], v: Sequence[float], start: float, end: float) -> tuple[list[float], list[float]]:
    """The samples strictly inside (start, end), with interpolated points at both ends added;
    nothing when fewer than two readings cover the span."""
    if len(t) < 2:
        return [], []
    lo, hi = max(start, t[0]), min(end, t[-1])
    if hi <= lo:
        return [], []
    i, j = bisect.bisect_right(t, lo), bisect.bisect_left(t, hi)
    ts = [lo, *t[i:j], hi]
    vs = [_interp(t, v, lo), *v[i:j], _interp(t, v, hi)]
    return ts, vs


def counter_joules(t: Sequence[float], joules_total: Sequence[float], start: float, end: float) -> SpanEnergy | None:
    """Energy from cumulative counter readings (`t` ascending). None when no two readings cover the span."""
    ts, vs = _clip(t, joules_total, start, end)
    if len(ts) < 2:
        return None
    used = sum(max(b - a, 0.0) if b >= a else b for a, b in zip(vs, vs[1:], strict=False))
    return SpanEnergy(used, "energy_counter", ts[-1] - ts[0])


def power_joules(t: Sequence[float], watts: Sequence[float], start: float, end: float) -> SpanEnergy | None:
    """Energy by the trapezoid rule over power readings (`t` ascending)."""
    ts, vs = _clip(t, watts, start, end)
    if len(ts) < 2:
        return None
    used = sum((t1 - t0) * (w0 + w1) / 2.0 for t0, t1, w0, w1 in zip(ts, ts[1:], vs, vs[1:], strict=False))
    return SpanEnergy(used, "power_integral", ts[-1] - ts[0])
