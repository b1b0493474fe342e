"""Values in base units -> the short text a person reads. The dashboard's JavaScript mirrors these
rules for axis ticks; headline numbers are formatted here so the page and the reports agree."""

from __future__ import annotations

import math

from gpulens.units import format_bytes, format_seconds


def _si(value: float, unit: str) -> str:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}".rstrip()
    return f"{value:.3g} {unit}".rstrip()


def format_value(value: float | None, unit: str) -> str:
    """One value for display; None or NaN shows as a dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if unit == "seconds":
        return "0 s" if value == 0 else format_seconds(value)
    if unit == "bytes":
        return format_bytes(value)
    if unit == "ratio":
        return f"{value * 100:.1f} %"
    if unit == "celsius":
        return f"{value:.0f} °C"
    if unit == "watts":
        return f"{value:.0f} W"
    if unit == "hertz":
        return _si(value, "Hz")
    if unit == "per_second":
        return _si(value, "/s")
    if unit == "flag":
        return "on" if value >= 0.5 else "off"
    if unit == "joules_per_token":
        return f"{value:.3g} J/token"  # the precision `gpulens energy` prints
    if unit == "count":
        return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"
    return f"{value:.4g}"
