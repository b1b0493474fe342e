"""The panels' series as PromQL, for the Grafana export and the dashboard's Prometheus reader.

A per-event series (a request's latency, a step's time) reaches Prometheus as the histogram the agent
counts from every event (`workload.names.HISTOGRAM_BUCKETS`), so percentiles are `histogram_quantile`
over the merged buckets of the selection: right over any window, as exact as the bucket bounds
around them (the local store keeps every event and computes them exactly). A drawn "line" of such a
series is its mean per event over the window.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpulens.views.panels import SeriesSpec, StatSpec
from gpulens.vocab.names import HISTOGRAM_BUCKETS

_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def quote(value: str) -> str:
    """A PromQL string literal (double-quoted, backslash-escaped)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def selector(metric: str, match: Mapping[str, str], regex: Mapping[str, str] | None = None) -> str:
    """metric{k="v", ...}; `regex` adds k=~"v" matchers (Grafana variables)."""
    parts = [f"{k}={quote(v)}" for k, v in sorted(match.items()) if _LABEL.match(k)]
    parts += [f"{k}=~{quote(v)}" for k, v in sorted((regex or {}).items()) if _LABEL.match(k)]
    return f"{metric}{{{', '.join(parts)}}}" if parts else metric


def is_histogram(metric: str) -> bool:
    return metric in HISTOGRAM_BUCKETS


def histogram_quantile_expr(q: float, metric: str, match: Mapping[str, str], window: str, regex: Mapping[str, str] | None = None,
                            fn: str = "rate") -> str:
    """The q-quantile of every event of the selection in the window (buckets merged: never averaged)."""
    return f"histogram_quantile({q}, sum by (le) ({fn}({selector(metric + '_bucket', match, regex)}[{window}])))"


def histogram_mean_expr(metric: str, match: Mapping[str, str], window: str, regex: Mapping[str, str] | None = None) -> str:
    """Mean per event in each window, one line per label set."""
    return f"rate({selector(metric + '_sum', match, regex)}[{window}]) / rate({selector(metric + '_count', match, regex)}[{window}])"


def series_expr(spec: SeriesSpec, match: Mapping[str, str], window: str, regex: Mapping[str, str] | None = None) -> str:
    """The PromQL of one drawn series. `window` is a range such as 1m or $__rate_interval."""
    m = {**match, **spec.match_dict}
    if is_histogram(spec.metric):
        if spec.kind == "quantile":
            return histogram_quantile_expr(spec.quantile, spec.metric, m, window, regex)  # type: ignore[arg-type]
        if spec.kind == "events_per_second" and not spec.counter:
            return f"sum(rate({selector(spec.metric + '_count', m, regex)}[{window}]))"
        if spec.kind == "line":
            return histogram_mean_expr(spec.metric, m, window, regex)
    if spec.kind == "quantile":
        return f"quantile_over_time({spec.quantile}, {selector(spec.metric, m, regex)}[{window}])"
    if spec.kind == "rate":
        return f"rate({selector(spec.metric, m, regex)}[{window}])"
    if spec.kind == "events_per_second":
        return f"sum(rate({selector(spec.counter or spec.metric, m, regex)}[{window}]))"
    return selector(spec.metric, m, regex)


_OVER_TIME = {"mean": "avg_over_time", "max": "max_over_time", "min": "min_over_time"}
_QUANT = {"p50": 0.5, "p95": 0.95, "p99": 0.99}


def stat_expr(stat: StatSpec, match: Mapping[str, str], window: str, regex: Mapping[str, str] | None = None) -> str | None:
    """The PromQL of a headline number over `window`, or None when Prometheus cannot answer it."""
    m = {**match, **dict(stat.match)}
    sel = selector(stat.metric, m, regex)
    if is_histogram(stat.metric):
        count, total = selector(stat.metric + "_count", m, regex), selector(stat.metric + "_sum", m, regex)
        if stat.agg in _QUANT:
            return histogram_quantile_expr(_QUANT[stat.agg], stat.metric, m, window, regex, fn="increase")
        if stat.agg == "count":
            return f"sum(increase({count}[{window}]))"
        if stat.agg == "mean":
            return f"sum(increase({total}[{window}])) / sum(increase({count}[{window}]))"
        if stat.agg == "sum_ratio" and stat.denominator and is_histogram(stat.denominator):
            den = selector(stat.denominator + "_sum", m, regex)
            return f"sum(increase({total}[{window}])) / sum(increase({den}[{window}]))"
        return None  # a histogram keeps no min or max
    if stat.agg in _OVER_TIME:
        outer = "max" if stat.agg == "max" else "min" if stat.agg == "min" else "avg"
        return f"{outer}({_OVER_TIME[stat.agg]}({sel}[{window}]))"
    if stat.agg in _QUANT:
        return f"quantile_over_time({_QUANT[stat.agg]}, {sel}[{window}])"
    return None
