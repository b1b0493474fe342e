"""A real Prometheus server scrapes a real agent replaying the H200 session; the values it returns
through its HTTP API are the trace's values at the recorded moments it scraped."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
from testlib import free_port, wait_http, which_or_skip

pytestmark = pytest.mark.slow


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def test_prometheus_scrapes_replayed_values(tmp_path, h200_trace):
    prometheus = which_or_skip("prometheus")
    agent_port, prom_port = free_port(), free_port()
    agent = subprocess.Popen(
        [sys.executable, "-m", "gpulens.cli.main", "agent", "--backend", f"replay:{h200_trace}", "--speed", "2",
         "--store", str(tmp_path / "agent.db"), "--listen", f"127.0.0.1:{agent_port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    (tmp_path / "prometheus.yml").write_text(
        f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: gpulens\n    static_configs:\n      - targets: ['127.0.0.1:{agent_port}']\n"
    )
    prom = subprocess.Popen(
        [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    api = f"http://127.0.0.1:{prom_port}/api/v1"
    try:
        wait_http(f"http://127.0.0.1:{agent_port}/metrics")
        wait_http(f"http://127.0.0.1:{prom_port}/-/ready")
        t_start = time.time()

        def series(query: str) -> dict[float, float]:
            q = urllib.parse.urlencode({"query": query, "start": t_start, "end": t_end, "step": "1"})
            res = _get(f"{api}/query_range?{q}")["data"]["result"]
            assert len(res) <= 1, res
            return {float(t): float(v) for t, v in res[0]["values"]} if res else {}

        source: dict[float, float] = {}
        deadline = t_start + 40
        while len(source) < 8 and time.time() < deadline:  # wait for eight scrapes, not a fixed time
            time.sleep(1)
            t_end = time.time()
            source = series("gpulens_source_time_seconds")
        assert len(source) >= 8
        by_t = {}
        for line in (h200_trace / "telemetry.jsonl").read_text().splitlines():
            d = json.loads(line)
            by_t[round(d["t"], 3)] = d
        checks = {
            "gpu_power_watts": lambda d: d["power_mw"] / 1000,
            "gpu_utilization_ratio": lambda d: d["gpu_util"] / 100,
            "gpu_memory_used_bytes": lambda d: d["mem_used"],
            "gpu_temperature_celsius": lambda d: d["temp_c"],
        }
        for metric, expected in checks.items():
            got = series(f'{metric}{{model="NVIDIA H200",gpu="0"}}')
            compared = 0
            for t, recorded_t in source.items():
                if t in got:
                    assert got[t] == pytest.approx(expected(by_t[round(recorded_t, 3)]), rel=1e-9), (metric, recorded_t)
                    compared += 1
            assert compared >= 5, metric
        labels = _get(f"{api}/series?match[]=gpu_power_watts")["data"][0]
        assert labels["uuid"].startswith("GPU-5c7ed611") and labels["gpu"] == "0"
    finally:
        prom.terminate()
        agent.terminate()
        prom.wait(10)
        out, err = agent.communicate(timeout=10)
    assert agent.returncode == 0, err  # SIGTERM -> clean stop, store flushed
    assert "stopped after" in err
