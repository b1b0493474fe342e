"""Points and spans of time as a user types them (unix seconds or ISO 8601 times, and START,END
windows) and as a user reads them.

`report`, `diagnose` and every other command that takes a time read it here, so one spelling works
everywhere and the same bounds (1970..2200, those the store keeps) apply. Every command that prints a
time writes it here too, in one zone, UTC, and says so: a time typed without a zone is read as UTC, so
a time copied from any output and typed back means the same instant, whatever the machine's TZ.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Literal

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


ZONE = "UTC"  # the zone of every time shown; a table names it once in its column's header
Precision = Literal["minute", "second", "millisecond"]
_CLOCK = {"minute": "%H:%M", "second": "%H:%M:%S", "millisecond": "%H:%M:%S.%f"}


def format_time(t: float) -> str:
    """Unix seconds as the ISO time (UTC, to the second) a user can type back."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_when(t: float | None, *, date: bool = True, precision: Precision = "second", zone: bool = True) -> str:
    """Unix seconds as people read them: `2026-11-30 01:28:47 UTC`. `date=False` for a time of day
    inside text that has given the date; `zone=False` only in a column whose header names ZONE.
    "–" for none (never set); a time no date holds (an older store) says so."""
    if t is None:
        return "–"
    try:
        dt = datetime.fromtimestamp(t, UTC)
    except (OverflowError, OSError, ValueError):
        return f"t={t!r} (not a date)"
    text = dt.strftime(("%Y-%m-%d " if date else "") + _CLOCK[precision])
    if precision == "millisecond":
        text = text[:-3]
    return f"{text} {ZONE}" if zone else text


def format_span(start: float | None, end: float | None, *, precision: Precision = "second") -> str:
    """From `start` to `end` with one zone label: `2026-11-30 01:28:39 → 01:28:47 UTC`; the end
    keeps its date when it falls on another day. Only the start when there is no end."""
    if end is None:
        return format_when(start, precision=precision)
    first = format_when(start, precision=precision, zone=False)
    same_day = first[:10] == format_when(end, precision=precision, zone=False)[:10]
    return f"{first} → {format_when(end, date=not same_day, precision=precision)}"


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
