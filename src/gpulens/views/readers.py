"""The store reader the views open: gpulens.reader's StoreReader with the learned baseline bands of
gpulens.alerts (a layer the reader package sits below, so the views pass them in).

`PrometheusReader` (gpulens.views.prometheus) asks a Prometheus server the same panel questions,
so one dashboard serves a node or a fleet.
"""

from __future__ import annotations

from pathlib import Path

from gpulens.reader import StoreReader
from gpulens.views.integrations import baseline_band


def store_reader(path: str | Path) -> StoreReader:
    """A read-only reader of the store at `path`, with baseline bands where alerts learned them."""
    return StoreReader(path, bands=baseline_band)
