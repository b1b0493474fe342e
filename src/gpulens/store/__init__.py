"""The store: SQLite (WAL) with batched commits, roll-ups, retention, typed queries, versioned
migrations, and repositories for the features' own tables (alerts, baselines, runs).
Only this package runs SQL (ruff bans `sqlite3` elsewhere)."""

from gpulens.store.migrations import SCHEMA_VERSION
from gpulens.store.store import DEFAULT_RETENTION_SECONDS, DEFAULT_STORE_PATH, Store
from gpulens.store.types import (
    DataVersion,
    Event,
    LatestValue,
    Sample,
    SampleColumns,
    SampleSummary,
    SeriesData,
    SeriesKey,
    StoredSeries,
    canonical_labels,
)

__all__ = [
    "DEFAULT_RETENTION_SECONDS",
    "DEFAULT_STORE_PATH",
    "SCHEMA_VERSION",
    "DataVersion",
    "Event",
    "LatestValue",
    "Sample",
    "SampleColumns",
    "SampleSummary",
    "SeriesData",
    "SeriesKey",
    "Store",
    "StoredSeries",
    "canonical_labels",
]
