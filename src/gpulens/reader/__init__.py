"""Readers: where the dashboard's and the analyzers' numbers come from, a local store or a fleet's
Prometheus, behind two protocols (gpulens.reader.protocols says why two) and typed answers."""

from gpulens.reader.answers import AlertRow, Band, EventRow, LatestValue, Line, SeriesWindow
from gpulens.reader.protocols import (
    QUANTILE_OF_AGG,
    SELECTION_KEYS,
    AnalysisReader,
    CannotAnswerError,
    PanelReader,
    selection_label,
)
from gpulens.reader.store import StoreReader, analysis_reader

__all__ = [
    "QUANTILE_OF_AGG",
    "SELECTION_KEYS",
    "AlertRow",
    "AnalysisReader",
    "Band",
    "CannotAnswerError",
    "EventRow",
    "LatestValue",
    "Line",
    "PanelReader",
    "SeriesWindow",
    "StoreReader",
    "analysis_reader",
    "selection_label",
]
