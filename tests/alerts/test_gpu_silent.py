"""GpuSilent pages on a GPU that stops sending samples (it fell off the bus: no `gpu_up == 0`
either), in the agent's own rule engine and in the exported Prometheus rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from gpulens.alerts.export import export_prometheus
from gpulens.alerts.expr import is_staleness, parse_expr
from gpulens.alerts.rules import load_rules


def test_the_pack_rule_fires_a_minute_into_the_silence_and_resolves_when_the_gpu_is_back(rig):
    rig.run_until(lambda: False, 120)
    assert not rig.firing("GpuSilent"), "a GPU that samples is not silent"
    last_sample = rig.t
    rig.fake.silence(0)
    fired_at = rig.run_until(lambda: bool(rig.firing("GpuSilent")), 60 + 3 * rig.interval)
    assert fired_at is not None and last_sample + 60 <= fired_at <= last_sample + 60 + rig.interval
    (a,) = rig.firing("GpuSilent")
    assert a.severity == "critical" and a.labels["gpu"] == "0" and a.labels["host"] == "node1"
    rig.fake.clear(0)
    assert rig.run_until(lambda: not rig.firing("GpuSilent"), 2 * rig.interval) is not None


def test_a_lost_gpu_that_still_answers_is_gpu_lost_not_silent(rig):
    rig.run_until(lambda: False, 60)
    rig.fake.lose(0)
    rig.run_until(lambda: False, 120)
    assert rig.firing("GpuLost") and not rig.firing("GpuSilent")


def test_staleness_rules_are_recognised_by_their_form():
    assert is_staleness(parse_expr("last_over_time(gpu_up[10m]) unless last_over_time(gpu_up[1m])").root)
    assert not is_staleness(parse_expr("last_over_time(gpu_up[1m]) unless last_over_time(gpu_up[10m])").root)
    assert not is_staleness(parse_expr("last_over_time(gpu_up[10m]) unless last_over_time(gpu_temperature_celsius[1m])").root)
    assert not is_staleness(parse_expr("gpu_up == 0").root)


def test_the_exported_rule_pages_only_while_the_target_answers():
    text = export_prometheus(load_rules()).text
    (rule,) = [r for g in __import__("yaml").safe_load(text)["groups"] for r in g["rules"] if r.get("alert") == "GpuSilent"]
    assert rule["expr"] == "(last_over_time(gpu_up[10m]) unless last_over_time(gpu_up[1m])) and on (instance, job) (up == 1)"
    assert rule["labels"]["severity"] == "critical"


def test_a_live_fake_agent_pages_on_a_gpu_silent_after_xid_79(tmp_path):
    """The agent itself: XID 79 then silence on GPU 1 of two; the pack's rule with windows scaled
    to a 100 ms interval (a rule of the same name replaces the pack's) pages for GPU 1 only."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "rules:\n"
        "  - name: GpuSilent\n"
        "    expr: last_over_time(gpu_up[30s]) unless last_over_time(gpu_up[1s])\n"
        "    for: 0s\n"
        "    severity: critical\n"
        '    summary: "GPU {{ $labels.gpu }} on {{ $labels.host }} is silent"\n'
        "    advice: Check the GPU.\n", encoding="utf-8")
    out = tmp_path / "alerts.jsonl"
    # the page is due about 1 s after the silence begins (at the next evaluation past 3 s); 10 s of run
    # (it was 6) leaves a loaded machine 6 s to get there
    cmd = [sys.executable, "-m", "gpulens.cli.main", "agent", "--backend", "fake:2", "--store", str(tmp_path / "s.db"),
           "--interval", "100ms", "--duration", "10s", "--listen", "off", "--rules", str(rules), "--notify", f"file:{out}",
           "--fault", "xid:79@2s:gpu=1", "--fault", "silent@2s:gpu=1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={**os.environ, "NO_COLOR": "1"})
    assert r.returncode == 0, r.stderr
    alerts = [json.loads(line) for line in out.read_text().splitlines()]
    silent = [a for a in alerts if "GpuSilent" in json.dumps(a) and a.get("state", "firing") == "firing"]
    assert silent and all(json.dumps(a).count('"gpu": "1"') for a in silent), alerts
    assert not [a for a in silent if '"gpu": "0"' in json.dumps(a)]
    assert any("GpuXid" in json.dumps(a) for a in alerts)


def test_a_replay_pages_on_a_gpu_that_goes_silent_after_xid_79(tmp_path):
    """Issue 23: the silence after XID 79 is reported by an alert in replay too, not only live. A
    recording of two GPUs where GPU 1 reports XID 79 and then sends nothing (the truth suite's case, read in place)."""
    from pathlib import Path

    from gpulens.cli.main import main

    trace = Path(__file__).resolve().parents[1] / "truth" / "cases" / "xid79_gpu_silent"
    db = tmp_path / "s.db"
    assert main(["replay", str(trace), "--store", str(db)]) == 0
    done = subprocess.run([sys.executable, "-m", "gpulens", "alerts", "list", "--store", str(db), "--format", "json"],
                          capture_output=True, text=True, timeout=60, env={**os.environ})
    assert done.returncode == 0, done.stderr
    firing = {(a["rule"], a["labels"].get("gpu")) for a in json.loads(done.stdout)}
    assert ("GpuSilent", "1") in firing and ("GpuXid", "1") in firing
    assert ("GpuSilent", "0") not in firing
