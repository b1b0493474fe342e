"""The typed answers a Reader gives: a drawn line, an event, an alert, a baseline band (the panel
questions), and a series window and a latest value (the analysis questions).

Their own module, below the readers and everything that builds or reads them (no import cycle).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Resolution = Literal["raw", "1m", "1h"]


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


@dataclass(frozen=True)
class SeriesWindow:
    """The samples of one series over a window, oldest first. Read from a roll-up (`resolution`
    1m or 1h) `value` is the mean per bucket and `value_min` / `value_max` its extremes; raw, all
    three are the samples themselves."""

    name: str
    labels: dict[str, str]
    t: list[float]
    value: list[float]
    value_min: list[float]
    value_max: list[float]
    resolution: Resolution = "raw"

    def __len__(self) -> int:
        return len(self.t)

    @property
    def identity(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        """Name and labels, hashable: two windows of one series have the same identity."""
        return self.name, tuple(sorted(self.labels.items()))


@dataclass(frozen=True)
class LatestValue:
    """The newest sample of one series."""

    name: str
    labels: dict[str, str]
    t: float
    value: float
