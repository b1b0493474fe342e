"""The store: SQLite (WAL) with batched commits, roll-ups, retention and typed queries."""

from gpulens.store.store import DEFAULT_RETENTION_SECONDS, DEFAULT_STORE_PATH, Store
from gpulens.store.types import Event, LatestValue, SeriesData, SeriesKey, canonical_labels

__all__ = [
    "DEFAULT_RETENTION_SECONDS",
    "DEFAULT_STORE_PATH",
    "Event",
    "LatestValue",
    "SeriesData",
    "SeriesKey",
    "Store",
    "canonical_labels",
]
