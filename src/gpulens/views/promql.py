"""The panels' series as PromQL, for the Grafana export and the dashboard's Prometheus reader.

A per-event series (a request's latency, a step's time) reaches Prometheus as the histogram the agent
counts from every event (`workload.names.HISTOGRAM_BUCKETS`), so percentiles are `histogram_quantile`
over the merged buckets of the selection: right over any window, as exact as the bucket bounds
around them (the local store keeps every event and computes them exactly). A drawn "line" of such a
series is its mean per event over the window. The text itself (quoting, durations, spelling) is
written by gpulens.promql; a window is seconds or a Grafana variable such as `$__rate_interval`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpulens import promql as P
from gpulens.promql import Window, selector
from gpulens.views.panels import SeriesSpec, StatSpec
from gpulens.vocab.names import HISTOGRAM_BUCKETS, INFER_OUTPUT_TOKENS_TOTAL, INFER_REQUEST_OUTPUT_TOKENS

__all__ = ["histogram_mean_expr", "histogram_quantile_expr", "is_histogram", "joules_per_output_token_expr", "selector",
           "series_expr", "stat_expr"]


def is_histogram(metric: str) -> bool:
    return metric in HISTOGRAM_BUCKETS


def histogram_quantile_expr(q: float, metric: str, match: Mapping[str, str], window: Window, regex: Mapping[str, str] | None = None,
                            fn: str = "rate", by: Sequence[str] = (), extra: Sequence[P.Matcher] = ()) -> str:
    """The q-quantile of every event of the selection in the window (buckets merged: never averaged),
    one per value of the `by` labels (none: one for the whole selection); `extra`: more matchers
    (a `--match` selector) every bucket series must meet."""
    return P.histogram_quantile(q, metric, window, match, regex, fn=fn, by=("le", *by), extra=extra)


def histogram_mean_expr(metric: str, match: Mapping[str, str], window: Window, regex: Mapping[str, str] | None = None,
                        extra: Sequence[P.Matcher] = ()) -> str:
    """Mean per event in each window, one line per label set."""
    return P.histogram_mean(metric, window, match, regex, extra)


def _sum_of(fn: str, sel: str, window: Window) -> str:
    """sum(fn(sel[window])): one number for the whole selection."""
    return P.aggregate("sum", P.call(fn, P.ranged(sel, window)))


def series_expr(spec: SeriesSpec, match: Mapping[str, str], window: Window, regex: Mapping[str, str] | None = None,
                by: Sequence[str] = ()) -> str:
    """The PromQL of one drawn series. `window` is seconds or a variable such as $__rate_interval;
    `by`: the labels a quantile keeps apart (Grafana draws one line per service; the dashboard one
    line for its selection)."""
    m = {**match, **spec.match_dict}
    if is_histogram(spec.metric):
        if spec.kind == "quantile":
            return histogram_quantile_expr(spec.quantile, spec.metric, m, window, regex, by=by)  # type: ignore[arg-type]
        if spec.kind == "events_per_second" and not spec.counter:
            return _sum_of("rate", selector(spec.metric + "_count", m, regex), window)
        if spec.kind == "line":
            return histogram_mean_expr(spec.metric, m, window, regex)
    if spec.kind == "quantile":
        return P.over_time("quantile", selector(spec.metric, m, regex), window, spec.quantile)
    if spec.kind == "rate":
        return P.rate(selector(spec.metric, m, regex), window)
    if spec.kind == "events_per_second":
        return _sum_of("rate", selector(spec.counter or spec.metric, m, regex), window)
    return selector(spec.metric, m, regex)


_OVER_TIME = {"mean": "avg", "max": "max", "min": "min"}
_QUANT = {"p50": 0.5, "p95": 0.95, "p99": 0.99}


def stat_expr(stat: StatSpec, match: Mapping[str, str], window: Window, regex: Mapping[str, str] | None = None) -> str | None:
    """The PromQL of a headline number over `window`, or None when Prometheus cannot answer it."""
    m = {**match, **dict(stat.match)}
    sel = selector(stat.metric, m, regex)
    if is_histogram(stat.metric):
        count, total = selector(stat.metric + "_count", m, regex), selector(stat.metric + "_sum", m, regex)
        if stat.agg in _QUANT:
            return histogram_quantile_expr(_QUANT[stat.agg], stat.metric, m, window, regex, fn="increase")
        if stat.agg == "count":  # increase() extrapolates; a count of events is whole
            return P.call("round", _sum_of("increase", count, window))
        if stat.agg == "mean":
            return P.ratio(_sum_of("increase", total, window), _sum_of("increase", count, window))
        if stat.agg == "sum_ratio" and stat.denominator and is_histogram(stat.denominator):
            den = selector(stat.denominator + "_sum", m, regex)
            return P.ratio(_sum_of("increase", total, window), _sum_of("increase", den, window))
        return None  # a histogram keeps no min or max
    if stat.agg in _OVER_TIME:
        return P.aggregate(_OVER_TIME[stat.agg], P.over_time(_OVER_TIME[stat.agg], sel, window))
    if stat.agg in _QUANT:
        return P.over_time("quantile", sel, window, _QUANT[stat.agg])
    return None


def joules_per_output_token_expr(energy_metric: str, energy_regex: Mapping[str, str], tokens_regex: Mapping[str, str],
                                 window: Window, energy_scale: float = 1.0) -> str:
    """Joules per generated token over `window`, as Prometheus can tell it: the increase of the GPUs'
    energy counter on the selected hosts over the output tokens the selected services generated
    (the engine's token counter, else the sum of gpulens's per-request histogram). The energy
    counter carries a GPU and a host, not a service, so every GPU of the hosts counts: exact for a
    host that only serves the selected services, an upper bound where it also trains or idles
    (gpulens energy attributes by the GPU each workload ran on). `energy_scale` divides a counter
    kept in smaller units (dcgm-exporter's mJ)."""
    joules = _sum_of("increase", selector(energy_metric, {}, energy_regex), window)
    if energy_scale != 1.0:
        joules = P.ratio(P.paren(joules), P.number(energy_scale))
    tokens = P.set_op(_sum_of("increase", selector(INFER_OUTPUT_TOKENS_TOTAL, {}, tokens_regex), window), "or",
                      _sum_of("increase", selector(INFER_REQUEST_OUTPUT_TOKENS + "_sum", {}, tokens_regex), window))
    return P.ratio(P.paren(joules), P.paren(tokens))
