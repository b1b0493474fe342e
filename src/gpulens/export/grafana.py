"""A Grafana dashboard (JSON) with the same three panels as `gpulens dashboard`, over the metric
names `gpulens agent` exports, for a Prometheus data source. Import it in Grafana under
Dashboards → New → Import; it asks for the Prometheus data source on import."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpulens.errors import BadInputError
from gpulens.views.panels import (
    LEGEND_OWNER,
    PANELS,
    SELECTION_KEYS,
    ChartSpec,
    PanelSpec,
    SeriesSpec,
    legend_name,
    selection_label,
)
from gpulens.views.promql import series_expr, stat_expr
from gpulens.vocab import names as N
from gpulens.vocab.gpu import GPU_CLOCK_EVENT_ACTIVE, GPU_PROCESS_MEMORY, GPU_UP

DS = "${DS_PROMETHEUS}"
DEFAULT_UID = "gpulens-overview"
# Chart units -> Grafana's unit ids.
GRAFANA_UNITS = {
    "seconds": "s",
    "bytes": "bytes",
    "ratio": "percentunit",
    "celsius": "celsius",
    "watts": "watt",
    "hertz": "hertz",
    "per_second": "short",
    "count": "short",
}
VARIABLES = {
    # variable -> (metric that carries the label, help)
    "host": (GPU_UP, "Host"),
    "gpu": (GPU_UP, "GPU"),
    "job": (f"{N.TRAIN_STEP_SECONDS}_count", "Training job"),  # a histogram: its _count series carries the labels
    "service": (f"{N.INFER_LATENCY_SECONDS}_count", "Inference service"),
}


def _regex(workload: str) -> dict[str, str]:
    return {selection_label(k): f"${k}" for k in SELECTION_KEYS[workload]}  # type: ignore[index]


def _legend(s: SeriesSpec, panel: PanelSpec) -> str:
    """Whose line it is, as on the dashboard: "{{reason}} (GPU {{gpu}})"; a sum() keeps no labels."""
    if s.kind == "events_per_second":
        return s.label
    owner = LEGEND_OWNER[s.workload or panel.id]
    whose = f"{legend_name(owner)} {{{{{owner}}}}}"
    return {
        GPU_CLOCK_EVENT_ACTIVE: f"{{{{reason}}}} ({whose})",
        GPU_PROCESS_MEMORY: f"{{{{process}}}} (pid {{{{pid}}}}, {whose})",
    }.get(s.metric, f"{s.label} ({whose})")


def _timeseries(chart: ChartSpec, panel: PanelSpec, pid: int, x: int, y: int) -> dict[str, Any]:
    targets = []
    for i, s in enumerate(chart.series):
        expr = series_expr(s, {}, "$__rate_interval", _regex(s.workload or panel.id))
        legend = _legend(s, panel)
        targets.append({"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend, "datasource": {"type": "prometheus", "uid": DS}})
    return {
        "id": pid,
        "type": "timeseries",
        "title": chart.title,
        "description": chart.help,
        "datasource": {"type": "prometheus", "uid": DS},
        "gridPos": {"h": 8, "w": 8, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": GRAFANA_UNITS[chart.unit], "custom": {"lineWidth": 1, "spanNulls": True}}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": targets,
    }


def _stats(panel: PanelSpec, pid: int, y: int) -> dict[str, Any] | None:
    targets = []
    for st in panel.stats:
        expr = stat_expr(st, {}, "$__range", _regex(panel.id))
        if expr:
            targets.append({"refId": chr(ord("A") + len(targets)), "expr": expr, "legendFormat": st.label, "instant": True,
                            "datasource": {"type": "prometheus", "uid": DS}})
    if not targets:
        return None
    return {
        "id": pid,
        "type": "stat",
        "title": f"{panel.title}: over the range",
        "datasource": {"type": "prometheus", "uid": DS},
        "gridPos": {"h": 4, "w": 24, "x": 0, "y": y},
        "fieldConfig": {"defaults": {"unit": "short"}, "overrides": [
            {"matcher": {"id": "byName", "options": st.label}, "properties": [{"id": "unit", "value": GRAFANA_UNITS[st.unit]}]}
            for st in panel.stats
        ]},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"]}, "textMode": "value_and_name", "colorMode": "none"},
        "targets": targets,
    }


def grafana_dashboard(title: str = "gpulens: training | inference | GPU health", uid: str = DEFAULT_UID) -> dict[str, Any]:
    """The dashboard JSON, in Grafana's import format (a `__inputs` data-source placeholder)."""
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for panel in PANELS.values():
        panels.append({"id": pid, "type": "row", "title": panel.title, "collapsed": False, "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y = pid + 1, y + 1
        stats = _stats(panel, pid, y)
        if stats:
            panels.append(stats)
            pid, y = pid + 1, y + 4
        for i, chart in enumerate(panel.charts):
            panels.append(_timeseries(chart, panel, pid, (i % 3) * 8, y + (i // 3) * 8))
            pid += 1
        y += ((len(panel.charts) + 2) // 3) * 8
    variables = [
        {
            "name": name,
            "label": label,
            "type": "query",
            "datasource": {"type": "prometheus", "uid": DS},
            "query": {"query": f"label_values({metric}, {selection_label(name)})", "refId": f"var-{name}"},
            "definition": f"label_values({metric}, {selection_label(name)})",
            "includeAll": True,
            "allValue": ".*",
            "multi": True,
            "current": {"text": "All", "value": "$__all"},
            "refresh": 2,
            "sort": 1,
        }
        for name, (metric, label) in VARIABLES.items()
    ]
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource", "pluginId": "prometheus", "pluginName": "Prometheus"}],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
            {"type": "panel", "id": "timeseries", "name": "Time series", "version": ""},
            {"type": "panel", "id": "stat", "name": "Stat", "version": ""},
        ],
        "uid": uid,
        "title": title,
        "description": "Training, inference and GPU health from gpulens agents (exported by `gpulens export grafana`).",
        "tags": ["gpulens", "gpu"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": variables},
        "annotations": {"list": []},
        "panels": panels,
    }


def write_grafana_dashboard(out: str | Path | None, **kw: Any) -> str:
    """Write the dashboard JSON to `out` (or return it when out is None / '-')."""
    text = json.dumps(grafana_dashboard(**kw), indent=2)
    if out is None or str(out) == "-":
        return text
    path = Path(out)
    if not path.parent.exists():
        raise BadInputError(f"The folder {path.parent} does not exist.", hint="Create it or choose another --out.")
    try:
        path.write_text(text + "\n", encoding="utf-8")
    except OSError as e:
        raise BadInputError(f"Cannot write {path}: {e.strerror}.", hint="Choose an --out path you can write to.") from None
    return text
