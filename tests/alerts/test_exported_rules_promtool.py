"""The exported Prometheus rules, evaluated by Prometheus's own rule engine (`promtool test rules`)
over recorded counter series at a 1 s evaluation interval: a counter that steps once keeps its alert
firing for the whole window, whether the step creates the series or raises an existing one."""

from __future__ import annotations

import subprocess

import yaml
from testlib import which_or_skip

from gpulens.cli.main import main

GPU = {"gpu": "1", "uuid": "GPU-1", "model": "NVIDIA H200", "host": "node-a"}


def _labels(d: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(d.items())) + "}"


def _rules_without_annotations(tmp_path, monkeypatch) -> str:
    monkeypatch.chdir(tmp_path)  # no .gpulens/gpulens.db here: the built-in packs alone
    out = tmp_path / "rules.yml"
    assert main(["alerts", "export", "--format", "prometheus", "--out", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)  # templates are not under test here; the expressions are
    out.write_text(yaml.safe_dump(doc))
    return str(out)


def test_one_xid_and_one_ecc_step_keep_firing_for_the_whole_window(tmp_path, monkeypatch):
    promtool = which_or_skip("promtool")
    rules = _rules_without_annotations(tmp_path, monkeypatch)
    xid = {**GPU, "xid": "79"}
    ecc = {**GPU, "gpu": "0", "uuid": "GPU-0"}
    firing_xid = [{"exp_labels": {**xid, "severity": "critical", "source": "gpulens"}}]
    firing_ecc = [{"exp_labels": {**ecc, "severity": "critical", "source": "gpulens"}}]
    checks = []
    for t in ("6s", "66s", "300s", "599s"):  # the XID series appears (value 1) at 5 s
        checks.append({"eval_time": t, "alertname": "GpuXid", "exp_alerts": firing_xid})
    checks.append({"eval_time": "4s", "alertname": "GpuXid", "exp_alerts": []})
    checks.append({"eval_time": "610s", "alertname": "GpuXid", "exp_alerts": []})  # the 10-minute window has passed
    for t in ("11s", "71s", "599s"):  # the ECC counter, there from the start, steps 0 -> 2 at 10 s
        checks.append({"eval_time": t, "alertname": "GpuEccUncorrectable", "exp_alerts": firing_ecc})
    checks.append({"eval_time": "9s", "alertname": "GpuEccUncorrectable", "exp_alerts": []})
    checks.append({"eval_time": "615s", "alertname": "GpuEccUncorrectable", "exp_alerts": []})
    test = {
        "rule_files": [rules],
        "evaluation_interval": "1s",
        "tests": [{
            "interval": "1s",
            "input_series": [
                {"series": "gpu_xid_errors_total" + _labels(xid), "values": "_x5 1x700"},
                {"series": "gpu_ecc_uncorrected_volatile_total" + _labels(ecc), "values": "0x10 2x700"},
            ],
            "alert_rule_test": checks,
        }],
    }
    path = tmp_path / "test.yml"
    path.write_text(yaml.safe_dump(test))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rules_over_per_event_series_read_the_exported_histograms(tmp_path, monkeypatch):
    """A rule on request latency (per event in the store) is exported over the histogram the agent
    serves, so it fires on Prometheus too: p99 from the buckets, per series."""
    promtool = which_or_skip("promtool")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yml").write_text(
        "rules:\n  - name: P99AboveSlo\n    expr: quantile_over_time(0.99, infer_request_latency_seconds[5m]) > 2.0\n"
        "    for: 0s\n    severity: critical\n    summary: p99 above 2 s\n"
        "  - name: StepMeanHigh\n    expr: avg_over_time(train_step_seconds[2m]) > 1.0\n    for: 0s\n    severity: warning\n"
        "    summary: slow steps\n"
    )
    out = tmp_path / "rules.yml"
    assert main(["alerts", "export", "--format", "prometheus", "--rules", str(tmp_path / "mine.yml"), "--out", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    mine = {r["alert"]: r for g in doc["groups"] for r in g["rules"] if r.get("alert") in ("P99AboveSlo", "StepMeanHigh")}
    assert "histogram_quantile(0.99, rate(infer_request_latency_seconds_bucket[5m]))" in mine["P99AboveSlo"]["expr"]
    assert "rate(train_step_seconds_sum[2m]) / rate(train_step_seconds_count[2m])" in mine["StepMeanHigh"]["expr"]
    for r in mine.values():
        r.pop("annotations", None)
    (tmp_path / "only.yml").write_text(yaml.safe_dump({"groups": [{"name": "t", "rules": list(mine.values())}]}))
    svc = {"service": "chat", "host": "h"}
    # 10 requests/s: all under 0.5 s for the first 5 minutes, then 5 % of them at 3-4 s
    series = []
    for le, fast, slow in (("0.5", 10, 9.5), ("1.0", 10, 9.5), ("2.0", 10, 9.5), ("4.0", 10, 10), ("+Inf", 10, 10)):
        series.append({"series": "infer_request_latency_seconds_bucket" + _labels({**svc, "le": le}),
                       "values": f"0+{fast}x300 {fast * 300}+{slow}x600"})
    job = {"train_job": "j", "rank": "0", "host": "h"}
    series.append({"series": "train_step_seconds_sum" + _labels(job), "values": "0+0.5x300 150+2x300"})  # 0.5 s, then 2 s steps
    series.append({"series": "train_step_seconds_count" + _labels(job), "values": "0+1x600"})
    test = {"rule_files": [str(tmp_path / "only.yml")], "evaluation_interval": "1s", "tests": [{
        "interval": "1s", "input_series": series,
        "alert_rule_test": [
            {"eval_time": "290s", "alertname": "P99AboveSlo", "exp_alerts": []},
            {"eval_time": "620s", "alertname": "P99AboveSlo", "exp_alerts": [{"exp_labels": {**svc, "severity": "critical", "source": "gpulens"}}]},
            {"eval_time": "290s", "alertname": "StepMeanHigh", "exp_alerts": []},
            {"eval_time": "500s", "alertname": "StepMeanHigh", "exp_alerts": [{"exp_labels": {**job, "severity": "warning", "source": "gpulens"}}]},
        ],
    }]}
    path = tmp_path / "test.yml"
    path.write_text(yaml.safe_dump(test))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
