"""End to end with the real servers: `gpulens agent` on the fake backend with XID 79 injected serves
/metrics, a real Prometheus scrapes it and evaluates the rules `gpulens alerts export` wrote, and the
alert arrives in a real Alertmanager's API, critical, with the catalog's action. The agent's own
rule engine records the same alert in its store."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest
from testlib import free_port, wait_http, which_or_skip

from gpulens.alerts.engine import load_alerts
from gpulens.cli.main import main
from gpulens.store import Store

pytestmark = pytest.mark.slow


def _get(url: str):  # noqa: ANN202
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())



def test_xid79_reaches_alertmanager(tmp_path):
    prometheus = which_or_skip("prometheus")
    alertmanager = which_or_skip("prometheus-alertmanager")
    agent_port, prom_port, am_port = free_port(), free_port(), free_port()
    rules = tmp_path / "rules.yml"
    assert main(["alerts", "export", "--format", "prometheus", "--out", str(rules), "--store", str(tmp_path / "empty.db")]) == 2
    Store(tmp_path / "empty.db").close()
    assert main(["alerts", "export", "--format", "prometheus", "--out", str(rules), "--store", str(tmp_path / "empty.db")]) == 0
    (tmp_path / "am.yml").write_text("route:\n  receiver: none\nreceivers:\n  - name: none\n")
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files: ['{rules}']\n"
        f"alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['127.0.0.1:{am_port}']\n"
        f"scrape_configs:\n  - job_name: gpulens\n    static_configs:\n      - targets: ['127.0.0.1:{agent_port}']\n"
    )
    procs = []
    try:
        am = subprocess.Popen(
            [alertmanager, f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path / 'am'}",
             f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        procs.append(am)
        prom = subprocess.Popen(
            [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        procs.append(prom)
        agent = subprocess.Popen(
            [sys.executable, "-m", "gpulens.cli.main", "agent", "--backend", "fake:1", "--fault", "xid:79@2s",
             "--interval", "1s", "--store", str(tmp_path / "agent.db"), "--listen", f"127.0.0.1:{agent_port}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        procs.append(agent)
        wait_http(f"http://127.0.0.1:{am_port}/-/ready", am)
        wait_http(f"http://127.0.0.1:{prom_port}/-/ready", prom)
        wait_http(f"http://127.0.0.1:{agent_port}/metrics", agent)
        t0 = time.time()
        got = []
        while not got and time.time() - t0 < 60:  # poll for the alert, not a fixed sleep (60 s: a loaded machine's room)
            time.sleep(0.5)
            got = [a for a in _get(f"http://127.0.0.1:{am_port}/api/v2/alerts")
                   if a["labels"].get("alertname") == "GpuXid" and a["labels"].get("xid") == "79"]
        assert got, "GpuXid for XID 79 never reached Alertmanager"
        a = got[0]
        assert a["labels"]["severity"] == "critical" and a["labels"]["gpu"] == "0" and a["labels"]["source"] == "gpulens"
        assert a["status"]["state"] == "active"
        assert "reboot" in a["annotations"]["action"] and "XID 79" in a["annotations"]["summary"]
        # Only the code that happened: no other XID alert.
        others = [x for x in _get(f"http://127.0.0.1:{am_port}/api/v2/alerts")
                  if x["labels"].get("alertname") == "GpuXid" and x["labels"].get("xid") != "79"]
        assert not others
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    assert agent.returncode == 0, agent.stderr.read() if agent.stderr else ""
    with Store(tmp_path / "agent.db") as st:
        local = [x for x in load_alerts(st) if x.rule == "GpuXid"]
    assert local and local[0].labels["xid"] == "79" and local[0].severity == "critical" and local[0].fired_at is not None
