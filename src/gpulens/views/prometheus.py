"""A Reader over a Prometheus server's HTTP API: the dashboard for a fleet of `gpulens agent`s.

The panels ask the same questions as over a local store; the answers are PromQL (gpulens.views.promql,
written by gpulens.promql).
What Prometheus cannot know is said, not invented: it keeps no events (XIDs, cold starts) and no
per-request samples (percentiles are quantiles of scraped values). This reader answers the panel
questions only; the analysis questions (gpulens.reader.AnalysisReader) are answered over the same
transport (gpulens.reader.prometheus_api) by gpulens.reader.prometheus.PrometheusAnalysisReader, and
here they say so in one sentence.

`matchers` (a `--match` selector, parsed by gpulens.promql.parse_matchers) narrow every query to the
series that meet them all, on top of the panel's own job / service / GPU / host selection: the
charts, the headline numbers, the label values offered and the alerts cover exactly those series.
Each matcher is written back by gpulens.promql (its value a quoted literal), so a label value can
never close the selector it sits in.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from gpulens import promql as P
from gpulens.promql import Matcher
from gpulens.reader import (
    QUANTILE_OF_AGG,
    AlertRow,
    Band,
    CannotAnswerError,
    EventRow,
    LatestValue,
    Line,
    SeriesWindow,
    selection_label,
)
from gpulens.reader.prometheus_api import (
    MAX_ANSWER_BYTES,
    TIMEOUT_SECONDS,
    PrometheusApi,
    PrometheusUnavailableError,
)
from gpulens.stats import quantile
from gpulens.views.promql import histogram_mean_expr, histogram_quantile_expr, is_histogram

__all__ = ["MAX_ANSWER_BYTES", "TIMEOUT_SECONDS", "PrometheusReader", "PrometheusUnavailableError"]

SELECTION_LABELS = ("gpu", "job", "service", "host")


def _window(seconds: float) -> float:
    """A query's window in seconds, at least the millisecond PromQL durations resolve."""
    return max(seconds, 0.001)


class PrometheusReader:
    kind = "prometheus"
    supports_events = False

    def __init__(self, url: str, *, timeout_seconds: float = TIMEOUT_SECONDS, matchers: Sequence[Matcher] = ()):
        self.api = PrometheusApi(url, timeout_seconds=timeout_seconds)  # the transport, shared with the analysis reader
        self.url = self.api.url
        self.timeout_seconds = timeout_seconds
        self.matchers = tuple(matchers)
        shown = ", ".join(m.promql() for m in self.matchers)
        self.description = f"Prometheus {self.url}" + (f" {{{shown}}}" if shown else "")

    def _sel(self, metric: str, match: Mapping[str, str]) -> str:
        """metric{the panel's selection, then every --match matcher}."""
        return P.selector(metric, match, extra=self.matchers)

    def meets_matchers(self, labels: Mapping[str, str]) -> bool:
        """Whether a label set meets every matcher, by PromQL's rules: a missing label is the empty
        string; a regular expression matches the whole value (RE2 read as Python's re: the same for
        the patterns selectors use)."""
        for m in self.matchers:
            v = labels.get(m.label, "")
            hit = v == m.value if m.op in ("=", "!=") else re.fullmatch(m.value, v) is not None
            if hit != (m.op in ("=", "=~")):
                return False
        return True

    def close(self) -> None:
        pass

    # ------------------------------------------------------------ HTTP (gpulens.reader.prometheus_api)
    def _get(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        return self.api.get(path, params)

    def check(self) -> None:
        """Fail early, with one sentence, when the server is not there."""
        self.api.check()

    def _range(self, expr: str, start: float, end: float, points: int) -> list[dict[str, Any]]:
        return self.api.range(expr, start, end, (end - start) / max(points, 1))

    def _instant(self, expr: str, t: float) -> list[dict[str, Any]]:
        return self.api.instant(expr, t)

    @staticmethod
    def _lines(result: list[dict[str, Any]]) -> list[Line]:
        out = []
        for r in result:
            labels = {k: v for k, v in r.get("metric", {}).items() if k != "__name__"}
            t = [float(p[0]) for p in r.get("values", [])]
            v = [float(p[1]) for p in r.get("values", [])]
            out.append(Line(labels, t, [x if math.isfinite(x) else None for x in v]))
        return out

    # ------------------------------------------------------------ Reader
    def data_range(self) -> tuple[float, float] | None:
        return None  # Prometheus does not say cheaply; the window ends now

    def label_values(self) -> dict[str, list[str]]:
        out = {}
        for name in SELECTION_LABELS:
            # Only the values of the selected series: `match[]` (any metric name, so never a bare {}).
            params = {"match[]": P.series_selector((Matcher("__name__", "=~", ".+"), *self.matchers))} if self.matchers else None
            vals = self._get(f"/api/v1/label/{selection_label(name)}/values", params)
            out[name] = sorted(vals or [], key=lambda s: (len(s), s))
        return out

    def has_data(self, metric: str, match: Mapping[str, str], start: float, end: float) -> bool:
        name = metric + "_count" if is_histogram(metric) else metric
        return bool(self._instant(P.over_time("count", self._sel(name, match), _window(end - start)), end))

    def line(self, metric: str, match: Mapping[str, str], start: float, end: float, points: int) -> list[Line]:
        if is_histogram(metric):  # the mean per event in each step's window
            window = _window(max((end - start) / max(points, 1) * 4, 60.0))
            return self._lines(self._range(histogram_mean_expr(metric, match, window, extra=self.matchers), start, end, points))
        return self._lines(self._range(self._sel(metric, match), start, end, points))

    def quantile(self, metric: str, match: Mapping[str, str], q: float, start: float, end: float, points: int) -> list[Line]:
        # Buckets a quarter as many as points, like the store reader's percentiles.
        n = max(1, points // 4)
        window = _window((end - start) / n)
        if is_histogram(metric):
            return self._lines(self._range(histogram_quantile_expr(q, metric, match, window, extra=self.matchers), start, end, n))
        return self._lines(self._range(P.over_time("quantile", self._sel(metric, match), window, q), start, end, n))

    def rate(self, metric: str, match: Mapping[str, str], start: float, end: float, points: int) -> list[Line]:
        window = _window(max((end - start) / max(points, 1) * 4, 60.0))
        return self._lines(self._range(P.rate(self._sel(metric, match), window), start, end, points))

    def events_per_second(self, metric: str, match: Mapping[str, str], start: float, end: float, points: int) -> list[Line]:
        # Prometheus sees no single events: `metric` is the counter of them (SeriesSpec.counter).
        window = _window(max((end - start) / max(points, 1) * 4, 60.0))
        return self._lines(self._range(P.aggregate("sum", P.rate(self._sel(metric, match), window)), start, end, points))

    def aggregate(self, metric: str, match: Mapping[str, str], agg: str, start: float, end: float) -> float | None:
        if is_histogram(metric):
            return self._histogram_aggregate(metric, match, agg, start, end)
        sel, window = self._sel(metric, match), _window(end - start)
        if agg in QUANTILE_OF_AGG:
            # Every raw sample in the window, merged across series: percentiles are never averaged.
            vals = [float(v[1]) for r in self._instant(P.ranged(sel, window), end) for v in r.get("values", [])]
            return quantile(vals, QUANTILE_OF_AGG[agg])

        def total(fn: str, outer: str = "sum") -> str:
            return P.aggregate(outer, P.over_time(fn, sel, window))

        expr = {
            "count": total("count"),
            "sum": total("sum"),
            "max": total("max", "max"),
            "min": total("min", "min"),
            "mean": P.ratio(total("sum"), total("count")),
        }.get(agg)
        if expr is None:
            raise ValueError(f"unknown aggregate {agg!r}")
        res = self._instant(expr, end)
        if not res:
            return 0.0 if agg == "count" else None
        v = float(res[0]["value"][1])
        return v if math.isfinite(v) else None

    def _histogram_aggregate(self, metric: str, match: Mapping[str, str], agg: str, start: float, end: float) -> float | None:
        window = _window(end - start)
        count = P.aggregate("sum", P.increase(self._sel(metric + "_count", match), window))
        total = P.aggregate("sum", P.increase(self._sel(metric + "_sum", match), window))
        if agg in QUANTILE_OF_AGG:
            expr = histogram_quantile_expr(QUANTILE_OF_AGG[agg], metric, match, window, fn="increase", extra=self.matchers)
        else:
            expr = {"count": count, "sum": total, "mean": P.ratio(total, count)}.get(agg)
            if expr is None:
                return None  # a histogram keeps no min or max
        res = self._instant(expr, end)
        if not res:
            return 0.0 if agg == "count" else None
        v = float(res[0]["value"][1])
        if agg == "count" and math.isfinite(v):
            # increase() extrapolates to the window's edges (831.01 steps): a count of events is whole
            return float(round(v))
        return v if math.isfinite(v) else None

    def events(self, kinds: tuple[str, ...], start: float, end: float, match: Mapping[str, str]) -> list[EventRow]:
        return []

    def alerts(self, start: float, end: float) -> list[AlertRow]:
        """The alerts Prometheus holds now (pending or firing), from the rules gpulens exported."""
        from datetime import datetime

        rows = []
        for a in self._get("/api/v1/alerts").get("alerts", []):
            labels = a.get("labels", {})
            if not self.meets_matchers(labels):
                continue  # an alert of series the --match selector leaves out
            try:
                t = datetime.fromisoformat(a.get("activeAt", "").replace("Z", "+00:00")).timestamp()
            except ValueError:
                t = end
            if t > end:
                continue
            ann = a.get("annotations", {})
            rows.append(AlertRow(t, labels.get("alertname", "alert"), a.get("state", "firing"), labels.get("severity", "warning"),
                                 ann.get("summary", ""), labels))
        return rows

    def band(self, metric: str, match: Mapping[str, str], t: float) -> Band | None:
        return None

    # ------------------------------------------------------------ analysis questions (another reader's)
    def _cannot_analyze(self) -> CannotAnswerError:
        return CannotAnswerError(
            f"The dashboard's reader of {self.description} answers panels only: diagnosis reads it through PrometheusAnalysisReader.",
            hint=f"Run `gpulens diagnose --prometheus {self.url}`.",
        )

    def cache_key(self) -> Hashable:
        raise self._cannot_analyze()

    def time_range(self, metric: str | None = None) -> tuple[float, float] | None:
        raise self._cannot_analyze()

    def series_labels(self, metric: str, match: Mapping[str, str] | None = None) -> list[dict[str, str]]:
        raise self._cannot_analyze()

    def series_windows(
        self, metric: str, match: Mapping[str, str] | None = None, *, start: float | None = None,
        end: float | None = None, max_points: int | None = None,
    ) -> list[SeriesWindow]:
        raise self._cannot_analyze()

    def latest_values(self, metric: str, match: Mapping[str, str] | None = None) -> list[LatestValue]:
        raise self._cannot_analyze()

    def event_rows(
        self, kind: str, *, start: float | None = None, end: float | None = None, match: Mapping[str, str] | None = None,
    ) -> list[EventRow]:
        raise self._cannot_analyze()

    def setting(self, key: str) -> str | None:
        raise self._cannot_analyze()
