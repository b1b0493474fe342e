"""What a serving engine says about its own memory: KV-cache use, waiting requests, preemptions.

An engine such as vLLM reserves most of the card when it starts (`gpu_memory_utilization`, 0.9 by
default) and carves its KV cache out of that reservation, so device memory reads ~90 % whether one
request is running or a thousand. The engine's own gauges say whether that cache is the limit: it is
when the cache is near full *and* requests wait for it, or when running requests are preempted
(vLLM preempts, SGLang retracts, only when a sequence cannot get another KV block). A full cache
with nothing waiting is the engine using what it reserved, not a problem.

Series are the ones a live scrape or a recording's `engine_stats` records write (`infer_kv_cache_usage_ratio`,
`infer_queue_depth`, `infer_preemptions_total`), joined by their label set (one engine's readings share it).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from gpulens.reader import AnalysisReader
from gpulens.vocab import names as N

KV_FULL_RATIO = 0.90  # the cache this full leaves no room for one more long sequence
JOIN_SECONDS = 15.0  # a waiting-count reading belongs to a KV reading this close (a few scrape intervals)
SPAN_GAP_SECONDS = 30.0  # saturated readings closer than this form one span

Points = list[tuple[float, float]]


@dataclass
class EngineView:
    """One engine's readings over the scope, all with the same labels."""

    labels: dict[str, str]
    kv: Points = field(default_factory=list)
    waiting: Points = field(default_factory=list)
    preemptions: Points = field(default_factory=list)  # the cumulative counter

    def covers(self, start: float, end: float) -> bool:
        """Whether the engine reported its cache or preemptions within [start, end] (give or take JOIN_SECONDS)."""
        return any(start - JOIN_SECONDS <= t <= end + JOIN_SECONDS for t, _ in (*self.kv, *self.preemptions))


@dataclass(frozen=True)
class Saturation:
    """A span where the KV cache was the limit, with the numbers that show it."""

    start: float
    end: float
    kv_usage_max_ratio: float | None
    waiting_max: float
    preemptions: float
    readings: int


def engine_views(reader: AnalysisReader, service: str | None, start: float | None, end: float | None) -> list[EngineView]:
    """Every label set that has KV-cache or preemption readings (an engine reporting on itself)."""
    sel = {"service": service} if service else None
    views: dict[tuple[tuple[str, str], ...], EngineView] = {}
    for name, attr in ((N.INFER_KV_CACHE_USAGE_RATIO, "kv"), (N.INFER_PREEMPTIONS_TOTAL, "preemptions"),
                       (N.INFER_QUEUE_DEPTH, "waiting")):
        for s in reader.series_windows(name, sel, start=start, end=end):
            key = tuple(sorted(s.labels.items()))
            if attr == "waiting" and key not in views:
                continue  # a queue with no KV or preemption readings beside it is not an engine's view
            view = views.setdefault(key, EngineView(dict(s.labels)))
            getattr(view, attr).extend(zip(s.t, s.value, strict=True))
    for v in views.values():
        v.kv.sort()
        v.waiting.sort()
        v.preemptions.sort()
    return list(views.values())


def _near(points: Points, t: float) -> float | None:
    """The reading closest to `t` within JOIN_SECONDS, None if there is none."""
    i = bisect.bisect_left(points, (t, float("-inf")))
    best = None
    for j in (i - 1, i):
        if 0 <= j < len(points) and abs(points[j][0] - t) <= JOIN_SECONDS:
            if best is None or abs(points[j][0] - t) < abs(best[0] - t):
                best = points[j]
    return None if best is None else best[1]


def preemption_steps(points: Points) -> Points:
    """(time, preemptions since the reading before) for each rise of the counter. The first reading
    is the baseline (what it counted before the scope cannot be placed); a drop is a restart."""
    out: Points = []
    for (_, prev), (t, cur) in zip(points, points[1:], strict=False):
        rise = cur - prev if cur >= prev else cur
        if rise > 0:
            out.append((t, rise))
    return out


def saturations(view: EngineView) -> list[Saturation]:
    """Spans where the cache was full with requests waiting, or where requests were preempted."""
    marks: list[tuple[float, float | None, float, float]] = []  # (t, kv, waiting, preempted)
    for t, kv in view.kv:
        waiting = _near(view.waiting, t)
        if kv >= KV_FULL_RATIO and waiting:
            marks.append((t, kv, waiting, 0.0))
    for t, rise in preemption_steps(view.preemptions):
        marks.append((t, _near(view.kv, t), _near(view.waiting, t) or 0.0, rise))
    marks.sort(key=lambda m: m[0])
    spans: list[list[tuple[float, float | None, float, float]]] = []
    for m in marks:
        if spans and m[0] - spans[-1][-1][0] <= SPAN_GAP_SECONDS:
            spans[-1].append(m)
        else:
            spans.append([m])
    out = []
    for span in spans:
        kvs = [m[1] for m in span if m[1] is not None]
        out.append(Saturation(span[0][0], span[-1][0], max(kvs) if kvs else None, max(m[2] for m in span),
                              sum(m[3] for m in span), len(span)))
    return out
