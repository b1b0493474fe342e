"""Open-loop send schedules: when each request is meant to leave, independent of the responses.

Arrivals are drawn as a unit-rate process in "operational time" (gaps of 1 for constant, Exp(1) for
Poisson, Gamma(k, 1/k) for gamma with burstiness k, where k = 1 is Poisson) and mapped to wall time
through the inverse of the cumulative rate Λ(t). That gives a constant rate and a linear ramp from
one rate to another with the same code, and keeps the mean rate exact for every shape.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Literal

Arrival = Literal["constant", "poisson", "gamma"]
ARRIVALS: tuple[str, ...] = ("constant", "poisson", "gamma")


def _inverse_cumulative_rate(lam: float, r0: float, r1: float, duration: float) -> float:
    """t such that Λ(t) = lam, for a rate rising linearly from r0 to r1 over `duration`, then r1."""
    if r1 == r0 or duration <= 0:
        return lam / r0
    a = (r1 - r0) / duration  # slope of the rate
    ramp_area = r0 * duration + a * duration * duration / 2
    if lam > ramp_area:  # past the ramp: constant at r1
        return duration + (lam - ramp_area) / r1
    # r0 t + a t² / 2 = lam  ->  t = (-r0 + sqrt(r0² + 2 a lam)) / a, written to stay exact as a -> 0
    return 2 * lam / (r0 + math.sqrt(max(r0 * r0 + 2 * a * lam, 0.0)))


def intended_times(
    rate: float,
    *,
    arrival: Arrival = "constant",
    burstiness: float = 1.0,
    ramp_to: float | None = None,
    duration: float | None = None,
    max_requests: int | None = None,
    seed: int | None = None,
    phase: float = 0.0,
    share: int = 1,
) -> Iterator[float]:
    """Seconds after the run's start at which each request should be sent, until `duration` or
    `max_requests` (whichever first; at least one must be given).

    `share` and `phase` split one schedule across worker processes: worker i of n runs rate/n with
    phase i/n, so the workers' constant schedules interleave into the requested rate, and n Poisson
    streams of rate/n add up to one Poisson stream of the full rate."""
    if duration is None and max_requests is None:
        raise ValueError("a schedule needs a duration or a request count")
    r0 = rate / share
    r1 = (ramp_to if ramp_to is not None else rate) / share
    ramp_len = duration if (ramp_to is not None and duration) else 0.0
    rng = random.Random(seed)
    lam = phase if arrival == "constant" else 0.0
    n = 0
    while max_requests is None or n < max_requests:
        if arrival == "constant":
            t = _inverse_cumulative_rate(lam, r0, r1, ramp_len)
            lam += 1.0
        else:
            lam += rng.expovariate(1.0) if arrival == "poisson" else rng.gammavariate(burstiness, 1.0 / burstiness)
            t = _inverse_cumulative_rate(lam, r0, r1, ramp_len)
        if duration is not None and t >= duration:
            return
        yield t
        n += 1
