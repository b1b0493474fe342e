"""dcgm-exporter's official Grafana dashboard (grafana.com 12239, copied unchanged in
../shared/data/dcgm-exporter/) against gpulens: a real Prometheus scrapes a fake-backed `gpulens agent
--metric-names dcgm`, the dashboard's template variables are resolved as Grafana resolves them
(`label_values`, "All" selected), and every panel expression must return data."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from testlib import free_port, wait_http, which_or_skip

pytestmark = pytest.mark.slow


def _api(prom: str, path: str, params: dict) -> object:
    with urllib.request.urlopen(f"{prom}{path}?{urllib.parse.urlencode(params)}", timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]



def dashboard_queries(dashboard: dict) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """(panel title, expr) of every target, and template variable -> its label_values(metric, label) query."""
    exprs = [(p.get("title", ""), t["expr"]) for p in dashboard["panels"] for t in p.get("targets", []) if t.get("expr")]
    variables = {v["name"]: v["query"] for v in dashboard["templating"]["list"] if v.get("type") == "query"}
    return exprs, variables


def resolve(expr: str, values: dict[str, list[str]]) -> str:
    """Grafana's substitution of a multi-value variable with "All" selected: an alternation of the
    regex-escaped values, its backslashes doubled inside the PromQL string (as Grafana's Prometheus
    data source writes them)."""
    def sub(m: re.Match) -> str:
        return "(" + "|".join(re.escape(v).replace("\\", "\\\\") for v in values[m.group(1)]) + ")"

    return re.sub(r"\$(\w+)", sub, expr)


def test_resolve_is_grafanas_all_selection():
    assert resolve('x{gpu=~"$gpu"}', {"gpu": ["0", "1"]}) == 'x{gpu=~"(0|1)"}'
    assert resolve('x{instance=~"$instance"}', {"instance": ["127.0.0.1:9"]}) == r'x{instance=~"(127\\.0\\.0\\.1:9)"}'


def test_every_dashboard_expression_returns_data(tmp_path, shared_data):
    prometheus = which_or_skip("prometheus")
    dashboard = json.loads((shared_data / "dcgm-exporter" / "dcgm-exporter-dashboard.json").read_text())
    exprs, variables = dashboard_queries(dashboard)
    assert len(exprs) >= 8 and set(variables) == {"instance", "gpu"}
    agent_port, prom_port = free_port(), free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n"
        f"scrape_configs:\n  - job_name: dcgm\n    static_configs:\n      - targets: ['127.0.0.1:{agent_port}']\n"
    )
    procs: list[subprocess.Popen] = []

    def spawn(name: str, cmd: list[str]) -> tuple[subprocess.Popen, Path]:
        log = tmp_path / f"{name}.log"
        p = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=tmp_path,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
        procs.append(p)
        return p, log

    try:
        agent, agent_log = spawn("agent", [sys.executable, "-m", "gpulens.cli.main", "agent", "--backend", "fake:2",
                                           "--metric-names", "dcgm", "--interval", "1s", "--store", str(tmp_path / "s.db"),
                                           "--listen", f"127.0.0.1:{agent_port}"])
        prom, prom_log = spawn("prometheus", [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                                              f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                              f"--web.listen-address=127.0.0.1:{prom_port}"])
        prom_url = f"http://127.0.0.1:{prom_port}"
        wait_http(f"http://127.0.0.1:{agent_port}/metrics", agent, log=agent_log)
        wait_http(f"{prom_url}/-/ready", prom, log=prom_log)
        # the variables, as Grafana asks for them: label_values(METRIC, LABEL)
        values: dict[str, list[str]] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for name, query in variables.items():
                metric, label = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query).groups()
                values[name] = _api(prom_url, f"/api/v1/label/{label}/values", {"match[]": metric})
            # GPM ratios (the tensor panel) come from the agent's second sample on
            if all(values.values()) and _api(prom_url, "/api/v1/query", {"query": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"})["result"]:
                break
            time.sleep(0.5)
        assert values == {"instance": [f"127.0.0.1:{agent_port}"], "gpu": ["0", "1"]}
        empty = []
        for title, expr in exprs:
            result = _api(prom_url, "/api/v1/query", {"query": resolve(expr, values)})["result"]
            if not result:
                empty.append((title, expr))
            for series in result:
                assert float(series["value"][1]) == float(series["value"][1]), (title, series)  # not NaN
        assert empty == []
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
