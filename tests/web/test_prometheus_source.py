"""The dashboard over a real Prometheus server holding the replayed H200 session (backfilled with
`promtool tsdb create-blocks-from openmetrics`, as the agent would have exported it: distributions
as cumulative histograms), and the Grafana export's queries run against it. The fleet path as a
fleet runs it (a Prometheus that scrapes a live agent) is tested in tests/foundation/test_scrape_contract.py."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from testlib import free_port, wait_http, which_or_skip

from gpulens.export.grafana import grafana_dashboard
from gpulens.views.panels import metrics_used
from gpulens.vocab import names as wn

pytestmark = pytest.mark.slow
pytest.importorskip("starlette")


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _histogram_lines(name: str, labels: dict, rows: list[tuple[float, float]], bounds: tuple[float, ...]) -> list[str]:
    """Cumulative buckets after each event (one point per millisecond), from a zero point before the first."""
    counts, total, out, last = [0] * (len(bounds) + 1), 0.0, [], None

    def emit(ts: float) -> None:
        for b, c in zip([*map(repr, bounds), "+Inf"], counts, strict=True):
            lab = ",".join(f'{k}="{_esc(v)}"' for k, v in sorted({**labels, "le": b}.items()))
            out.append(f"{name}_bucket{{{lab}}} {c} {ts:.3f}")
        lab = ",".join(f'{k}="{_esc(v)}"' for k, v in sorted(labels.items()))
        out.append(f"{name}_sum{{{lab}}} {total!r} {ts:.3f}")
        out.append(f"{name}_count{{{lab}}} {counts[-1]} {ts:.3f}")

    emit(round(rows[0][0] - 1.0, 3))
    for t, v in rows:
        for i, b in enumerate(bounds):
            counts[i] += v <= b
        counts[-1] += 1
        total += v
        if last is not None and round(t, 3) <= last:
            continue
        last = round(t, 3)
        emit(last)
    return out


def write_openmetrics(db: Path, out: Path, metrics: list[str]) -> None:
    """The store's samples of `metrics` as OpenMetrics text with timestamps (plain SQL, not gpulens)."""
    lines = []
    with sqlite3.connect(db) as conn:
        for name in sorted({m for m in metrics if m in wn.HISTOGRAM_BUCKETS}):
            lines.append(f"# TYPE {name} histogram")
            for sid, labels_json in conn.execute("SELECT id, labels FROM series WHERE name = ? ORDER BY id", (name,)).fetchall():
                rows = conn.execute("SELECT t, value FROM samples WHERE series_id = ? ORDER BY t", (sid,)).fetchall()
                if rows:
                    lines += _histogram_lines(name, json.loads(labels_json), rows, wn.HISTOGRAM_BUCKETS[name])
        for sid, name, labels_json in conn.execute("SELECT id, name, labels FROM series ORDER BY name, id"):
            if name not in metrics or name in wn.HISTOGRAM_BUCKETS:
                continue
            labels = ",".join(f'{k}="{_esc(v)}"' for k, v in sorted(json.loads(labels_json).items()))
            last = None
            for t, v in conn.execute("SELECT t, value FROM samples WHERE series_id = ? ORDER BY t", (sid,)):
                if last is not None and round(t, 3) <= last:
                    continue  # OpenMetrics wants strictly increasing timestamps (ms resolution)
                last = round(t, 3)
                lines.append(f"{name}{{{labels}}} {v!r} {last:.3f}")
    lines.append("# EOF")
    out.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def prometheus(replayed_store, tmp_path_factory):
    prom, promtool = which_or_skip("prometheus"), which_or_skip("promtool")
    work = tmp_path_factory.mktemp("prom")
    om = work / "h200.om"
    write_openmetrics(replayed_store, om, metrics_used())
    data = work / "data"
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)], check=True, capture_output=True, timeout=120)
    cfg = work / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 15s\n")
    port = free_port()
    proc = subprocess.Popen(
        [prom, f"--config.file={cfg}", f"--storage.tsdb.path={data}", f"--web.listen-address=127.0.0.1:{port}",
         "--storage.tsdb.retention.time=3650d"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/-/ready", proc, 30)
    except AssertionError as e:
        proc.kill()
        pytest.fail(f"prometheus did not start ({e}): {proc.stderr.read().decode()[-2000:]}")
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def client(prometheus):
    from starlette.testclient import TestClient

    from gpulens.web import create_app

    with TestClient(create_app(prometheus_url=prometheus)) as c:
        yield c


@pytest.fixture(scope="module")
def window(replayed_store) -> str:
    with sqlite3.connect(replayed_store) as conn:
        lo, hi = conn.execute("SELECT min(t), max(t) FROM samples").fetchone()
    return f"start={lo - 1:.3f}&end={hi + 1:.3f}"


def store_values(db: Path, metric: str) -> np.ndarray:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT s.value FROM samples s JOIN series x ON x.id = s.series_id WHERE x.name = ?", (metric,)).fetchall()
    return np.array([r[0] for r in rows])


def one_per_ms(db: Path, metric: str) -> np.ndarray:
    """The samples Prometheus can hold: one per series per millisecond (requests of one batch end together)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT s.series_id, s.t, s.value FROM samples s JOIN series x ON x.id = s.series_id WHERE x.name = ? ORDER BY s.series_id, s.t",
            (metric,),
        ).fetchall()
    seen, out = set(), []
    for sid, t, v in rows:
        if (sid, round(t, 3)) not in seen:
            seen.add((sid, round(t, 3)))
            out.append(v)
    return np.array(out)


def within_bucket(estimate: float | None, exact: float, bounds: tuple[float, ...]) -> bool:
    """histogram_quantile interpolates inside the bucket that holds the rank: as exact as that bucket."""
    edges = [0.0, *bounds, float("inf")]
    i = next(i for i in range(1, len(edges)) if exact <= edges[i])
    lo, hi = edges[i - 1], edges[i]
    assert estimate is not None and lo - 1e-9 <= estimate <= hi + 1e-9, (estimate, exact, lo, hi)
    return True


def stat(panel: dict, sid: str):
    return next(s for s in panel["stats"] if s["id"] == sid)["value"]


def test_panels_over_prometheus_show_the_stores_numbers(client, window, replayed_store):
    gpu = client.get(f"/api/panel/gpu?{window}").json()
    assert gpu["has_data"]
    assert stat(gpu, "temperature_max") == store_values(replayed_store, "gpu_temperature_celsius").max()
    assert stat(gpu, "power_max") == pytest.approx(store_values(replayed_store, "gpu_power_watts").max())
    assert stat(gpu, "xid_events") is None  # Prometheus keeps no events: unknown, not zero
    power = next(c for c in gpu["charts"] if c["id"] == "gpu_power")
    assert len(power["series"][0]["t"]) > 50

    train = client.get(f"/api/panel/training?{window}").json()
    steps = store_values(replayed_store, wn.TRAIN_STEP_SECONDS)
    assert stat(train, "steps") == pytest.approx(len(steps), rel=0.05)  # increase() extrapolates to the window's edges
    # ... but a count is whole: the dashboard showed "831.01 steps" and "711.72 requests"
    texts = {s["id"]: s for s in train["stats"]}
    assert float(stat(train, "steps")).is_integer() and "." not in texts["steps"]["display"], texts["steps"]
    assert within_bucket(stat(train, "step_p95"), np.percentile(steps, 95), wn.HISTOGRAM_BUCKETS[wn.TRAIN_STEP_SECONDS])

    infer = client.get(f"/api/panel/inference?{window}&points=200").json()
    latency = store_values(replayed_store, wn.INFER_LATENCY_SECONDS)
    assert within_bucket(stat(infer, "latency_p99"), np.percentile(latency, 99), wn.HISTOGRAM_BUCKETS[wn.INFER_LATENCY_SECONDS])
    assert float(stat(infer, "requests")).is_integer(), stat(infer, "requests")
    rps = next(c for c in infer["charts"] if c["id"] == "infer_rps")
    assert rps["series"] and max(v for v in rps["series"][0]["v"] if v is not None) > 0


def test_meta_and_findings_over_prometheus(client, window):
    meta = client.get(f"/api/meta?{window}").json()
    assert meta["source"] == "prometheus" and meta["selections"]["gpu"] == ["0"]
    f = client.get(f"/api/findings?{window}").json()
    assert f["available"] is False and "gpulens diagnose" in f["note"]


def test_unreachable_prometheus_is_a_503_with_a_sentence():
    from starlette.testclient import TestClient

    from gpulens.web import create_app

    with TestClient(create_app(prometheus_url=f"http://127.0.0.1:{free_port()}")) as c:
        r = c.get("/api/panel/gpu")
        assert r.status_code == 503 and "Cannot reach Prometheus" in r.json()["error"]


def test_every_grafana_query_runs_on_prometheus(prometheus, window):
    dash = grafana_dashboard()
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 40
    params = dict(urllib.parse.parse_qsl(window))
    answered = 0
    for expr in exprs:
        concrete = re.sub(r"\$__rate_interval", "1m", expr).replace("$__range", "10m")
        concrete = re.sub(r"\$(host|gpu|job|service)\b", ".*", concrete)
        q = urllib.parse.urlencode({"query": concrete, "start": params["start"], "end": params["end"], "step": "5"})
        with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{q}", timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", concrete
        answered += bool(body["data"]["result"])
    # Most panels' queries find the replayed data (a few series, e.g. MFU or ECC, were never recorded).
    assert answered >= len(exprs) // 2, answered
