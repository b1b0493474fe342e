"""Numbers in a recorded workload line (a training step's, a request's), read as what they measure:
a JSON number (never a bool), a time the store can hold, a duration a clock could have measured.
Anything else is 'not measured' (None), so one broken clock's line cannot put a step or a request
outside every date a report can print."""

from __future__ import annotations

import math
from typing import Any

from gpulens.units import MAX_DURATION_SECONDS, MAX_TIME_SECONDS, MIN_TIME_SECONDS


def number(v: Any) -> float | None:
    """A JSON number as a float (NaN and infinities included: callers that need finite say so)."""
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def count(v: Any) -> int | None:
    """A finite number as an int."""
    f = number(v)
    return None if f is None or not math.isfinite(f) else int(f)


def time_point(v: Any) -> float | None:
    """Unix seconds from 1970 to 2200 (what the store keeps); NaN, infinities and the rest are None."""
    t = number(v)
    return t if t is not None and MIN_TIME_SECONDS <= t <= MAX_TIME_SECONDS else None


def duration(v: Any) -> float | None:
    """Seconds from 0 to 100 years; negative, NaN, infinite or longer ones are None."""
    d = number(v)
    return d if d is not None and 0.0 <= d <= MAX_DURATION_SECONDS else None
