"""What the dashboard shows from other features: diagnosis findings and baseline bands.

Each feature may be absent (not installed yet, or a store written by an older gpulens): then the
dashboard shows nothing for it rather than failing, and says why.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpulens.errors import StoreError
from gpulens.reader import AnalysisReader, Band
from gpulens.store import Store

if TYPE_CHECKING:
    from gpulens.diagnose import Finding

log = logging.getLogger(__name__)


@dataclass
class FindingsResult:
    findings: list[Finding] = field(default_factory=list)
    available: bool = True
    note: str = ""


def findings(source: AnalysisReader | Store, start: float, end: float, job: str | None, service: str | None) -> FindingsResult:
    """Every diagnosis finding in [start, end] for the selected job / service, advice included
    (typed: the surfaces turn them into JSON or text)."""
    try:
        from gpulens.diagnose import DiagnoseScope, diagnose
    except ImportError:  # pragma: no cover - diagnose is part of the core package
        return FindingsResult(available=False, note="The diagnosis module is not installed.")
    try:
        found = diagnose(source, DiagnoseScope(start=start, end=end, job=job or None, service=service or None))
    except StoreError:
        raise  # a damaged or unreadable store is no analyzer's bug: its one sentence, exit 2 (docs/store.md)
    except Exception as e:  # an analyzer's bug must not take the dashboard down
        log.exception("diagnosis failed")
        return FindingsResult(available=False, note=f"The diagnosis failed: {type(e).__name__}: {e}")
    out = []
    for f in found:
        # Keep the findings that overlap the range (analyzers may ignore the scope's window).
        if f.end < start or f.start > end:
            continue
        out.append(f)
    return FindingsResult(out)


def _optional(module: str) -> Any | None:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def baseline_band(store: Store, metric: str, match: Mapping[str, str], t: float) -> Band | None:
    """The learned normal range of a metric at time t, when gpulens.alerts has learned one."""
    # Check for the table first: the alerts module creates it on load, and the dashboard must not write.
    if _optional("gpulens.alerts.baseline") is None or not store.has_table("alert_baselines"):
        return None
    from gpulens.alerts.baseline import BandSpec, describe_band, load_baselines

    try:
        ready = [b for b in load_baselines(store, metric, dict(match) or None) if b.ready]
        if not ready:
            return None
        b = ready[0]
        low, high = describe_band(b, BandSpec(), t)
    except Exception:  # a baseline this version cannot read must not break the page
        log.debug("no baseline band for %s", metric, exc_info=True)
        return None
    if low is None or high is None:
        return None
    return Band(float(low), float(high), b.stats.median if b.stats else None)
