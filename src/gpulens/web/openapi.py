"""The dashboard API's OpenAPI 3.0 description, served at /api/openapi.json.

Every endpoint is GET, answers JSON, and takes the same window parameters: either `range` (a
duration ending now, or ending where the data ends when the data is older) or `start` and `end`.
"""

from __future__ import annotations

from typing import Any

from gpulens.views.data import DEFAULT_EVENT_KINDS, DEFAULT_POINTS, DEFAULT_RANGE, MAX_POINTS
from gpulens.views.panels import PANELS
from gpulens.vocab.gpu import GPU_UTILIZATION_RATIO


def _param(name: str, schema: dict[str, Any], description: str, *, where: str = "query", required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required, "schema": schema, "description": description}


WINDOW = [
    _param("range", {"type": "string", "default": DEFAULT_RANGE, "example": "1h"},
           "Length of the window ending now: 500ms, 30s, 15m, 6h, 7d. When the data ends before the window would start "
           "(a recorded session), the window covers the data instead."),
    _param("start", {"type": "number"}, "Window start, unix seconds (give end too; overrides range)."),
    _param("end", {"type": "number"}, "Window end, unix seconds."),
]
SELECTION = [
    _param("gpu", {"type": "string"}, "Only this GPU index (GPU series)."),
    _param("job", {"type": "string"}, "Only this training job (training series)."),
    _param("service", {"type": "string"}, "Only this inference service (inference series)."),
    _param("host", {"type": "string"}, "Only this host (all series)."),
]
POINTS = _param("points", {"type": "integer", "minimum": 2, "maximum": MAX_POINTS, "default": DEFAULT_POINTS},
                "About the chart's width in pixels: the server downsamples each series to at most this many buckets.")

NUM_OR_NULL = {"type": "number", "nullable": True}
LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
WINDOW_OUT = {
    "type": "object",
    "required": ["start", "end", "snapped_to_data"],
    "properties": {"start": {"type": "number"}, "end": {"type": "number"}, "snapped_to_data": {"type": "boolean"}},
}
ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string", "description": "What was wrong, one sentence."}, "hint": {"type": "string"}},
}
SERIES_OUT = {
    "type": "object",
    "required": ["label", "metric", "labels", "t", "v"],
    "properties": {
        "label": {"type": "string"},
        "metric": {"type": "string"},
        "labels": LABELS,
        "t": {"type": "array", "items": {"type": "number"}, "description": "unix seconds"},
        "v": {"type": "array", "items": NUM_OR_NULL, "description": "values in the chart's unit; null = no data"},
        "draw": {"type": "string", "enum": ["line", "points"],
                 "description": "line, or points: one mark per sample, never joined (separate events)"},
    },
}
PANEL_OUT = {
    "type": "object",
    "required": ["id", "title", "start", "end", "has_data", "empty_hint", "stats", "charts", "window"],
    "properties": {
        "id": {"type": "string", "enum": list(PANELS)},
        "title": {"type": "string"},
        "start": {"type": "number"},
        "end": {"type": "number"},
        "has_data": {"type": "boolean"},
        "empty_hint": {"type": "string", "description": "What feeds this panel; shown when it has no data."},
        "window": WINDOW_OUT,
        "stats": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "label", "unit", "value", "display"],
                "properties": {
                    "id": {"type": "string"}, "label": {"type": "string"}, "unit": {"type": "string"},
                    "value": NUM_OR_NULL, "display": {"type": "string"},
                },
            },
        },
        "charts": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "title", "unit", "help", "series"],
                "properties": {
                    "id": {"type": "string"}, "title": {"type": "string"}, "unit": {"type": "string"}, "help": {"type": "string"},
                    "series": {"type": "array", "items": SERIES_OUT},
                    "empty": {"type": "string", "description": "What to say when the chart has nothing to draw."},
                    "band": {
                        "type": "object", "nullable": True,
                        "description": "The learned baseline's normal range, drawn behind the series.",
                        "properties": {"low": {"type": "number"}, "high": {"type": "number"}, "center": NUM_OR_NULL,
                                       "series": {"type": "string", "description": "The legend name of the series it is learned from."}},
                    },
                },
            },
        },
    },
}


def _get(summary: str, params: list[dict[str, Any]], schema: dict[str, Any], *, can_404: bool = False) -> dict[str, Any]:
    responses: dict[str, Any] = {
        "200": {"description": "OK", "content": {"application/json": {"schema": schema}}},
        "400": {"description": "A parameter is wrong", "content": {"application/json": {"schema": ERROR}}},
        "401": {"description": "The dashboard has a token and the request did not carry it",
                "content": {"application/json": {"schema": ERROR}}},
    }
    responses["503"] = {"description": "The source (a Prometheus server) cannot be reached",
                        "content": {"application/json": {"schema": ERROR}}}
    if can_404:
        responses["404"] = {"description": "No such panel", "content": {"application/json": {"schema": ERROR}}}
    return {"get": {"summary": summary, "parameters": params, "responses": responses}}


SPEC: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {
        "title": "gpulens dashboard API",
        "version": "1",
        "description": "Read-only JSON behind the gpulens dashboard: training, inference and GPU-health panels, "
        "findings, alerts and events, over a local store or a Prometheus server. Times are unix seconds; values are "
        "in base units (seconds, bytes, ratios 0..1, watts, hertz). With a token, send `Authorization: Bearer <token>`.",
    },
    "paths": {
        "/api/health": _get("Is the dashboard up, and what does it read?", [], {
            "type": "object", "required": ["ok", "source"],
            "properties": {"ok": {"type": "boolean"}, "source": {"type": "string", "enum": ["store", "prometheus"]},
                           "description": {"type": "string"}},
        }),
        "/api/meta": _get("The data's time range, the selectable GPUs / jobs / services / hosts, and the panels' charts.", WINDOW, {
            "type": "object",
            "required": ["source", "window", "ranges", "selections", "panels"],
            "properties": {
                "source": {"type": "string"}, "description": {"type": "string"},
                "data_start": NUM_OR_NULL, "data_end": NUM_OR_NULL, "window": WINDOW_OUT,
                "ranges": {"type": "array", "items": {"type": "string"}},
                "selections": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
                "panels": {"type": "array", "items": {"type": "object"}},
            },
        }),
        "/api/panel/{panel}": _get(
            "One panel: headline numbers and every chart's series, downsampled to `points`.",
            [_param("panel", {"type": "string", "enum": list(PANELS)}, "training, inference or gpu", where="path", required=True),
             *WINDOW, *SELECTION, POINTS],
            PANEL_OUT,
            can_404=True,
        ),
        "/api/series": _get(
            "Any one metric's series (every label set), downsampled to `points` buckets (mean, min, max per bucket).",
            [_param("metric", {"type": "string", "example": GPU_UTILIZATION_RATIO}, "Metric name", required=True),
             *WINDOW, *SELECTION, POINTS],
            {
                "type": "object", "required": ["metric", "window", "series"],
                "properties": {
                    "metric": {"type": "string"}, "window": WINDOW_OUT,
                    "series": {"type": "array", "items": {
                        "type": "object", "required": ["labels", "t", "v"],
                        "properties": {
                            "labels": LABELS, "t": {"type": "array", "items": {"type": "number"}},
                            "v": {"type": "array", "items": NUM_OR_NULL},
                            "v_min": {"type": "array", "nullable": True, "items": NUM_OR_NULL},
                            "v_max": {"type": "array", "nullable": True, "items": NUM_OR_NULL},
                        },
                    }},
                },
            },
        ),
        "/api/findings": _get("Diagnosis findings in the window, with evidence and advice (most useful fix first).",
                              [*WINDOW, *SELECTION], {
            "type": "object", "required": ["available", "findings", "window"],
            "properties": {"available": {"type": "boolean"}, "note": {"type": "string"}, "window": WINDOW_OUT,
                           "findings": {"type": "array", "items": {"type": "object"}}},
        }),
        "/api/alerts": _get("Alerts that fired or resolved in the window.", WINDOW, {
            "type": "object", "required": ["alerts", "window"],
            "properties": {"window": WINDOW_OUT, "alerts": {"type": "array", "items": {
                "type": "object", "required": ["t", "name", "state", "severity", "summary", "labels"],
                "properties": {"t": {"type": "number"}, "name": {"type": "string"}, "state": {"type": "string"},
                               "severity": {"type": "string"}, "summary": {"type": "string"}, "labels": LABELS},
            }}},
        }),
        "/api/events": _get(
            "Discrete events (XID errors, cold starts, OOMs...) in the window, oldest first, at most 1000.",
            [*WINDOW, *SELECTION,
             _param("kind", {"type": "array", "items": {"type": "string"}, "maxItems": 20}, f"Event kinds (repeat); default {', '.join(DEFAULT_EVENT_KINDS)}")],
            {
                "type": "object", "required": ["supported", "events", "window"],
                "properties": {"supported": {"type": "boolean"}, "window": WINDOW_OUT, "events": {"type": "array", "items": {
                    "type": "object", "required": ["t", "kind", "labels", "data"],
                    "properties": {"t": {"type": "number"}, "kind": {"type": "string"}, "labels": LABELS, "data": {"type": "object"}},
                }}},
            },
        ),
        "/api/openapi.json": _get("This description.", [], {"type": "object"}),
    },
}
