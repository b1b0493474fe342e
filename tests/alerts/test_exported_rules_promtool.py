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
