"""The typed answers a Reader gives (a drawn line, an event, an alert, a baseline band).

Their own module, below the readers and the integrations that both build them (no import cycle).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Line:
    """One drawn series. `value` may hold None where a bucket is empty."""

    labels: dict[str, str]
    t: list[float]
    value: list[float | None]
    value_min: list[float | None] | None = None
    value_max: list[float | None] | None = None


@dataclass
class EventRow:
    t: float
    kind: str
    labels: dict[str, str]
    data: dict[str, Any]


@dataclass
class AlertRow:
    t: float
    name: str
    state: str  # firing | resolved | pending
    severity: str
    summary: str
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class Band:
    """A learned baseline: the normal range of a series (from gpulens.alerts when it has one)."""

    low: float
    high: float
    center: float | None = None
