"""What a Reader answers, in two protocols: the panel questions (drawn lines, headline numbers,
events, alerts, bands) and the analysis questions (series windows, events, latest values).

Two, not one, because they are answered differently far from the store: a panel question is one
PromQL query shaped for a chart, an analysis question asks for the samples themselves. A surface
asks for the protocol it needs (views: PanelReader; diagnose and energy: AnalysisReader), and a
source may answer both (`StoreReader`) or one: over Prometheus the dashboard's `PrometheusReader`
(gpulens.views.prometheus) answers the panels and `PrometheusAnalysisReader` (gpulens.reader.prometheus)
the analyses, over one transport (gpulens.reader.prometheus_api). All times are unix seconds; every answer is typed.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Protocol, runtime_checkable

from gpulens.errors import UnavailableError
from gpulens.reader.answers import AlertRow, Band, EventRow, LatestValue, Line, SeriesWindow
from gpulens.vocab import names as N

StatAggName = str  # "count" | "mean" | "max" | "min" | "p50" | "p95" | "p99" | "sum"
QUANTILE_OF_AGG = {"p50": 0.50, "p95": 0.95, "p99": 0.99}
# The series label each selection key (gpu, job, service, host) filters on; others: the same name.
SELECTION_LABEL = {"job": N.TRAIN_JOB_LABEL}
SELECTION_KEYS = ("gpu", "job", "service", "host")


def selection_label(key: str) -> str:
    return SELECTION_LABEL.get(key, key)


class CannotAnswerError(UnavailableError):
    """A reader cannot answer this kind of question: e.g. the dashboard's Prometheus reader, asked for diagnosis."""


class PanelReader(Protocol):
    """The few questions a dashboard panel asks (gpulens.views)."""

    kind: str  # "store" or "prometheus"
    description: str
    supports_events: bool  # XID events, cold starts... (Prometheus keeps only counters)

    def data_range(self) -> tuple[float, float] | None: ...
    def label_values(self) -> dict[str, list[str]]: ...
    def has_data(self, metric: str, match: Mapping[str, str], start: float, end: float) -> bool: ...
    def line(self, metric: str, match: Mapping[str, str], start: float, end: float, points: int) -> list[Line]: ...
    def quantile(self, metric: str, match: Mapping[str, str], q: float, start: float, end: float, points: int) -> list[Line]: ...
    def rate(self, metric: str, match: Mapping[str, str], start: float, end: float, points: int) -> list[Line]: ...
    def events_per_second(self, metric: str, match: Mapping[str, str], start: float, end: float, points: int) -> list[Line]: ...
    def aggregate(self, metric: str, match: Mapping[str, str], agg: str, start: float, end: float) -> float | None: ...
    def events(self, kinds: tuple[str, ...], start: float, end: float, match: Mapping[str, str]) -> list[EventRow]: ...
    def alerts(self, start: float, end: float) -> list[AlertRow]: ...
    def band(self, metric: str, match: Mapping[str, str], t: float) -> Band | None: ...
    def close(self) -> None: ...


@runtime_checkable
class AnalysisReader(Protocol):
    """What the analyzers (gpulens.diagnose, gpulens.energy) read: samples and events themselves.

    `match` keeps the series (or events) whose labels include it; None or {} keeps all. A window
    bound of None is open. Answers are oldest first.
    """

    description: str

    def cache_key(self) -> Hashable:
        """Which data this is, in this state: equal keys mean equal answers (for analyzer caches)."""
        ...

    def time_range(self, metric: str | None = None) -> tuple[float, float] | None:
        """First and last sample time of `metric` (of everything, events included, when None)."""
        ...

    def series_labels(self, metric: str, match: Mapping[str, str] | None = None) -> list[dict[str, str]]:
        """The label set of every series of `metric` that matches."""
        ...

    def series_windows(
        self, metric: str, match: Mapping[str, str] | None = None, *, start: float | None = None,
        end: float | None = None, max_points: int | None = None,
    ) -> list[SeriesWindow]:
        """Each matching series' samples in [start, end]; with `max_points`, at most that many
        buckets per series (from the coarsest roll-up that still gives them)."""
        ...

    def latest_values(self, metric: str, match: Mapping[str, str] | None = None) -> list[LatestValue]:
        """The newest sample of each matching series."""
        ...

    def event_rows(
        self, kind: str, *, start: float | None = None, end: float | None = None, match: Mapping[str, str] | None = None,
    ) -> list[EventRow]:
        """Events of `kind` in [start, end] whose labels include `match`."""
        ...

    def setting(self, key: str) -> str | None:
        """A setting stored beside the data (e.g. the configured SLOs), None when unset."""
        ...
