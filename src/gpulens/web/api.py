"""The JSON API behind the panels (documented in gpulens.web.openapi). Read-only, GET only.

Handlers parse and validate the query, call one function of gpulens.views.data, and answer JSON.
A bad parameter is a 400 with one sentence saying what to send instead.
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gpulens.errors import BadInputError, GpulensError, shown
from gpulens.reader import PanelReader as Reader
from gpulens.views.data import (
    DEFAULT_EVENT_KINDS,
    RANGE_CHOICES,
    Selection,
    Window,
    build_panel,
    clamp_points,
    resolve_window,
)
from gpulens.views.panels import PANELS
from gpulens.vocab import names as N
from gpulens.vocab.gpu import GPU_UTILIZATION_RATIO

MAX_EVENTS = 1000
EVENT_WORKLOAD = {"xid": "gpu", N.EV_COLD_START: "inference", N.EV_TRAIN_OOM: "training", N.EV_TRAIN_NAN: "training"}


def _finite(obj: Any) -> Any:
    """JSON has no NaN or infinity: they become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def json_response(obj: Any, status: int = 200) -> Response:
    body = json.dumps(_finite(obj), separators=(",", ":"), ensure_ascii=False, default=str)
    return Response(body, status_code=status, media_type="application/json", headers={"Cache-Control": "no-store"})


def error_response(e: GpulensError, status: int = 400) -> Response:
    return json_response({"error": e.message, "hint": e.hint or ""}, status)


def _float(request: Request, name: str) -> float | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        v = float(raw)
    except ValueError:
        raise BadInputError(f"{name} must be a number of unix seconds, not {shown(raw)}.", hint="e.g. 1796002115.4") from None
    if not math.isfinite(v):
        raise BadInputError(f"{name} must be a finite number, not {shown(raw)}.", hint="e.g. 1796002115.4")
    return v


def _int(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise BadInputError(f"{name} must be a whole number, not {shown(raw)}.", hint="e.g. 600") from None


def window_of(request: Request, reader: Reader) -> Window:
    return resolve_window(
        reader, range_text=request.query_params.get("range"), start=_float(request, "start"), end=_float(request, "end")
    )


def selection_of(request: Request) -> Selection:
    q = request.query_params
    return Selection(gpu=q.get("gpu") or None, job=q.get("job") or None, service=q.get("service") or None, host=q.get("host") or None)


def _reader(request: Request) -> Reader:
    return request.app.state.reader  # type: ignore[no-any-return]


def _window_dict(w: Window) -> dict[str, Any]:
    return {"start": w.start, "end": w.end, "snapped_to_data": w.snapped_to_data}


async def health(request: Request) -> Response:
    reader = _reader(request)
    return json_response({"ok": True, "source": reader.kind, "description": reader.description})


def meta(request: Request) -> Response:
    reader = _reader(request)
    w = window_of(request, reader)
    rng = reader.data_range()
    panels = [
        {
            "id": p.id,
            "title": p.title,
            "empty_hint": p.empty_hint,
            "charts": [{"id": c.id, "title": c.title, "unit": c.unit, "help": c.help} for c in p.charts],
        }
        for p in PANELS.values()
    ]
    return json_response(
        {
            "source": reader.kind,
            "description": reader.description,
            "data_start": rng[0] if rng else None,
            "data_end": rng[1] if rng else None,
            "window": _window_dict(w),
            "ranges": list(RANGE_CHOICES),
            "selections": reader.label_values(),
            "panels": panels,
        }
    )


def panel(request: Request) -> Response:
    reader = _reader(request)
    panel_id = request.path_params["panel"]
    if panel_id not in PANELS:
        return error_response(BadInputError(f"There is no panel {shown(panel_id)}.", hint=f"Choose one of: {', '.join(PANELS)}."), 404)
    w = window_of(request, reader)
    out = build_panel(reader, panel_id, w, selection_of(request), clamp_points(_int(request, "points")))
    return json_response({**out.to_dict(), "window": _window_dict(w)})


def series(request: Request) -> Response:
    """One metric's series, downsampled on the server to about `points` buckets."""
    reader = _reader(request)
    metric = request.query_params.get("metric")
    if not metric:
        raise BadInputError(f"Name the metric: metric={GPU_UTILIZATION_RATIO}.", hint="GET /api/meta lists the panels' metrics.")
    w = window_of(request, reader)
    sel = selection_of(request)
    match = {k: v for k, v in vars(sel).items() if v}
    lines = reader.line(metric, match, w.start, w.end, clamp_points(_int(request, "points")))
    return json_response(
        {
            "metric": metric,
            "window": _window_dict(w),
            "series": [
                {"labels": ln.labels, "t": ln.t, "v": ln.value, "v_min": ln.value_min, "v_max": ln.value_max}
                for ln in lines
            ],
        }
    )


def findings(request: Request) -> Response:
    from gpulens.views.integrations import findings as find

    reader = _reader(request)
    w = window_of(request, reader)
    if reader.kind != "store":
        return json_response(
            {
                "available": False,
                "note": "Diagnosis reads a node's own store: run `gpulens diagnose --store PATH` on the node.",
                "findings": [],
                "window": _window_dict(w),
            }
        )
    sel = selection_of(request)
    res = find(reader, w.start, w.end, sel.job, sel.service)  # type: ignore[arg-type]
    found = [f.to_dict() for f in res.findings]
    return json_response({"available": res.available, "note": res.note, "findings": found, "window": _window_dict(w)})


def alerts(request: Request) -> Response:
    reader = _reader(request)
    w = window_of(request, reader)
    rows = reader.alerts(w.start, w.end)
    return json_response({"alerts": [vars(a) for a in rows], "window": _window_dict(w)})


def events(request: Request) -> Response:
    reader = _reader(request)
    w = window_of(request, reader)
    kinds = tuple(k for k in request.query_params.getlist("kind") if k) or DEFAULT_EVENT_KINDS
    if len(kinds) > 20:
        raise BadInputError("Ask for at most 20 event kinds at once.", hint=f"e.g. kind=xid&kind={N.EV_COLD_START}")
    sel = selection_of(request)
    rows = []
    if reader.supports_events:
        for kind in kinds:
            # A picked job filters training events, a service inference events, a GPU GPU events.
            rows += reader.events((kind,), w.start, w.end, sel.match(EVENT_WORKLOAD.get(kind, "host")))
        rows = sorted(rows, key=lambda e: e.t)[:MAX_EVENTS]
    return json_response(
        {
            "supported": reader.supports_events,
            "events": [{"t": e.t, "kind": e.kind, "labels": e.labels, "data": e.data} for e in rows],
            "window": _window_dict(w),
        }
    )


async def openapi(request: Request) -> Response:
    from gpulens.web.openapi import SPEC

    return json_response(SPEC)
