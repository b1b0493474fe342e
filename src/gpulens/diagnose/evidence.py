"""Typed evidence: the numbers behind a finding, each with its unit where it has one.

A `Quantity` is a float that knows its unit (`Seconds(0.25) == 0.25`, JSON writes it as 0.25), so
analyzers state the unit where they compute a value, and every surface (terminal, dashboard, report,
JSON) formats it the same way from its type, never from a guess at the key's name.

    ev = {"median_step_seconds": seconds(med), "data_wait_share": ratio(share), "steps": len(seg)}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from gpulens.units import format_bytes, format_seconds


class Quantity(float):
    unit: ClassVar[str] = ""
    # how a key names this unit (names carry units): its label drops it, since the text shows it
    key_suffixes: ClassVar[tuple[str, ...]] = ()

    def text(self) -> str:
        v = float(self)
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


class Seconds(Quantity):
    unit = "seconds"
    key_suffixes = ("_seconds",)

    def text(self) -> str:
        return format_seconds(float(self))


class Bytes(Quantity):
    unit = "bytes"
    key_suffixes = ("_bytes",)

    def text(self) -> str:
        return format_bytes(float(self))


class Ratio(Quantity):
    """A share of a whole, 0..1 (shown as a percentage)."""

    unit = "ratio"
    key_suffixes = ("_ratio",)

    def text(self) -> str:
        return f"{float(self):.0%}"


class Factor(Quantity):
    """How many times another figure (e.g. slow rank vs the others)."""

    unit = "factor"
    key_suffixes = ("_factor",)

    def text(self) -> str:
        return f"{float(self):.2f}×"


class Hertz(Quantity):
    unit = "hertz"
    key_suffixes = ("_hz", "_hertz")

    def text(self) -> str:
        return f"{float(self) / 1e6:,.0f} MHz"


class Celsius(Quantity):
    unit = "celsius"
    key_suffixes = ("_celsius",)

    def text(self) -> str:
        return f"{float(self):.0f} °C"


class Watts(Quantity):
    unit = "watts"
    key_suffixes = ("_watts",)

    def text(self) -> str:
        return f"{float(self):.0f} W"


class PerSecond(Quantity):
    unit = "per_second"
    key_suffixes = ("_per_second",)

    def text(self) -> str:
        return f"{super().text()}/s"


def _maker(cls: type[Quantity]):  # type: ignore[no-untyped-def]
    def make(value: float | None) -> Quantity | None:
        return None if value is None else cls(value)

    make.__name__ = cls.__name__.lower()
    make.__doc__ = f"`{cls.__name__}(value)`, or None for a missing value."
    return make


seconds, bytes_, ratio, factor, hertz, celsius, watts, per_second = (
    _maker(c) for c in (Seconds, Bytes, Ratio, Factor, Hertz, Celsius, Watts, PerSecond)
)


def format_value(v: Any) -> str:
    """One evidence value as text: a quantity by its unit, anything else as it is."""
    if isinstance(v, Quantity):
        return v.text()
    if v is None or (isinstance(v, float) and v != v):  # not measured: a dash, never Python's None or nan
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, Mapping):
        if {"slo", "value"} <= v.keys():  # a missed objective: "p99_latency<=500ms: 2.62 s"
            return f"{v['slo']}: {format_value(v['value'])}"
        return ", ".join(f"{k}: {format_value(x)}" for k, x in v.items())
    if isinstance(v, list | tuple):
        return "; ".join(format_value(x) for x in v)
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def evidence_label(key: str, value: Any) -> str:
    """An evidence key as a label beside its value: `sm clock before` for `sm_clock_before_hz` when
    the value is shown as `1,980 MHz` (the key's unit said twice read "sm clock before hz: 1,980 MHz")."""
    if isinstance(value, Quantity):
        key = next((key[: -len(s)] for s in value.key_suffixes if key.endswith(s) and len(key) > len(s)), key)
    return key.replace("_", " ")


def missed_text(missed: list[Mapping[str, Any]]) -> str:
    """The `missed` evidence of an SLO violation as a sentence names it, each objective with what
    was measured and its bound: `p99 latency 2.84 s (objective ≤ 2 s) and p95 TTFT 1.73 s (≤ 300 ms)`."""
    from gpulens.vocab.slo import parse_slo

    parts = []
    for i, m in enumerate(missed):
        slo = parse_slo(m["slo"])
        measured, bound = slo.measured_and_bound(float(m["value"]))
        parts.append(f"{slo.name} {measured} ({'objective ' if i == 0 else ''}{bound})")
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def unit_of(v: Any) -> str | None:
    """The unit of a value: its own, or the one all values of a mapping share."""
    if isinstance(v, Quantity):
        return v.unit
    if isinstance(v, Mapping) and v:
        units = {unit_of(x) for x in v.values()}
        return units.pop() if len(units) == 1 else None
    return None
