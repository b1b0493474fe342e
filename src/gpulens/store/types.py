"""Typed results of store queries. Times are unix seconds."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeVar

Resolution = Literal["raw", "1m", "1h"]


def canonical_labels(labels: dict[str, str] | None) -> str:
    """The one spelling of a label set used as part of a series' identity."""
    if not labels:
        return "{}"
    return json.dumps({k: str(v) for k, v in sorted(labels.items())}, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class SeriesKey:
    name: str
    labels: dict[str, str] = field(hash=False, compare=True)

    @property
    def labels_json(self) -> str:
        return canonical_labels(self.labels)

    def __hash__(self) -> int:
        return hash((self.name, self.labels_json))


@dataclass(slots=True)
class SeriesData:
    """Points of one series. For roll-up resolutions `value` is the mean per bucket and
    `value_min`/`value_max` the extremes; for raw data all three are the same samples."""

    key: SeriesKey
    resolution: Resolution
    t: list[float]
    value: list[float]
    value_min: list[float]
    value_max: list[float]
    count: list[int]
    bucket_seconds: float | None = None  # each point's window when the points are bucket means; None for raw samples

    def __len__(self) -> int:
        return len(self.t)


@dataclass(frozen=True, slots=True)
class LatestValue:
    key: SeriesKey
    t: float
    value: float


@dataclass(frozen=True, slots=True)
class Event:
    """A discrete record: an XID, an alert, a training step, a request, a phase marker..."""

    id: int
    t: float
    kind: str
    labels: dict[str, str]
    data: dict[str, Any]


class Sample(NamedTuple):
    """One stored sample: time in unix seconds, value in the series' unit."""

    t: float
    value: float


@dataclass(frozen=True, slots=True)
class StoredSeries:
    """A series with its id, for readers that cache ids and query by them."""

    id: int
    name: str
    labels: dict[str, str]


@dataclass(frozen=True, slots=True)
class DataVersion:
    """The newest event id and sample row: equal versions mean no data was added between them."""

    max_event_id: int
    max_sample_rowid: int


@dataclass(frozen=True, slots=True)
class SampleColumns:
    """Samples as columns: times in unix seconds, values in the series' unit."""

    t: list[float]
    value: list[float]


@dataclass(frozen=True, slots=True)
class SampleSummary:
    """Count, sum, min and max of samples (min/max None when there are none)."""

    count: int
    total: float
    minimum: float | None
    maximum: float | None


_Labelled = TypeVar("_Labelled", SeriesKey, Event)


def with_labels(items: list[_Labelled], labels: Mapping[str, str] | None) -> list[_Labelled]:
    """The items whose labels include every one of `labels` (values compared as text, the way
    they are stored); all of them when `labels` is empty."""
    if not labels:
        return items
    want = {k: str(v) for k, v in labels.items()}
    return [x for x in items if all(x.labels.get(a) == b for a, b in want.items())]
