"""The fleet path for the scaling signal: a real Prometheus scrapes a real `gpulens agent` replaying
the H200 session's serving phases (then 30 s idle) and evaluates the exported recording rule; its
answer is `gpulens scale`'s on the agent's own store: two replicas soon after the overload starts,
one again after the stabilization window. About 90 s of wall time, mostly waiting."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from testlib import free_port, wait_http, which_or_skip

from gpulens.data import bundled_trace
from gpulens.scaling import ScalePolicy, desired_replicas
from gpulens.scaling.promql import DESIRED_RULE, recording_rules
from gpulens.store import Store
from gpulens.workload.importers import event_time

WINDOW, STABILIZATION, IDLE_AFTER = 10.0, 10.0, 30.0


def _serving_part(dst: Path) -> Path:
    """The bundled trace from 2 s before the online phase, and 30 s of idle telemetry after its end."""
    src = bundled_trace()
    dst.mkdir()
    events = [json.loads(line) for line in (src / "events.jsonl").open()]
    cut = next(e["t"] for e in events if e.get("kind") == "phase" and e["name"] == "infer_online") - 2.0
    for f in src.iterdir():
        if f.is_file() and f.name not in ("telemetry.jsonl", "events.jsonl"):
            shutil.copy(f, dst / f.name)
    tele = [json.loads(line) for line in (src / "telemetry.jsonl").open()]
    tele = [x for x in tele if x["t"] >= cut]
    last = tele[-1]
    tele += [{**last, "t": last["t"] + k, "gpu_util": 0, "phase": "idle_end"} for k in range(1, int(IDLE_AFTER) + 1)]
    (dst / "telemetry.jsonl").write_text("".join(json.dumps(x) + "\n" for x in tele))
    (dst / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events if (event_time(e) or 0) >= cut))
    return dst


@pytest.mark.slow
def test_prometheus_and_gpulens_scale_agree_on_the_replayed_overload(tmp_path: Path) -> None:
    prometheus = which_or_skip("prometheus")
    trace = _serving_part(tmp_path / "trace")
    policy = ScalePolicy(stabilization_seconds=STABILIZATION)
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "gpulens-scaling", "rules": recording_rules(window_seconds=WINDOW, policy=policy)}]}))
    agent_port, prom_port = free_port(), free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files: ['{rules}']\n"
        f"scrape_configs:\n  - job_name: gpulens\n    static_configs:\n      - targets: ['127.0.0.1:{agent_port}']\n")
    store = tmp_path / "node.db"
    Store(store).close()
    procs = []
    try:
        prom = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(prom)
        wait_http(f"http://127.0.0.1:{prom_port}/-/ready", prom)
        agent = subprocess.Popen([sys.executable, "-m", "gpulens.cli.main", "agent", "--backend", f"replay:{trace}", "--speed", "1",
                                  "--listen", f"127.0.0.1:{agent_port}", "--store", str(store)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        procs.append(agent)
        wait_http(f"http://127.0.0.1:{agent_port}/metrics", agent)
        start = time.time()
        agent.wait(timeout=180)  # the replay's end (the agent stops there)
        end = time.time()
    finally:
        for p in procs[1:]:
            if p.poll() is None:
                p.terminate()
    try:
        q = urllib.parse.urlencode({"query": DESIRED_RULE, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "1"})
        with urllib.request.urlopen(f"http://127.0.0.1:{prom_port}/api/v1/query_range?{q}", timeout=10) as r:
            body = json.loads(r.read())
    finally:
        prom.terminate()
        prom.wait(10)
    (series,) = body["data"]["result"]
    assert series["metric"]["service"] == "h200-demo"
    prom_pts = [(float(t), int(float(v))) for t, v in series["values"]]
    with Store(store, readonly=True) as st:
        (overload,) = [e.t for e in st.events("phase") if e.data.get("name") == "infer_overload"]
        ours = desired_replicas(st, window_seconds=WINDOW, step_seconds=1.0, policy=policy, start=start, end=end)
    # The same answer: one replica before the overload, two soon after it starts, one again at the end.
    for pts in ([(p.t, p.desired_replicas) for p in ours], prom_pts):
        assert all(n == 1 for t, n in pts if t < overload), pts
        up = [t for t, n in pts if n >= 2]
        assert up and overload <= up[0] <= overload + 30.0, (overload, pts)
        assert max(n for _, n in pts) == 2 and pts[-1][1] == 1, pts
    first_ours = min(p.t for p in ours if p.desired_replicas >= 2)
    first_prom = min(t for t, n in prom_pts if n >= 2)
    assert abs(first_prom - first_ours) <= WINDOW  # scrape and rule evaluation delays, rate()'s extrapolation
