"""Shared by the runs tests: realistic step-time samples."""

from __future__ import annotations

import numpy as np
import pytest


def make_step_times(rng: np.random.Generator, median_seconds: float, n: int = 30) -> list[float]:
    """Realistic step times: ~4 % log-normal jitter plus occasional slow steps (GC, a data hiccup,
    a neighbour's burst) that take 1.3-2x as long."""
    x = median_seconds * rng.lognormal(0.0, 0.04, n)
    slow = rng.random(n) < 0.05
    x[slow] *= rng.uniform(1.3, 2.0, slow.sum())
    return x.tolist()


@pytest.fixture
def step_times():
    return make_step_times
