"""What the dashboard shows from other features: diagnosis findings, alert history, baseline bands.

Each feature may be absent (not installed yet, or a store written by an older gpulens): then the
dashboard shows nothing for it rather than failing, and says why.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpulens.store import Store
from gpulens.views.answers import AlertRow, Band

log = logging.getLogger(__name__)

ALERT_EVENT_KIND = "alert"


@dataclass
class FindingsResult:
    findings: list[dict[str, Any]] = field(default_factory=list)
    available: bool = True
    note: str = ""


def findings(store: Store, start: float, end: float, job: str | None, service: str | None) -> FindingsResult:
    """Every diagnosis finding in [start, end] for the selected job / service, advice included."""
    try:
        from gpulens.diagnose import DiagnoseScope, diagnose
    except ImportError:  # pragma: no cover - diagnose is part of the core package
        return FindingsResult(available=False, note="The diagnosis module is not installed.")
    try:
        found = diagnose(store, DiagnoseScope(start=start, end=end, job=job or None, service=service or None))
    except Exception as e:  # an analyzer's bug must not take the dashboard down
        log.exception("diagnosis failed")
        return FindingsResult(available=False, note=f"The diagnosis failed: {type(e).__name__}: {e}")
    out = []
    for f in found:
        # Keep the findings that overlap the range (analyzers may ignore the scope's window).
        if f.end < start or f.start > end:
            continue
        out.append(f.to_dict())
    return FindingsResult(out)


def _optional(module: str) -> Any | None:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def _alert_row(obj: Any) -> AlertRow | None:
    d = obj if isinstance(obj, Mapping) else getattr(obj, "__dict__", None) or {}
    if hasattr(obj, "to_dict"):
        d = obj.to_dict()
    t = d.get("t") or d.get("time") or d.get("started") or d.get("start") or d.get("fired_at")
    if not isinstance(t, int | float):
        return None
    labels = d.get("labels") or {}
    return AlertRow(
        t=float(t),
        name=str(d.get("name") or d.get("rule") or d.get("alertname") or "alert"),
        state=str(d.get("state") or d.get("status") or "firing"),
        severity=str(d.get("severity") or labels.get("severity") or "warning"),
        summary=str(d.get("summary") or d.get("message") or d.get("description") or ""),
        labels={str(k): str(v) for k, v in labels.items()},
    )


def alert_history(store: Store, start: float, end: float) -> list[AlertRow]:
    """Alerts that fired or resolved in [start, end]. The alert engine (gpulens.alerts) records each
    transition as an `alert` event, which is read here without touching its tables."""
    rows = []
    for e in store.events(ALERT_EVENT_KIND, start=start, end=end, limit=1000):
        r = _alert_row({"t": e.t, **e.data, "labels": {**e.labels, **(e.data.get("labels") or {})}})
        if r:
            rows.append(r)
    return rows


def _has_table(store: Store, table: str) -> bool:
    with store.lock:
        return store.connection.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).fetchone() is not None


def baseline_band(store: Store, metric: str, match: Mapping[str, str], t: float) -> Band | None:
    """The learned normal range of a metric at time t, when gpulens.alerts has learned one."""
    # Check for the table first: the alerts module creates it on load, and the dashboard must not write.
    if _optional("gpulens.alerts.baseline") is None or not _has_table(store, "alert_baselines"):
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
