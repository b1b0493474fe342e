"""Parsing of the durations, speed factors, sizes and addresses a user types."""

from __future__ import annotations

import math
import re
from typing import Literal, overload

from gpulens.errors import BadInputError, shown

# Times (unix seconds) and readings gpulens stores: 1970 to 2200, magnitudes up to 1e18 (bytes,
# joules and hertz stay far below). Beyond is a broken clock or a corrupt line, and would overflow
# the date arithmetic of every report that reads it back. The store refuses them at its door.
MIN_TIME_SECONDS = 0.0
MAX_TIME_SECONDS = 7_258_118_400.0
MAX_ABS_VALUE = 1e18
# A recording (a trace line, a workload record) is held tighter than the store: what a recording
# made by a working clock can plausibly hold ends in 2100. A line dated past it is skipped.
MAX_RECORDED_TIME_SECONDS = 4_102_444_800.0  # 2100-01-01T00:00:00Z
# The longest duration a user may type (100 years): beyond it no date arithmetic holds.
MAX_DURATION_SECONDS = 100 * 365 * 86400.0

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d|w)?\s*$")
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0, None: 1.0}


def parse_duration(text: str | float | int, *, what: str = "duration", allow_zero: bool = False) -> float:
    """'500ms', '1s', '15m', '7d' or a bare number of seconds -> seconds."""
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        m = _DURATION.match(str(text))
        if not m:
            raise BadInputError(
                f"Cannot read {what} {shown(text)}.", hint="Write a number with a unit: 500ms, 1s, 15m, 2h, 7d."
            )
        seconds = float(m.group(1)) * _SECONDS[m.group(2)]
    if not math.isfinite(seconds) or seconds > MAX_DURATION_SECONDS:
        raise BadInputError(f"The {what} {shown(text)} is not a usable duration.", hint="Give at most 100 years, e.g. 30d.")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise BadInputError(f"The {what} must be above zero, not {shown(text)}.", hint="Give a positive value such as 1s.")
    return seconds


_SPEED = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*[x×]?\s*$", re.IGNORECASE)
# The fastest replay a user may ask for: beyond it every recorded gap rounds to nothing anyway.
MAX_SPEED_FACTOR = 1e9


@overload
def parse_speed(text: str | float | int, *, what: str = ..., allow_max: Literal[False] = ...) -> float: ...
@overload
def parse_speed(text: str | float | int, *, what: str = ..., allow_max: bool) -> float | None: ...
def parse_speed(text: str | float | int, *, what: str = "--speed", allow_max: bool = False) -> float | None:
    """'2', '2x', '50.5' -> a positive factor of the recorded pace; 'max' -> None where `allow_max`.

    A factor, never a duration: '2m' used to read as 120 (seconds), so it is refused with the reason."""
    if allow_max and isinstance(text, str) and text.strip().lower() == "max":
        return None
    if isinstance(text, int | float) and not isinstance(text, bool):
        factor = float(text)
    else:
        m = _SPEED.match(str(text))
        if not m:
            also = " or max" if allow_max else ""
            why = "it is a factor of the recorded pace, not a duration" if _DURATION.match(str(text)) else \
                "it takes a factor of the recorded pace, written as a plain decimal"
            raise BadInputError(f"Cannot read {what} {shown(text)}: {why}.", hint=f"Write a number such as 1, 2, 10x or 0.5{also}.")
        factor = float(m.group(1))
    if not math.isfinite(factor) or not 0 < factor <= MAX_SPEED_FACTOR:
        raise BadInputError(f"{what} must be a factor above zero and at most {MAX_SPEED_FACTOR:,.0f}, not {shown(text)}.",
                            hint="Give a positive number such as 1 (the recorded pace) or 10 (ten times faster).")
    return factor


def parse_listen(text: str) -> tuple[str, int]:
    """'127.0.0.1:9464', '[::1]:9464', ':9464' or '9464' -> (host, port)."""
    host, sep, port = str(text).rpartition(":")
    if not sep:
        host, port = "127.0.0.1", str(text)
    if host.startswith("[") and host.endswith("]") and len(host) > 2:
        host = host[1:-1]  # an IPv6 address, bracketed as in a URL
    elif "[" in host or "]" in host or ":" in host:  # '[::1' or a bare IPv6 address: which colon ends it?
        host = ""
        port = "not a port"
    try:
        p = int(port)
        if not 0 <= p <= 65535:
            raise ValueError
    except ValueError:
        raise BadInputError(f"Cannot read the listen address {shown(text)}.",
                            hint="Write HOST:PORT, e.g. 127.0.0.1:9464 or [::1]:9464.") from None
    return host or "127.0.0.1", p


def format_bytes(n: float | None) -> str:
    if n is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def format_seconds(s: float | None) -> str:
    if s is None:
        return "–"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 120:
        return f"{s:.2f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"
