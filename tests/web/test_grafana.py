"""The Grafana export: the same three panels, Grafana's import format, and the command.
(Its queries are run against a real Prometheus in test_prometheus_source.py.)"""

from __future__ import annotations

import json
import re

import pytest

from gpulens.cli.main import main
from gpulens.export.grafana import grafana_dashboard
from gpulens.views.panels import PANELS


def test_dashboard_has_the_three_panels_and_every_chart():
    d = grafana_dashboard()
    rows = [p["title"] for p in d["panels"] if p["type"] == "row"]
    assert rows == [p.title for p in PANELS.values()]
    charts = {p["title"] for p in d["panels"] if p["type"] == "timeseries"}
    assert charts == {c.title for p in PANELS.values() for c in p.charts}
    assert {v["name"] for v in d["templating"]["list"]} == {"datasource", "host", "gpu", "job", "service"}


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
    # one line per service: several services never merge into one unnamed line
    assert exprs["Request latency p50 / p95 / p99"][2].startswith(
        "histogram_quantile(0.99, sum by (le, service) (rate(infer_request_latency_seconds_bucket{")
    assert all("sum by (le, service)" in e for e in exprs["Time to first token"] + exprs["Time per output token"])
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


def _kept_labels(expr: str) -> set[str] | None:
    """The labels an expression's result keeps: those of its outer `sum by (...)`, none for a bare
    `sum(`, None (all of the series') when it aggregates nothing."""
    m = re.search(r"\bsum by \(([^)]*)\)", expr)
    if m:
        return {x.strip() for x in m.group(1).split(",")} - {"le"}
    return set() if re.search(r"\b(sum|avg|max|min)\(", expr) else None


@pytest.mark.parametrize("names", ["gpulens", "dcgm"])
def test_the_json_provisions_from_a_file_as_it_is(names):
    """What Grafana's file provider needs (it substitutes no `__inputs`): a data-source variable of
    type prometheus that every panel, target and picker names, no placeholder left, every variable a
    query uses defined, and a legend that names only labels its query keeps (never "(service )")."""
    d = grafana_dashboard(metric_names=names)
    text = json.dumps(d)
    assert "__inputs" not in d and "DS_PROMETHEUS" not in text
    variables = {v["name"]: v for v in d["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    ref = {"type": "prometheus", "uid": "${datasource}"}
    assert all(v["datasource"] == ref for v in variables.values() if v["type"] == "query")
    panels = [p for p in d["panels"] if p["type"] != "row"]
    assert panels and all(p["datasource"] == ref for p in panels)
    targets = [t for p in panels for t in p["targets"]]
    assert all(t["datasource"] == ref for t in targets)
    used = {v for t in targets for v in re.findall(r"\$(\w+)", t["expr"])} - {"__rate_interval", "__range"}
    assert used <= set(variables), used - set(variables)
    for t in targets:
        legend_labels = set(re.findall(r"\{\{(\w+)\}\}", t["legendFormat"]))
        assert t["legendFormat"].strip(), t["expr"]
        kept = _kept_labels(t["expr"])
        assert kept is None or legend_labels <= kept, (t["legendFormat"], t["expr"])


def test_the_dcgm_variant_reads_dcgm_names_for_gpus_and_gpulens_names_for_workloads():
    d = grafana_dashboard(metric_names="dcgm")
    exprs = {p["title"]: [t["expr"] for t in p["targets"]] for p in d["panels"] if p["type"] == "timeseries"}
    assert exprs["Power against its limit"] == ['DCGM_FI_DEV_POWER_USAGE{Hostname=~"$host", gpu=~"$gpu"}',
                                                'DCGM_FI_DEV_POWER_MGMT_LIMIT{Hostname=~"$host", gpu=~"$gpu"}']
    assert exprs["GPU memory"][0] == '(DCGM_FI_DEV_FB_USED{Hostname=~"$host", gpu=~"$gpu"}) * 1048576'  # MiB back to bytes
    assert exprs["Utilization"][0] == '(DCGM_FI_DEV_GPU_UTIL{Hostname=~"$host", gpu=~"$gpu"}) / 100'  # % back to a ratio
    gpulens_gpu = re.compile(r"\bgpu_(?!up\b|xid_errors_total\b)\w+\{")
    assert not [e for es in exprs.values() for e in es if gpulens_gpu.search(e)]
    assert any('train_job=~"$job"' in e for e in exprs["Step time and where it goes"])  # workload names as they are
    host = next(v for v in d["templating"]["list"] if v["name"] == "host")
    assert host["definition"] == "label_values(gpu_up, Hostname)"  # gpu_up carries dcgm's labels in that mode
    assert main(["export", "grafana", "--out", "-", "--metric-names", "nvidia"]) == 2


@pytest.mark.parametrize("uid", ["", "a" * 41, "has space", "slash/uid"])
def test_a_uid_grafana_would_refuse_is_refused_here(tmp_path, capsys, uid):
    """Grafana takes 1-40 letters, digits, '-' and '_' (an empty uid is a new random one on every
    import, so re-imports stop overwriting); nothing is written."""
    out = tmp_path / "g.json"
    assert main(["export", "grafana", "--out", str(out), "--uid", uid]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert "--uid must be 1 to 40 letters" in said and "Traceback" not in said
    assert not out.exists()


def test_a_40_character_uid_is_kept(tmp_path):
    out = tmp_path / "g.json"
    assert main(["export", "grafana", "--out", str(out), "--uid", "gpulens_" + "x" * 31 + "-"]) == 0
    assert len(json.loads(out.read_text())["uid"]) == 40
