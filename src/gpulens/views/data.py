"""Panel data: a panel's charts and headline numbers over a time window, read through a Reader.

The dashboard's JSON API and the reports both build their content here, so the page, the HTML
report and the Markdown report show the same numbers.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from gpulens.energy import WorkloadEnergy, joules_per_token, workload_energy
from gpulens.errors import BadInputError, shown
from gpulens.reader import Band, Line
from gpulens.reader import PanelReader as Reader
from gpulens.units import parse_duration
from gpulens.views.format import format_value
from gpulens.views.panels import (
    LEGEND_LABELS,
    LEGEND_OWNER,
    PANELS,
    SELECTION_KEYS,
    ChartSpec,
    PanelSpec,
    SeriesSpec,
    StatSpec,
    legend_name,
    selection_label,
)
from gpulens.vocab import names as N

# The time-range picker's choices; the API accepts any duration.
RANGE_CHOICES = ("15m", "1h", "6h", "24h", "7d")
DEFAULT_RANGE = "15m"
MAX_RANGE_SECONDS = 400 * 86400
DEFAULT_POINTS = 600
MAX_POINTS = 4000
# The event kinds /api/events returns when none is asked for.
DEFAULT_EVENT_KINDS = ("xid", N.EV_COLD_START, N.EV_TRAIN_OOM)


@dataclass
class Window:
    start: float
    end: float
    # True when the data ends before the picked range would start (a recorded session): the window
    # then covers the data (at most the picked length), so the picked range still shows something.
    snapped_to_data: bool = False

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Selection:
    gpu: str | None = None
    job: str | None = None
    service: str | None = None
    host: str | None = None

    def match(self, workload: str) -> dict[str, str]:
        return {selection_label(k): v for k in SELECTION_KEYS[workload] if (v := getattr(self, k))}  # type: ignore[index]


def resolve_window(
    reader: Reader,
    *,
    range_text: str | None = None,
    start: float | None = None,
    end: float | None = None,
    now: float | None = None,
) -> Window:
    """The window to show: explicit [start, end], or the picked range ending now; when the data is
    older than that range, the range ends at the data's end instead."""
    if start is not None or end is not None:
        if start is None or end is None:
            raise BadInputError("Give both start and end, or neither.", hint="Use range=15m for the latest data.")
        if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
            raise BadInputError(f"The window end {end} must come after its start {start}.", hint="Swap them.")
        if end - start > MAX_RANGE_SECONDS:
            raise BadInputError("The window is longer than 400 days.", hint="Pick a shorter range.")
        return Window(start, end)
    seconds = parse_duration(range_text or DEFAULT_RANGE, what="range")
    if seconds > MAX_RANGE_SECONDS:
        raise BadInputError(f"The range {shown(range_text)} is longer than 400 days.", hint="Pick a shorter range, e.g. 7d.")
    now = time.time() if now is None else now
    end_t = now
    snapped = False
    start_t = now - seconds
    rng = reader.data_range()
    if rng is not None and rng[1] < start_t:
        end_t, snapped = rng[1], True
        start_t = max(rng[0], end_t - seconds)
        if end_t - start_t < 1.0:  # a single instant: widen so a chart has an x-axis
            start_t = end_t - 1.0
    return Window(start_t, end_t, snapped)


@dataclass
class SeriesOut:
    label: str
    metric: str
    labels: dict[str, str]
    t: list[float]
    v: list[float | None]
    draw: str = "line"  # or "points": one mark per sample, never joined (panels.Draw)


@dataclass
class ChartOut:
    id: str
    title: str
    unit: str
    help: str
    series: list[SeriesOut]
    # The learned normal range of one series: low, high, center, and `series`, that series' legend name.
    band: dict[str, Any] | None = None
    empty: str = ""

    @property
    def has_data(self) -> bool:
        return any(len(s.t) for s in self.series)


@dataclass
class StatOut:
    id: str
    label: str
    unit: str
    value: float | None
    display: str


@dataclass
class PanelOut:
    id: str
    title: str
    start: float
    end: float
    has_data: bool
    empty_hint: str
    stats: list[StatOut] = field(default_factory=list)
    charts: list[ChartOut] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _clean(values: list[float | None]) -> list[float | None]:
    return [v if v is not None and math.isfinite(v) else None for v in values]


def _legend(spec: SeriesSpec, line: Line, owner: str, varying: list[str], match: dict[str, str]) -> str:
    """The series' name, then whose it is and what tells it apart: "hw_thermal (GPU 1)".
    A pooled line (a percentile over every service) names its owner only when the selection picks one."""
    labels = {**({owner: match[owner]} if owner in match else {}), **line.labels}
    base = spec.label
    named = [owner] + [k for k in varying if k != owner]
    if spec.metric.endswith("clock_event_active") and "reason" in labels:
        base = labels["reason"]
        named = [k for k in named if k != "reason"]
    parts = [f"{legend_name(k)} {labels[k]}" for k in named if k in labels]
    return f"{base} ({', '.join(parts)})" if parts else base


def _series_lines(reader: Reader, spec: SeriesSpec, match: dict[str, str], w: Window, points: int) -> list[Line]:
    m = {**match, **spec.match_dict}
    if spec.kind == "quantile":
        return reader.quantile(spec.metric, m, spec.quantile or 0.5, w.start, w.end, points)
    if spec.kind == "rate":
        return reader.rate(spec.metric, m, w.start, w.end, points)
    if spec.kind == "events_per_second":
        # A source without single events (Prometheus) counts them with the spec's counter instead.
        metric = spec.metric if reader.supports_events or not spec.counter else spec.counter
        return reader.events_per_second(metric, m, w.start, w.end, points)
    return reader.line(spec.metric, m, w.start, w.end, points)


def build_chart(reader: Reader, panel: PanelSpec, chart: ChartSpec, w: Window, sel: Selection, points: int) -> ChartOut:
    out = ChartOut(chart.id, chart.title, chart.unit, chart.help, [], empty=chart.empty)
    band: Band | None = None
    band_series = ""
    for spec in chart.series:
        match = sel.match(spec.workload or panel.id)
        lines = _series_lines(reader, spec, match, w, points)
        # Name the labels that tell the lines apart (e.g. two GPUs), not the ones they share.
        varying = [k for k in LEGEND_LABELS if len({ln.labels.get(k) for ln in lines}) > 1]
        owner = LEGEND_OWNER[spec.workload or panel.id]
        for ln in lines:
            out.series.append(SeriesOut(_legend(spec, ln, owner, varying, match), spec.metric, ln.labels, list(ln.t),
                                        _clean(ln.value), spec.draw))
        if band is None and spec.kind == "line" and lines:
            band = reader.band(spec.metric, {**match, **spec.match_dict}, w.end)
            band_series = _legend(spec, lines[0], owner, varying, match)
    if band is not None:
        out.band = {**asdict(band), "series": band_series}  # a legend names whose normal range it is
    return out


# The energy rows of each panel's workloads (gpulens.energy names serving what the panels call inference).
_ENERGY_WORKLOAD = {"training": "training", "inference": "serving"}


_ENERGY_CACHE: dict[tuple[Any, float, float], list[WorkloadEnergy]] = {}


def _energy_rows(reader: Reader, w: Window) -> list[WorkloadEnergy]:
    """workload_energy over the window, kept while the store holds the same data: a page load asks
    the training and the inference panel for the same window, and the rows serve both."""
    key = (reader.cache_key(), w.start, w.end)  # type: ignore[attr-defined]  # a store reader's
    rows = _ENERGY_CACHE.get(key)
    if rows is None:
        rows = workload_energy(reader, start=w.start, end=w.end)  # type: ignore[arg-type]
        if len(_ENERGY_CACHE) >= 8:
            _ENERGY_CACHE.clear()
        _ENERGY_CACHE[key] = rows
    return rows


def _joules_per_token(reader: Reader, panel: PanelSpec, w: Window, sel: Selection) -> float | None:
    """`gpulens energy`'s joules per token, over the steps or requests in the window: the same
    function computes it. A store only (Prometheus keeps no per-step or per-request records)."""
    if reader.kind != "store":
        return None
    rows = [r for r in _energy_rows(reader, w)
            if r.workload == _ENERGY_WORKLOAD.get(panel.id)
            and (sel.job is None or r.workload != "training" or r.name == sel.job)
            and (sel.service is None or r.workload != "serving" or r.name == sel.service)
            and (sel.host is None or r.host == sel.host)]
    return joules_per_token(rows)


def build_stat(reader: Reader, panel: PanelSpec, stat: StatSpec, w: Window, sel: Selection) -> StatOut:
    match = {**sel.match(panel.id), **dict(stat.match)}
    value: float | None
    if stat.agg == "joules_per_token":
        value = _joules_per_token(reader, panel, w, sel)
    elif stat.agg == "event_count":
        if not reader.supports_events:
            value = None
        else:
            value = float(len(reader.events((stat.metric,), w.start, w.end, sel.match(panel.id))))
    elif stat.agg == "sum_ratio":
        num = reader.aggregate(stat.metric, match, "sum", w.start, w.end)
        den = reader.aggregate(stat.denominator or "", match, "sum", w.start, w.end)
        value = num / den if num is not None and den else None
    else:
        value = reader.aggregate(stat.metric, match, stat.agg, w.start, w.end)
        if stat.agg == "count" and not value:
            value = None
    if value is not None and not math.isfinite(value):
        value = None
    return StatOut(stat.id, stat.label, stat.unit, value, format_value(value, stat.unit))


def panel_has_data(reader: Reader, panel: PanelSpec, w: Window, sel: Selection) -> bool:
    match = sel.match(panel.id)
    return any(reader.has_data(m, match, w.start, w.end) for m in panel.feeds)


def build_panel(reader: Reader, panel_id: str, w: Window, sel: Selection, points: int = DEFAULT_POINTS) -> PanelOut:
    panel = PANELS.get(panel_id)
    if panel is None:
        raise BadInputError(f"There is no panel {shown(panel_id)}.", hint=f"Choose one of: {', '.join(PANELS)}.")
    has = panel_has_data(reader, panel, w, sel)
    out = PanelOut(panel.id, panel.title, w.start, w.end, has, panel.empty_hint)
    if not has:
        return out
    out.stats = [build_stat(reader, panel, s, w, sel) for s in panel.stats]
    out.charts = [build_chart(reader, panel, c, w, sel, points) for c in panel.charts]
    return out


def clamp_points(points: int | None) -> int:
    if points is None:
        return DEFAULT_POINTS
    if not 2 <= points <= MAX_POINTS:
        raise BadInputError(f"points must be between 2 and {MAX_POINTS}, not {points}.", hint="Use about the chart's width in pixels.")
    return points
