"""A Grafana dashboard (JSON) with the same three panels as `gpulens dashboard`, over the metric
names `gpulens agent` exports, for a Prometheus data source.

It provisions from a file as it is (Grafana's file provider does no `__inputs` substitution): every
panel, target and picker names its data source through the `${datasource}` variable (type
`prometheus`, as dcgm-exporter's own dashboard does), which Grafana fills with the default Prometheus
data source and lets a viewer switch; the manual import (Dashboards → New → Import) takes it too.
Quantile panels keep `service` / `train_job` apart (`sum by (le, service)`), so every line's legend
names its owner. `metric_names="dcgm"` writes the variant for agents run with `--metric-names dcgm`:
the GPU panels read dcgm-exporter's names (converted back to base units) and its `Hostname` label."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from gpulens import promql as P
from gpulens.errors import BadInputError, shown
from gpulens.files import missing_folder, write_atomically
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
from gpulens.views.promql import joules_per_output_token_expr, series_expr, stat_expr
from gpulens.vocab import names as N
from gpulens.vocab.gpu import (
    GPU_CLOCK_EVENT_ACTIVE,
    GPU_ENERGY_JOULES_TOTAL,
    GPU_PROCESS_MEMORY,
    GPU_UP,
    GPU_XID_TOTAL,
    METRICS_BY_NAME,
)

MetricNames = Literal["gpulens", "dcgm"]
DS = "${datasource}"
DS_REF = {"type": "prometheus", "uid": DS}
# The data-source picker: what provisioning fills (the default Prometheus) instead of an __inputs prompt.
DATASOURCE_VARIABLE = {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
                       "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1, "regex": ""}
# dcgm-exporter's host label (`--metric-names dcgm`, exporter/prometheus.py)
DCGM_HOST_LABEL = "Hostname"
# GPU series that keep gpulens's name under --metric-names dcgm (with dcgm's labels)
DCGM_KEPT = frozenset({GPU_UP, GPU_XID_TOTAL})
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
    "joules_per_token": "short",
    "flag": "bool_on_off",
}
VARIABLES = {
    # variable -> (metric that carries the label, help)
    "host": (GPU_UP, "Host"),
    "gpu": (GPU_UP, "GPU"),
    "job": (f"{N.TRAIN_STEP_SECONDS}_count", "Training job"),  # a histogram: its _count series carries the labels
    "service": (f"{N.INFER_LATENCY_SECONDS}_count", "Inference service"),
}


def _regex(workload: str, names: MetricNames = "gpulens") -> dict[str, str]:
    regex = {selection_label(k): f"${k}" for k in SELECTION_KEYS[workload]}  # type: ignore[index]
    if names == "dcgm" and workload == "gpu":
        regex[DCGM_HOST_LABEL] = regex.pop(selection_label("host"))
    return regex


def _gpu_series(metric: str, workload: str, names: MetricNames) -> tuple[str, float] | None:
    """(the series to read, what to divide it by for the base unit); None where the naming has no such series."""
    if names == "gpulens" or workload != "gpu" or metric in DCGM_KEPT:
        return metric, 1.0
    spec = METRICS_BY_NAME.get(metric)
    if spec is None or spec.dcgm_name is None:
        return None  # gpulens-only (process memory, clock-event reasons): not exported in dcgm mode
    return spec.dcgm_name, spec.dcgm_scale


def _scaled(expr: str, scale: float) -> str:
    """A dcgm value back in base units: MiB → bytes, % → ratio, MHz → Hz."""
    if scale == 1.0:
        return expr
    return f"{P.paren(expr)} / {P.number(scale)}" if scale > 1 else f"{P.paren(expr)} * {P.number(round(1 / scale))}"


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


def _timeseries(chart: ChartSpec, panel: PanelSpec, pid: int, x: int, y: int, names: MetricNames = "gpulens") -> dict[str, Any]:
    targets = []
    for s in chart.series:
        workload = s.workload or panel.id
        read = _gpu_series(s.metric, workload, names)
        if read is None:
            continue
        spec = replace(s, metric=read[0]) if read[0] != s.metric else s
        # a quantile keeps its owner apart (one line per service / job), so the legend can name it
        expr = _scaled(series_expr(spec, {}, "$__rate_interval", _regex(workload, names), by=(LEGEND_OWNER[workload],)), read[1])
        targets.append({"refId": chr(ord("A") + len(targets)), "expr": expr, "legendFormat": _legend(s, panel), "datasource": DS_REF})
    return {
        "id": pid,
        "type": "timeseries",
        "title": chart.title,
        "description": chart.help,
        "datasource": DS_REF,
        "gridPos": {"h": 8, "w": 8, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": GRAFANA_UNITS[chart.unit], "custom": {"lineWidth": 1, "spanNulls": True}}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": targets,
    }


def _stats(panel: PanelSpec, pid: int, y: int, names: MetricNames = "gpulens") -> dict[str, Any] | None:
    targets = []
    for st in panel.stats:
        if st.agg == "joules_per_token":
            expr = _joules_per_token(panel, names)
            if expr:
                targets.append({"refId": chr(ord("A") + len(targets)), "expr": expr, "legendFormat": st.label,
                                "instant": True, "datasource": DS_REF})
            continue
        read = _gpu_series(st.metric, panel.id, names)
        if read is None:
            continue
        expr = stat_expr(replace(st, metric=read[0]), {}, "$__range", _regex(panel.id, names))
        if expr:
            targets.append({"refId": chr(ord("A") + len(targets)), "expr": _scaled(expr, read[1]), "legendFormat": st.label,
                            "instant": True, "datasource": DS_REF})
    if not targets:
        return None
    return {
        "id": pid,
        "type": "stat",
        "title": f"{panel.title}: over the range",
        "datasource": DS_REF,
        "gridPos": {"h": 4, "w": 24, "x": 0, "y": y},
        "fieldConfig": {"defaults": {"unit": "short"}, "overrides": [
            {"matcher": {"id": "byName", "options": st.label}, "properties": [{"id": "unit", "value": GRAFANA_UNITS[st.unit]}]}
            for st in panel.stats
        ]},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"]}, "textMode": "value_and_name", "colorMode": "none"},
        "targets": targets,
    }


def _joules_per_token(panel: PanelSpec, names: MetricNames) -> str | None:
    """Serving's J per generated token over the range (views.promql says what is exact); None for
    training, whose tokens reach Prometheus only as a tokens-per-second gauge, not a count."""
    if panel.id != "inference":
        return None
    energy, scale = _gpu_series(GPU_ENERGY_JOULES_TOTAL, "gpu", names) or (GPU_ENERGY_JOULES_TOTAL, 1.0)
    host = selection_label("host")
    return joules_per_output_token_expr(energy, {DCGM_HOST_LABEL if names == "dcgm" else host: "$host"},
                                        _regex("inference", "gpulens"), "$__range", scale)


# Grafana refuses a uid longer than 40 characters or with other characters (util.IsValidShortUID,
# MaxUIDLength); an empty one gets a new random uid on every import, so re-imports stop overwriting.
GRAFANA_UID_MAX_CHARS = 40
_GRAFANA_UID = re.compile(rf"[A-Za-z0-9_-]{{1,{GRAFANA_UID_MAX_CHARS}}}")


def grafana_dashboard(title: str = "gpulens: training | inference | GPU health", uid: str = DEFAULT_UID,
                      metric_names: MetricNames = "gpulens") -> dict[str, Any]:
    """The dashboard JSON, for file provisioning or import as it is (a `${datasource}` variable, no
    `__inputs`), over the agents' names: gpulens's, or dcgm-exporter's for the GPU panels."""
    if metric_names not in ("gpulens", "dcgm"):
        raise BadInputError(f"--metric-names must be gpulens or dcgm, not {shown(metric_names)}.")
    if not _GRAFANA_UID.fullmatch(uid):
        raise BadInputError(f"--uid must be 1 to {GRAFANA_UID_MAX_CHARS} letters, digits, '-' or '_' (what Grafana accepts), "
                            f"not {shown(uid)}.", hint=f"Keep the default ({DEFAULT_UID}) or pass a short name such as gpulens-prod.")
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for panel in PANELS.values():
        panels.append({"id": pid, "type": "row", "title": panel.title, "collapsed": False, "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y = pid + 1, y + 1
        stats = _stats(panel, pid, y, metric_names)
        if stats:
            panels.append(stats)
            pid, y = pid + 1, y + 4
        for i, chart in enumerate(panel.charts):
            panels.append(_timeseries(chart, panel, pid, (i % 3) * 8, y + (i // 3) * 8, metric_names))
            pid += 1
        y += ((len(panel.charts) + 2) // 3) * 8
    def var_label(name: str, metric: str) -> str:
        if metric_names == "dcgm" and metric == GPU_UP and name == "host":
            return DCGM_HOST_LABEL  # gpu_up carries dcgm's labels in that mode
        return selection_label(name)

    variables = [dict(DATASOURCE_VARIABLE)] + [
        {
            "name": name,
            "label": label,
            "type": "query",
            "datasource": DS_REF,
            "query": {"query": f"label_values({metric}, {var_label(name, metric)})", "refId": f"var-{name}"},
            "definition": f"label_values({metric}, {var_label(name, metric)})",
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
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
            {"type": "panel", "id": "timeseries", "name": "Time series", "version": ""},
            {"type": "panel", "id": "stat", "name": "Stat", "version": ""},
        ],
        "uid": uid,
        "title": title,
        "description": "Training, inference and GPU health from gpulens agents (exported by `gpulens export grafana`"
                       + (" --metric-names dcgm)." if metric_names == "dcgm" else ")."),
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
    if not path.parent.is_dir():
        raise missing_folder(path, "the dashboard")
    write_atomically(path, text + "\n", what="the dashboard", hint="Free some space or choose an --out path you can write to.")
    return text
