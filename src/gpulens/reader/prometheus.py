"""The analysis questions (gpulens.reader.AnalysisReader) answered by a fleet's Prometheus, so that
`gpulens diagnose --prometheus URL` runs the same analyzers across every node a selector matches.

What Prometheus holds is what the agents' scrapes gave it, and the answers say no more than that:
- a gauge (`gpu_up`, temperatures, clocks, clock-event flags...) is read as the raw samples Prometheus
  stored, at their scrape times (a range selector, not a step grid); a long window first read at
  `max_points` is min / max / mean per bucket (`*_over_time`), exact for those samples;
- a per-event histogram (step time, request latency) is read as the mean per event between two
  scrapes (increase of `_sum` over increase of `_count`): exact, as counts, sums and rates are; its
  percentiles are bucket estimates (`histogram_quantile`), which no analysis question asks for;
- an XID is the increase of `gpu_xid_errors_total{xid=CODE}`: one event per increment, with its code
  and GPU, at the scrape that first showed it (its own time is lost, to within a scrape interval);
- a training step is read as one record per rank per scrape interval (gpulens.reader.prometheus_records):
  the mean step time and the mean of each part over the steps of that interval, exact as means; a
  rank's `train_start` is its `train_rank_info` (pid, CUDA device), so GPU faults join to ranks;
- per-request records and the rest (`request`, cold starts, OOMs, NaN losses...) do not reach
  Prometheus: `event_rows` answers none and keeps a sentence in `skipped`, which the caller shows;
- settings (the SLOs kept in a store) are not there: `setting` answers None, so defaults apply.
A window bound of None is the reader's own window (`start`, `end`: the last hour by default).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from gpulens import promql as P
from gpulens.promql import Matcher, parse_matchers
from gpulens.reader.answers import EventRow, LatestValue, SeriesWindow
from gpulens.reader.counters import counter_increases
from gpulens.reader.prometheus_api import TIMEOUT_SECONDS, PrometheusApi
from gpulens.reader.prometheus_records import rank_processes, step_records
from gpulens.vocab import names as N
from gpulens.vocab.gpu import GPU_UP, GPU_XID_TOTAL

XID_EVENT_KIND = "xid"  # the store's XID events (pipeline.writer.SampleWriter.write_xid)
XID_LABEL = "xid"  # the code label of the XID counter
DEFAULT_WINDOW_SECONDS = 3600.0
# Prometheus' default lookback: a sample older than this before a point is not "current" at it.
LOOKBACK_SECONDS = 300.0
# Below this bucket width a max_points read is the raw samples themselves (a typical scrape interval).
RAW_BELOW_STEP_SECONDS = 15.0
# Points of the subqueries that find first and last sample times (at most LOOKBACK_SECONDS apart).
TIME_POINTS = 1000
# The series whose samples say that something was there: the GPUs, the training steps, the requests.
PRESENCE_SERIES = (GPU_UP, N.TRAIN_STEP_SECONDS + "_count", N.INFER_LATENCY_SECONDS + "_count")
# What leaves out each record kind that Prometheus does not keep, for the note in `skipped_note`.
_JOIN = "joining GPU findings to the services on the GPU (their start and request records)"
_INFER = "the inference analyses: SLOs, queueing, errors, timeouts, cold starts (per-request records)"
RECORD_ANALYSES = {
    N.EV_INFER_START: _JOIN,
    N.EV_REQUEST: _INFER,
    N.EV_COLD_START: _INFER,
    N.EV_TRAIN_OOM: "out-of-memory and NaN-loss findings (their records)",
    N.EV_TRAIN_NAN: "out-of-memory and NaN-loss findings (their records)",
    N.EV_TRAIN_EVAL: "evaluation pauses (their records)",
}


def _labels(metric: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in metric.items() if k != "__name__"}


def _key(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


class PrometheusAnalysisReader:
    """Answers the analysis questions from a Prometheus server, over the series `match` selects
    (`{cluster="a"}`: every node it matches), in the window [start, end]."""

    def __init__(self, url: str, *, match: str | Sequence[Matcher] = "", start: float | None = None,
                 end: float | None = None, window_seconds: float = DEFAULT_WINDOW_SECONDS,
                 timeout_seconds: float = TIMEOUT_SECONDS, now: Callable[[], float] = time.time):
        self.api = PrometheusApi(url, timeout_seconds=timeout_seconds)
        self.matchers: tuple[Matcher, ...] = parse_matchers(match) if isinstance(match, str) else tuple(match)
        self.end = float(end) if end is not None else now()
        self.start = float(start) if start is not None else self.end - window_seconds
        if not self.end > self.start:
            raise ValueError("the window must end after it starts")
        shown = ", ".join(m.promql() for m in self.matchers)
        self.description = f"Prometheus {self.api.url}" + (f" {{{shown}}}" if shown else "")
        self.skipped: dict[str, str] = {}  # record kind asked for -> what its absence leaves out
        self._records: dict[tuple, list[EventRow]] = {}  # training records read, by (kind, window, match)

    def close(self) -> None:
        pass

    def check(self) -> None:
        self.api.check()

    # ------------------------------------------------------------ helpers
    def _sel(self, metric: str, match: Mapping[str, str] | None) -> str:
        want = {k: str(v) for k, v in (match or {}).items() if v not in (None, "")}
        return P.selector(metric, want, extra=self.matchers)

    def _bounds(self, start: float | None, end: float | None) -> tuple[float, float]:
        return (self.start if start is None else start), (self.end if end is None else end)

    def _raw(self, metric: str, match: Mapping[str, str] | None, lo: float, hi: float) -> list[tuple[dict[str, str], list[float], list[float]]]:
        """The samples Prometheus stored of each matching series in [lo, hi], at their scrape times."""
        if hi < lo:
            return []
        res = self.api.instant(P.ranged(self._sel(metric, match), max(hi - lo, 0.001)), hi)
        out = []
        for r in res:
            pts = [(float(ts), float(x)) for ts, x in r.get("values", []) if lo - 5e-4 <= float(ts) <= hi + 5e-4]
            if pts:
                out.append((_labels(r.get("metric", {})), [p[0] for p in pts], [p[1] for p in pts]))
        return sorted(out, key=lambda s: _key(s[0]))

    def _time_step(self, window: float) -> float:
        return min(LOOKBACK_SECONDS, max(window / TIME_POINTS, 0.001))

    def _last_times(self, sel: str, lo: float, hi: float) -> str:
        """The time of each series' last sample in [lo, hi]: its sample at `hi` (within the lookback)
        or, for one that stopped earlier, the latest a subquery saw (exact: timestamp() of a sample)."""
        w = max(hi - lo, 0.001)
        return P.set_op(P.call("timestamp", sel), "or", self._times_over("max", sel, w))

    def _times_over(self, fn: str, sel: str, window: float) -> str:
        """fn_over_time of the sample times of `sel`, seen every window / TIME_POINTS over the window."""
        return P.call(f"{fn}_over_time", P.subquery(P.call("timestamp", sel), window, self._time_step(window)))

    # ------------------------------------------------------------ AnalysisReader
    def cache_key(self) -> Hashable:
        return self.api.url, tuple(m.promql() for m in self.matchers), self.start, self.end

    def time_range(self, metric: str | None = None) -> tuple[float, float] | None:
        """First and last sample time in the window. The last is exact; the first is a lower bound,
        at most one subquery step (window / 1000) early: what matters to a caller that reads from it."""
        if metric is None:
            ranges = [r for m in PRESENCE_SERIES if (r := self.time_range(m)) is not None]
            return (min(r[0] for r in ranges), max(r[1] for r in ranges)) if ranges else None
        name = metric + "_count" if metric in N.HISTOGRAM_BUCKETS else metric
        sel, w = self._sel(name, None), self.end - self.start
        step = self._time_step(w)
        last = self.api.instant(P.aggregate("max", self._last_times(sel, self.start, self.end)), self.end)
        first = self.api.instant(P.aggregate("min", self._times_over("min", sel, w)), self.end)
        if not last or not first:
            return None
        hi = float(last[0]["value"][1])
        lo = max(self.start, float(first[0]["value"][1]) - step)
        return (lo, hi) if hi >= self.start else None

    def series_labels(self, metric: str, match: Mapping[str, str] | None = None) -> list[dict[str, str]]:
        name = metric + "_count" if metric in N.HISTOGRAM_BUCKETS else metric
        got = self.api.get("/api/v1/series", {"match[]": self._sel(name, match), "start": f"{self.start:.3f}", "end": f"{self.end:.3f}"})
        return sorted((_labels(m) for m in got or []), key=_key)

    def series_windows(
        self, metric: str, match: Mapping[str, str] | None = None, *, start: float | None = None,
        end: float | None = None, max_points: int | None = None,
    ) -> list[SeriesWindow]:
        lo, hi = self._bounds(start, end)
        if metric in N.HISTOGRAM_BUCKETS:
            return self._histogram_windows(metric, match, lo, hi, max_points)
        if max_points is not None and max_points > 0 and (hi - lo) / max_points >= RAW_BELOW_STEP_SECONDS:
            return self._bucketed(metric, match, lo, hi, max_points)
        return [SeriesWindow(metric, labels, t, v, list(v), list(v), "raw") for labels, t, v in self._raw(metric, match, lo, hi)]

    def _bucketed(self, metric: str, match: Mapping[str, str] | None, lo: float, hi: float, points: int) -> list[SeriesWindow]:
        """Mean, min and max per bucket of width (hi - lo) / points, each bucket (p - step, p] told by its start."""
        step = (hi - lo) / points
        sel = self._sel(metric, match)
        parts: dict[str, dict[tuple, dict[float, float]]] = {}
        labels_of: dict[tuple, dict[str, str]] = {}
        for fn in ("avg", "min", "max"):
            got: dict[tuple, dict[float, float]] = {}
            for r in self.api.range(P.over_time(fn, sel, step), lo + step, hi, step):
                labels = _labels(r.get("metric", {}))
                labels_of[_key(labels)] = labels
                got[_key(labels)] = {round(float(ts) - step, 3): float(x) for ts, x in r.get("values", [])}
            parts[fn] = got
        out = []
        for key in sorted(parts["avg"]):
            ts = sorted(t for t in parts["avg"][key] if t in parts["min"].get(key, {}) and t in parts["max"].get(key, {}))
            if ts:
                out.append(SeriesWindow(metric, labels_of[key], ts, [parts["avg"][key][t] for t in ts],
                                        [parts["min"][key][t] for t in ts], [parts["max"][key][t] for t in ts], "1m"))
        return out

    def _histogram_windows(self, metric: str, match: Mapping[str, str] | None, lo: float, hi: float, max_points: int | None) -> list[SeriesWindow]:
        """The mean per event between consecutive scrapes (or per bucket, with max_points): exact
        (sums and counts); a histogram keeps no extremes, so min and max are that mean too."""
        incs: dict[str, dict[tuple, list[tuple[float, float]]]] = {}
        labels_of: dict[tuple, dict[str, str]] = {}
        for part in ("_sum", "_count"):
            incs[part] = {}
            for labels, t, v in self._raw(metric + part, match, lo - LOOKBACK_SECONDS, hi):
                labels_of[_key(labels)] = labels
                incs[part][_key(labels)] = [(ts, d) for ts, d in counter_increases(t, v, born_inside=t[0] >= lo) if ts >= lo]
        width = (hi - lo) / max_points if max_points else None
        out = []
        for key, counts in sorted(incs["_count"].items()):
            sums = dict(incs["_sum"].get(key, []))
            buckets: dict[float, list[float]] = {}
            for ts, n in counts:
                b = ts if width is None else lo + math.floor((ts - lo) / width) * width
                acc = buckets.setdefault(b, [0.0, 0.0])
                acc[0] += sums.get(ts, 0.0)
                acc[1] += n
            ts_sorted = sorted(buckets)
            means = [buckets[b][0] / buckets[b][1] for b in ts_sorted]
            if ts_sorted:
                out.append(SeriesWindow(metric, labels_of[key], ts_sorted, means, list(means), list(means), "raw" if width is None else "1m"))
        return out

    def latest_values(self, metric: str, match: Mapping[str, str] | None = None) -> list[LatestValue]:
        """The last sample of each matching series in the window, at its own scrape time."""
        sel = self._sel(metric, match)
        times = {_key(_labels(r.get("metric", {}))): float(r["value"][1]) for r in self.api.instant(self._last_times(sel, self.start, self.end), self.end)}
        out = []
        for r in self.api.instant(P.over_time("last", sel, max(self.end - self.start, 0.001)), self.end):
            labels = _labels(r.get("metric", {}))
            t = times.get(_key(labels))
            if t is not None:
                out.append(LatestValue(metric, labels, t, float(r["value"][1])))
        return sorted(out, key=lambda lv: _key(lv.labels))

    def event_rows(
        self, kind: str, *, start: float | None = None, end: float | None = None, match: Mapping[str, str] | None = None,
    ) -> list[EventRow]:
        if kind in (N.EV_TRAIN_STEP, N.EV_TRAIN_START):
            return self._training_records(kind, start, end, match)
        if kind != XID_EVENT_KIND:
            self.skipped.setdefault(kind, RECORD_ANALYSES.get(kind, f"findings from {kind} records"))
            return []
        lo, hi = self._bounds(start, end)
        want = {k: v for k, v in (match or {}).items() if k != XID_LABEL}
        out = []
        for labels, t, v in self._raw(GPU_XID_TOTAL, want, lo - LOOKBACK_SECONDS, hi):
            code = labels.pop(XID_LABEL, None)
            if match and XID_LABEL in match and code != str(match[XID_LABEL]):
                continue
            try:
                data: dict[str, Any] = {XID_LABEL: int(code) if code is not None else None}
            except ValueError:
                continue
            for ts, n in counter_increases(t, v, born_inside=t[0] >= lo):
                if ts >= lo:
                    out.extend(EventRow(ts, XID_EVENT_KIND, dict(labels), dict(data)) for _ in range(int(round(n))))
        return sorted(out, key=lambda e: e.t)

    def _training_records(self, kind: str, start: float | None, end: float | None, match: Mapping[str, str] | None) -> list[EventRow]:
        """Per-interval step records or per-rank start records (gpulens.reader.prometheus_records),
        read once per window and selection."""
        lo, hi = self._bounds(start, end)
        key = (kind, lo, hi, _key({k: str(v) for k, v in (match or {}).items()}))
        if key not in self._records:
            read = step_records if kind == N.EV_TRAIN_STEP else rank_processes
            self._records[key] = read(self._raw, match, lo, hi, LOOKBACK_SECONDS)
        return [EventRow(e.t, e.kind, dict(e.labels), dict(e.data)) for e in self._records[key]]

    def skipped_note(self) -> str | None:
        """One sentence: what the analyses asked for that Prometheus does not keep, so was skipped."""
        if not self.skipped:
            return None
        what = "; ".join(dict.fromkeys(self.skipped.values()))
        return (f"Skipped over {self.description}, since only a node's store keeps the records they need: {what}. "
                "Run `gpulens diagnose --store` on the node for them.")

    def setting(self, key: str) -> str | None:
        return None  # settings live beside a store's data; over Prometheus the defaults apply
