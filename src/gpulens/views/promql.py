"""The panels' series as PromQL, for the Grafana export and the dashboard's Prometheus reader.

Over Prometheus a per-event series (a request's latency, a step's time) is seen as the agent
exports it: its latest value at each scrape. Percentiles over Prometheus are therefore quantiles
of those scraped values (quantile_over_time), an approximation; the local store keeps every event
and computes exact percentiles.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpulens.views.panels import SeriesSpec, StatSpec

_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def quote(value: str) -> str:
    """A PromQL string literal (double-quoted, backslash-escaped)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def selector(metric: str, match: Mapping[str, str], regex: Mapping[str, str] | None = None) -> str:
    """metric{k="v", ...}; `regex` adds k=~"v" matchers (Grafana variables)."""
    parts = [f"{k}={quote(v)}" for k, v in sorted(match.items()) if _LABEL.match(k)]
    parts += [f"{k}=~{quote(v)}" for k, v in sorted((regex or {}).items()) if _LABEL.match(k)]
    return f"{metric}{{{', '.join(parts)}}}" if parts else metric


def series_expr(spec: SeriesSpec, match: Mapping[str, str], window: str, regex: Mapping[str, str] | None = None) -> str:
    """The PromQL of one drawn series. `window` is a range such as 1m or $__rate_interval."""
    m = {**match, **spec.match_dict}
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
    sel = selector(stat.metric, {**match, **dict(stat.match)}, regex)
    if stat.agg in _OVER_TIME:
        outer = "max" if stat.agg == "max" else "min" if stat.agg == "min" else "avg"
        return f"{outer}({_OVER_TIME[stat.agg]}({sel}[{window}]))"
    if stat.agg in _QUANT:
        return f"quantile_over_time({_QUANT[stat.agg]}, {sel}[{window}])"
    return None
