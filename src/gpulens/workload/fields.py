"""Numbers in a recorded workload line (a training step's, a request's), read as what they measure:
a JSON number (never a bool), a time the store can hold, a duration a clock could have measured.
Anything else is 'not measured' (None), so one broken clock's line cannot put a step or a request
outside every date a report can print."""

from __future__ import annotations

from typing import Any

from gpulens.units import MAX_ABS_VALUE, MAX_DURATION_SECONDS, MAX_TIME_SECONDS, MIN_TIME_SECONDS


def number(v: Any) -> float | None:
    """A JSON number as a float (NaN and infinities included: callers that need finite say so)."""
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def count(v: Any) -> int | None:
    """A number of things (steps, tokens, bytes, a rank) as an int: from 0 to what the store keeps;
    a negative, NaN, infinite or larger one is None."""
    f = number(v)
    return None if f is None or not 0 <= f <= MAX_ABS_VALUE else int(f)


def time_point(v: Any) -> float | None:
    """Unix seconds from 1970 to 2200 (what the store keeps); NaN, infinities and the rest are None."""
    t = number(v)
    return t if t is not None and MIN_TIME_SECONDS <= t <= MAX_TIME_SECONDS else None


def duration(v: Any) -> float | None:
    """Seconds from 0 to 100 years; negative, NaN, infinite or longer ones are None."""
    d = number(v)
    return d if d is not None and 0.0 <= d <= MAX_DURATION_SECONDS else None


def stored_value(v: Any) -> float | None:
    """A finite number the store keeps (within +-MAX_ABS_VALUE); anything else is None."""
    f = number(v)
    return f if f is not None and -MAX_ABS_VALUE <= f <= MAX_ABS_VALUE else None


def field(record: dict[str, Any], key: str, read: Any = stored_value) -> float | None:
    """`record[key]` read by `read` (stored_value, duration, time_point): None when absent; a
    ValueError when present but unreadable, so the importer skips and counts the whole record
    instead of the store dropping one of its samples with a warning."""
    raw = record.get(key)
    if raw is None:
        return None
    got = read(raw)
    if got is None:
        raise ValueError(f"{key} is {raw!r}, which is not a {read.__name__.replace('_', ' ')} the store can keep")
    return got
