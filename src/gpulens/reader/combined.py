"""Several analysis readers read as one: the stores of a fleet's nodes, diagnosed together (a
straggler rank on one node is only slow against its peers on the others). Each answer is the union
of the parts' answers; the series of different nodes differ by their `host` label."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from gpulens.reader.answers import EventRow, LatestValue, SeriesWindow
from gpulens.reader.protocols import AnalysisReader


class CombinedReader:
    def __init__(self, parts: Sequence[AnalysisReader]):
        self.parts = list(parts)
        self.description = " + ".join(p.description for p in self.parts)

    def cache_key(self) -> Hashable:
        return tuple(p.cache_key() for p in self.parts)

    def time_range(self, metric: str | None = None) -> tuple[float, float] | None:
        got = [r for p in self.parts if (r := p.time_range(metric)) is not None]
        return (min(a for a, _ in got), max(b for _, b in got)) if got else None

    def series_labels(self, metric: str, match: Mapping[str, str] | None = None) -> list[dict[str, str]]:
        return [labels for p in self.parts for labels in p.series_labels(metric, match)]

    def series_windows(self, metric: str, match: Mapping[str, str] | None = None, *, start: float | None = None,
                       end: float | None = None, max_points: int | None = None) -> list[SeriesWindow]:
        return [w for p in self.parts for w in p.series_windows(metric, match, start=start, end=end, max_points=max_points)]

    def latest_values(self, metric: str, match: Mapping[str, str] | None = None) -> list[LatestValue]:
        return [v for p in self.parts for v in p.latest_values(metric, match)]

    def event_rows(self, kind: str, *, start: float | None = None, end: float | None = None,
                   match: Mapping[str, str] | None = None) -> list[EventRow]:
        rows = [e for p in self.parts for e in p.event_rows(kind, start=start, end=end, match=match)]
        return sorted(rows, key=lambda e: e.t)

    def setting(self, key: str) -> str | None:
        return next((v for p in self.parts if (v := p.setting(key)) is not None), None)
