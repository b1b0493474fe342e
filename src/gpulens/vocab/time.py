"""Points and spans of time as a user types them: unix seconds or ISO 8601 times, and START,END windows.

`report`, `diagnose` and every other command that takes a time read it here, so one spelling works
everywhere and the same bounds (1970..2200, those the store keeps) apply.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from gpulens.errors import BadInputError, shown
from gpulens.units import MAX_TIME_SECONDS, MIN_TIME_SECONDS


def parse_time(text: str, what: str) -> float:
    """Unix seconds or an ISO 8601 time (UTC unless it says otherwise)."""
    text = text.strip()
    try:
        t = float(text)
    except ValueError:
        pass
    else:
        if not MIN_TIME_SECONDS <= t <= MAX_TIME_SECONDS:  # nan, inf, or no date at all
            raise BadInputError(f"The {what} {shown(text)} is not a time.", hint="Give unix seconds (1970..2200) or an ISO time such as 2026-11-30T01:28:00.")
        return t
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise BadInputError(
            f"Cannot read the {what} {shown(text)}.", hint="Give unix seconds or an ISO time such as 2026-11-30T01:28:00."
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def parse_window(text: str, what: str = "baseline window") -> tuple[float, float]:
    """'START,END' (unix seconds or ISO times) -> (start, end) in unix seconds, end after start."""
    parts = [p for p in text.split(",") if p.strip()]
    if len(parts) != 2:
        raise BadInputError(f"Cannot read the {what} {shown(text)}.", hint="Write START,END, e.g. 1796002127,1796002132.")
    start, end = parse_time(parts[0], what), parse_time(parts[1], what)
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        raise BadInputError(f"The {what} must end after it starts: {shown(text)}.", hint="Write START,END with START first.")
    return start, end


def format_time(t: float) -> str:
    """Unix seconds as the ISO time (UTC, to the second) a user can type back."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def require_overlap(start: float | None, end: float | None, data: tuple[float, float] | None, where: str, *,
                    hint: str = "Give --start / --end inside that span, or leave them out for all of it.") -> None:
    """Refuse a --start/--end window that holds none of the data's time span (`data`: first and last sample;
    None: no data, which callers say in their own words): an analysis of nothing would read as all clear."""
    if data is None or (start is None and end is None):
        return
    first, last = data
    lo, hi = (start if start is not None else first), (end if end is not None else last)
    if lo <= last and hi >= first and hi > lo:
        return
    if start is not None and start > last:
        what = f"no samples after {format_time(start)}"
    elif end is not None and end < first:
        what = f"no samples before {format_time(end)}"
    else:
        what = f"no samples between {format_time(lo)} and {format_time(hi)}"
    raise BadInputError(f"{where} holds {what}: its samples run from {format_time(first)} to {format_time(last)}.", hint=hint)
