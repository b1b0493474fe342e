"""The Grafana export: the same three panels, Grafana's import format, and the command.
(Its queries are run against a real Prometheus in test_prometheus_source.py.)"""

from __future__ import annotations

import json

from gpulens.cli.main import main
from gpulens.export.grafana import grafana_dashboard
from gpulens.views.panels import PANELS


def test_dashboard_has_the_three_panels_and_every_chart():
    d = grafana_dashboard()
    rows = [p["title"] for p in d["panels"] if p["type"] == "row"]
    assert rows == [p.title for p in PANELS.values()]
    charts = {p["title"] for p in d["panels"] if p["type"] == "timeseries"}
    assert charts == {c.title for p in PANELS.values() for c in p.charts}
    assert {v["name"] for v in d["templating"]["list"]} == {"host", "gpu", "job", "service"}
    assert d["__inputs"][0]["pluginId"] == "prometheus"


def test_panel_ids_are_unique_and_tiles_do_not_overlap():
    d = grafana_dashboard()
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, p["title"]
                cells.add((x, y))


def test_queries_use_the_agents_names_and_the_pickers():
    d = grafana_dashboard()
    exprs = {p["title"]: [t["expr"] for t in p["targets"]] for p in d["panels"] if p["type"] == "timeseries"}
    assert exprs["Power against its limit"] == ['gpu_power_watts{gpu=~"$gpu", host=~"$host"}', 'gpu_power_limit_watts{gpu=~"$gpu", host=~"$host"}']
    assert any("train_step_seconds" in e and 'train_job=~"$job"' in e for e in exprs["Step time and where it goes"])
    assert exprs["Request latency p50 / p95 / p99"][2].startswith("histogram_quantile(0.99, sum by (le) (rate(infer_request_latency_seconds_bucket{")
    assert 'status="timeout"' in " ".join(exprs["Errors and timeouts per second"])


def test_cli_writes_and_prints(tmp_path, capsys):
    out = tmp_path / "g.json"
    assert main(["export", "grafana", "--out", str(out), "--uid", "mine"]) == 0
    assert json.loads(out.read_text())["uid"] == "mine"
    capsys.readouterr()
    assert main(["export", "grafana", "--out", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["title"].startswith("gpulens")
    assert main(["export", "grafana", "--out", str(tmp_path / "no" / "such" / "g.json")]) == 2


def test_legends_say_whose_line_it_is():
    d = grafana_dashboard()
    legends = {p["title"]: [t["legendFormat"] for t in p["targets"]] for p in d["panels"] if p["type"] == "timeseries"}
    assert legends["Clock-event (throttle) reasons"] == ["{{reason}} (GPU {{gpu}})"]
    assert legends["Step time and where it goes"][0] == "step (job {{train_job}})"
    assert legends["Queue depth and requests in flight"][0] == "queued (service {{service}})"
    assert legends["Training memory"][-1] == "GPU capacity (GPU {{gpu}})"  # a GPU series in a training chart
    assert legends["Requests per second"] == ["completed"]  # a sum() keeps no label to name
