"""The dashboard's JSON API over the replayed H200 session (a real SQLite store), in-process."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from gpulens.store import Store  # noqa: E402
from gpulens.vocab import names as wn  # noqa: E402
from gpulens.web import create_app  # noqa: E402


@pytest.fixture(scope="module")
def client(replayed_store: Path):
    with TestClient(create_app(store_path=replayed_store)) as c:
        yield c


def raw_values(db: Path, metric: str) -> np.ndarray:
    """The store's samples of a metric, read with plain SQL (not through gpulens)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT s.value FROM samples s JOIN series x ON x.id = s.series_id WHERE x.name = ? ORDER BY s.t", (metric,)
        ).fetchall()
    return np.array([r[0] for r in rows])


def recorded(trace: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (trace / "events.jsonl").read_text().splitlines()) if r.get("kind") == kind]


def stat(panel: dict, stat_id: str) -> float | None:
    return next(s for s in panel["stats"] if s["id"] == stat_id)["value"]


def test_window_snaps_to_recorded_data(client, replayed_store):
    meta = client.get("/api/meta").json()
    with Store(replayed_store, readonly=True) as s:
        lo, hi = s.time_range()
    # The session is in the past: the 15-minute default window covers the recorded data instead.
    assert meta["window"] == {"start": pytest.approx(lo), "end": pytest.approx(hi), "snapped_to_data": True}
    assert meta["selections"]["gpu"] == ["0"]
    assert [p["id"] for p in meta["panels"]] == ["training", "inference", "gpu"]


def test_gpu_panel_numbers_equal_the_store(client, replayed_store):
    p = client.get("/api/panel/gpu").json()
    assert p["has_data"]
    assert stat(p, "temperature_max") == raw_values(replayed_store, "gpu_temperature_celsius").max()
    assert stat(p, "power_max") == pytest.approx(raw_values(replayed_store, "gpu_power_watts").max())
    assert stat(p, "util_mean") == pytest.approx(raw_values(replayed_store, "gpu_utilization_ratio").mean())
    assert stat(p, "xid_events") == 0  # the session had no XID: shown as 0, not as missing
    charts = {c["id"]: c for c in p["charts"]}
    for cid in ("gpu_util", "gpu_temperature", "gpu_power", "gpu_clocks", "gpu_memory"):
        assert charts[cid]["series"] and len(charts[cid]["series"][0]["t"]) > 10, cid
    # One line per clock-event reason, named by the reason and the GPU.
    assert {s["label"] for s in charts["gpu_throttle"]["series"]} >= {"idle (GPU 0)", "sw_power_cap (GPU 0)", "hw_slowdown (GPU 0)"}


def test_training_panel_numbers_equal_the_trace(client, replayed_store, h200_trace):
    p = client.get("/api/panel/training").json()
    assert p["has_data"], p["empty_hint"]
    steps = recorded(h200_trace, "train_step")
    assert stat(p, "steps") == len(steps)
    step_s = raw_values(replayed_store, wn.TRAIN_STEP_SECONDS)
    assert stat(p, "step_p50") == pytest.approx(np.percentile(step_s, 50))
    assert stat(p, "step_p95") == pytest.approx(np.percentile(step_s, 95))
    # The data-wait share is total wait over total step time, from the recorded steps themselves.
    share = sum(r["data_wait_s"] for r in steps) / sum(r["step_s"] for r in steps)
    assert stat(p, "data_wait_share") == pytest.approx(share, rel=1e-6)
    assert stat(p, "memory_peak") == max(r["mem_peak"] for r in steps)
    step_chart = next(c for c in p["charts"] if c["id"] == "train_step")
    # Each line names its job, even when it is the only one.
    assert {s["label"] for s in step_chart["series"]} >= {"step (job h200-demo)", "data wait (job h200-demo)", "compute (job h200-demo)"}


def test_inference_panel_percentiles_come_from_every_request(client, replayed_store, h200_trace):
    p = client.get("/api/panel/inference").json()
    assert p["has_data"], p["empty_hint"]
    reqs = recorded(h200_trace, "request")
    assert stat(p, "requests") == len(reqs)
    lat = raw_values(replayed_store, wn.INFER_LATENCY_SECONDS)
    for q in (50, 95, 99):
        assert stat(p, f"latency_p{q}") == pytest.approx(np.percentile(lat, q))
    latency = next(c for c in p["charts"] if c["id"] == "infer_latency")
    p50, p99 = (next(s for s in latency["series"] if s["label"] == k) for k in ("p50", "p99"))
    assert all(a <= b for a, b in zip(p50["v"], p99["v"], strict=True))


def test_empty_panel_says_what_feeds_it(tmp_path):
    db = tmp_path / "gpu-only.db"
    with Store(db) as s:
        for i in range(30):
            s.write("gpu_utilization_ratio", {"gpu": "0", "host": "h"}, 1000.0 + i, 0.5)
    with TestClient(create_app(store_path=db)) as c:
        p = c.get("/api/panel/training?start=990&end=1040").json()
        assert not p["has_data"] and "training monitor" in p["empty_hint"]
        assert c.get("/api/panel/gpu?start=990&end=1040").json()["has_data"]


def test_series_are_downsampled_on_the_server(client):
    full = client.get("/api/series?metric=gpu_power_watts&points=4000").json()["series"][0]
    small = client.get("/api/series?metric=gpu_power_watts&points=50").json()["series"][0]
    assert len(full["t"]) > 500  # ~1000 samples at 10 Hz
    assert 25 <= len(small["t"]) <= 50
    # Buckets keep the extremes: the downsampled max is the true max.
    assert max(small["v_max"]) == max(full["v"])


def test_selection_filters_by_label(client):
    assert client.get("/api/panel/gpu?gpu=0").json()["has_data"]
    other = client.get("/api/panel/gpu?gpu=7").json()
    assert not other["has_data"] and other["charts"] == []
    assert not client.get("/api/panel/training?job=nope").json()["has_data"]


@pytest.mark.parametrize(
    ("url", "status", "words"),
    [
        ("/api/panel/gpu?start=10&end=5", 400, "must come after"),
        ("/api/panel/gpu?start=10", 400, "both start and end"),
        ("/api/panel/gpu?range=soon", 400, "Cannot read range"),
        ("/api/panel/gpu?points=1", 400, "points must be between"),
        ("/api/panel/gpu?start=nan&end=5", 400, "finite"),
        ("/api/panel/nope", 404, "no panel"),
        ("/api/series", 400, "Name the metric"),
    ],
)
def test_bad_parameters_get_one_sentence(client, url, status, words):
    r = client.get(url)
    assert r.status_code == status
    assert words in r.json()["error"]


@pytest.mark.parametrize("param", ["start", "points", "range"])
def test_a_huge_bad_value_is_named_not_echoed_whole(client, param):
    junk = "x" * 20_000
    query = {"start": junk, "end": "5"} if param == "start" else {param: junk}
    r = client.get("/api/panel/gpu", params=query)
    assert r.status_code == 400
    error = r.json()["error"]
    assert "xxxx" in error and "(20,000 characters)" in error and len(error) < 200, error


@pytest.mark.parametrize("start", [1e20, -1e20])
def test_a_far_off_window_is_empty_not_an_error(client, start):
    # A window at 1e20 s long enough for the roll-ups: its bucket start overflowed SQLite's INTEGER (a 500).
    r = client.get("/api/series", params={"metric": "gpu_power_watts", "start": repr(start), "end": repr(start + 3e7)})
    assert r.status_code == 200, r.text
    assert all(s["t"] == [] for s in r.json()["series"])


def test_findings_come_with_advice(client):
    body = client.get("/api/findings").json()
    assert body["available"], body["note"]
    kinds = {f["kind"] for f in body["findings"]}
    assert "input_bound" in kinds
    f = next(f for f in body["findings"] if f["kind"] == "input_bound")
    assert f["advice"] and f["summary"]


def test_events_list_the_cold_start(client):
    ev = client.get("/api/events?kind=cold_start").json()["events"]
    assert len(ev) == 1 and ev[0]["data"]["seconds"] == pytest.approx(7.782, abs=1e-3)


def test_openapi_describes_every_route(client):
    spec = client.get("/api/openapi.json").json()
    assert spec["openapi"].startswith("3.")
    assert {"/api/meta", "/api/panel/{panel}", "/api/series", "/api/findings", "/api/alerts", "/api/events"} <= set(spec["paths"])


def test_alerts_from_the_alert_engine_are_listed(tmp_path):
    db = tmp_path / "alerts.db"
    with Store(db) as s:
        s.write("gpu_temperature_celsius", {"gpu": "0", "host": "h"}, 1000.0, 90.0)
        # What gpulens.alerts' engine records on each transition.
        s.event("alert", 1001.0, {"gpu": "0", "host": "h"}, {"rule": "GpuHot", "state": "firing", "severity": "critical",
                                                             "value": 90.0, "summary": "GPU 0 is at 90 °C", "silenced": False})
    with TestClient(create_app(store_path=db)) as c:
        alerts = c.get("/api/alerts?start=900&end=1100").json()["alerts"]
    assert alerts == [{"t": 1001.0, "name": "GpuHot", "state": "firing", "severity": "critical",
                       "summary": "GPU 0 is at 90 °C", "labels": {"gpu": "0", "host": "h"}}]
