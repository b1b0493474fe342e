"""What a report holds: the run's summary, the panels' charts and numbers, findings with advice,
alerts, and the comparison with a baseline. Built from the same panel data as the dashboard."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from gpulens.diagnose import Finding
from gpulens.errors import BadInputError, shown
from gpulens.reader import AlertRow, AnalysisReader, PanelReader
from gpulens.views.data import PanelOut, Selection, Window, build_panel, build_stat, panel_has_data
from gpulens.views.format import format_value
from gpulens.views.integrations import findings as find_all
from gpulens.views.panels import PANELS
from gpulens.views.readers import store_reader
from gpulens.vocab.directions import Direction, direction_of
from gpulens.vocab.time import require_overlap

# Charts are drawn about this many points wide: enough for a printed page.
REPORT_POINTS = 500


@dataclass
class BaselineRow:
    panel: str
    stat: str
    unit: str
    value: float | None
    baseline: float | None
    direction: Direction = "unknown"  # from gpulens.vocab.directions, by the stat's series

    @property
    def verdict_text(self) -> str:
        """"better", "worse" or "" (no change, a missing side, or a series of unknown direction)."""
        if self.value is None or self.baseline is None or self.value == self.baseline or self.direction == "unknown":
            return ""
        up = self.value > self.baseline
        return "better" if up == (self.direction == "higher_is_better") else "worse"

    @property
    def change_ratio(self) -> float | None:
        """(value - baseline) / baseline; None when either is missing or the baseline is 0."""
        if self.value is None or self.baseline is None or self.baseline == 0:
            return None
        return (self.value - self.baseline) / abs(self.baseline)

    @property
    def value_text(self) -> str:
        return format_value(self.value, self.unit)

    @property
    def baseline_text(self) -> str:
        return format_value(self.baseline, self.unit)

    @property
    def change_text(self) -> str:
        if self.unit == "ratio" and self.value is not None and self.baseline is not None:
            return f"{(self.value - self.baseline) * 100:+.1f} points"  # a share changes in points, not percent
        c = self.change_ratio
        return "–" if c is None else f"{c * 100:+.1f} %"


@dataclass
class ReportData:
    title: str
    source: str
    generated_at: float
    window: Window
    selection: Selection
    panels: list[PanelOut]
    findings: list[Finding]
    findings_note: str
    alerts: list[AlertRow]
    baseline_window: Window | None = None
    baseline: list[BaselineRow] = field(default_factory=list)
    baseline_note: str = ""


def build_report_data(
    store_path: str | Path,
    *,
    job: str | None = None,
    service: str | None = None,
    start: float | None = None,
    end: float | None = None,
    baseline: Window | None = None,
    readers: tuple[PanelReader, AnalysisReader] | None = None,
) -> ReportData:
    """Everything a report shows, read from a store, or from `readers` (a fleet's Prometheus: the
    panel reader and the analysis reader, over the same window). The window defaults to all of the
    store's data."""
    reader: PanelReader = store_reader(store_path) if readers is None else readers[0]
    analysis: AnalysisReader = reader if readers is None else readers[1]  # type: ignore[assignment]
    where = f"The store {store_path}" if readers is None else reader.description
    try:
        rng = reader.data_range() if start is None or end is None or readers is None else (start, end)
        if rng is None:
            raise BadInputError(f"{where} holds no data.", hint="Run `gpulens agent` or `gpulens replay` first.")
        if readers is None:  # a fleet's reader is opened on its window and checked there (cli/fleet.py)
            require_overlap(start, end, rng, where)
            if baseline is not None:  # a baseline of nothing would read as a comparison of empty rows
                require_overlap(baseline.start, baseline.end, rng, f"The --baseline window of {where[0].lower()}{where[1:]}",
                                hint="Give --baseline START,END inside that span: a run you trust.")
        window = Window(start if start is not None else rng[0], end if end is not None else rng[1])
        if window.end <= window.start:
            window = Window(window.start, window.start + 1.0)
        sel = Selection(job=job, service=service)
        panels = [build_panel(reader, pid, window, sel, REPORT_POINTS) for pid in PANELS]
        if job and not panels[0].has_data:
            raise BadInputError(f"{where} has no training data for job {shown(job)}.", hint=f"Jobs in it: {', '.join(reader.label_values()['job']) or 'none'}.")
        if service and not panels[1].has_data:
            raise BadInputError(
                f"{where} has no inference data for service {service!r}.",
                hint=f"Services in it: {', '.join(reader.label_values()['service']) or 'none'}.",
            )
        res = find_all(analysis, window.start, window.end, job, service)
        skipped = getattr(analysis, "skipped_note", lambda: None)()  # over Prometheus: what it cannot answer
        data = ReportData(
            title=_title(job, service),
            source=str(store_path) if readers is None else reader.description,
            generated_at=time.time(),
            window=window,
            selection=sel,
            panels=panels,
            findings=res.findings,
            findings_note=" ".join(filter(None, [res.note, skipped])),
            alerts=reader.alerts(window.start, window.end),
        )
        if baseline is None:
            data.baseline_note = (
                "No baseline window was given: pass --baseline START,END (a run you trust) to compare every "
                "headline number with it."
            )
        else:
            data.baseline_window = baseline
            data.baseline = _compare(reader, panels, window, baseline, sel)
        return data
    finally:
        reader.close()


def _title(job: str | None, service: str | None) -> str:
    if job:
        return f"gpulens report: training job {job}"
    if service:
        return f"gpulens report: service {service}"
    return "gpulens report"


def _compare(reader: PanelReader, panels: list[PanelOut], window: Window, base: Window, sel: Selection) -> list[BaselineRow]:
    rows = []
    for out in panels:
        spec = PANELS[out.id]
        if not out.has_data or not panel_has_data(reader, spec, base, sel):
            continue
        now = {s.id: s for s in out.stats}
        for st in spec.stats:
            if st.agg in ("count", "event_count"):  # counts grow with the window's length: not comparable
                continue
            then = build_stat(reader, spec, st, base, sel)
            rows.append(BaselineRow(spec.title, st.label, st.unit, now[st.id].value if st.id in now else None, then.value,
                                    direction_of(st.metric)))
    return rows
