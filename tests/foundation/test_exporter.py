"""The Prometheus exposition: valid for promtool, right values, both naming schemes."""

from __future__ import annotations

import subprocess
import time

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from testlib import which_or_skip

from gpulens import FakeBackend, Store
from gpulens.export.prometheus import LatestReadings, make_registry


def _exposition(metric_names="gpulens", store=None, faults=True) -> tuple[str, list]:
    fake = FakeBackend(gpus=2, clock=lambda: 1000.0)
    fake.add_process(0, 4242, "python train.py", 8 * 2**30)
    if faults:
        fake.throttle(1, "hw_thermal")
        fake.inject_xid(1, 79)
    readings = LatestReadings(host="node-a")
    samples = fake.sample()
    readings.update(samples)
    for ev in fake.drain_xid_events():
        readings.add_xid(ev.gpu, ev.xid)
    text = generate_latest(make_registry(readings, metric_names=metric_names, store=store)).decode()
    return text, samples


def _promtool_check(text: str) -> subprocess.CompletedProcess:
    promtool = which_or_skip("promtool")
    return subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)


def test_promtool_accepts_the_exposition():
    text, _ = _exposition("gpulens")
    result = _promtool_check(text)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == "", result.stdout + result.stderr


def test_dcgm_exposition_differs_from_promtool_only_in_dcgm_exporters_own_label_names():
    # dcgm-exporter labels series UUID / modelName / Hostname; keeping them is the point of --metric-names dcgm
    text, _ = _exposition("dcgm")
    result = _promtool_check(text)
    problems = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert problems, "expected promtool to note the camelCase labels"
    assert all("label names should be written in 'snake_case'" in p for p in problems), problems


def test_values_and_labels_match_the_samples():
    text, samples = _exposition()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    power = {s.labels["gpu"]: s.value for s in fams["gpu_power_watts"].samples}
    assert power == {"0": pytest.approx(samples[0].power_watts), "1": pytest.approx(samples[1].power_watts)}
    mem = fams["gpu_memory_used_bytes"].samples[0]
    assert set(mem.labels) == {"gpu", "uuid", "model", "host"} and mem.labels["host"] == "node-a"
    xid = [s for s in fams["gpu_xid_errors"].samples if s.name == "gpu_xid_errors_total"]
    assert [(s.labels["gpu"], s.labels["xid"], s.value) for s in xid] == [("1", "79", 1.0)]
    thermal = {s.labels["gpu"]: s.value for s in fams["gpu_clock_event_active"].samples if s.labels["reason"] == "hw_thermal"}
    assert thermal == {"0": 0.0, "1": 1.0}
    procs = fams["gpu_process_memory_bytes"].samples
    assert [(s.labels["pid"], s.labels["process"], s.value) for s in procs] == [("4242", "python train.py", 8 * 2**30)]


def test_dcgm_names_and_units():
    text, samples = _exposition("dcgm")
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    util = {s.labels["gpu"]: s.value for s in fams["DCGM_FI_DEV_GPU_UTIL"].samples}
    assert util["0"] == pytest.approx(samples[0].utilization_gpu_ratio * 100)
    fb = fams["DCGM_FI_DEV_FB_USED"].samples[0]
    assert fb.value == pytest.approx(samples[0].memory_used_bytes / 2**20)
    assert set(fb.labels) == {"gpu", "UUID", "modelName", "Hostname"}
    assert {s.labels["gpu"]: s.value for s in fams["DCGM_FI_DEV_XID_ERRORS"].samples} == {"0": 0.0, "1": 79.0}
    assert fams["DCGM_FI_DEV_SM_CLOCK"].samples[0].value == pytest.approx(samples[0].sm_clock_hz / 1e6)


def test_workload_series_from_the_store_are_exported_while_fresh(tmp_path):
    with Store(tmp_path / "s.db") as st:
        now = time.time()
        st.write("train_step_seconds", {"train_job": "llama", "rank": "0"}, now, 0.25)
        st.write("infer_requests_total", {"service": "chat", "status": "ok"}, now, 12)
        st.write("train_step_seconds", {"train_job": "old", "rank": "0"}, now - 3600, 9.0)
        st.flush()
        text, _ = _exposition(store=st, faults=False)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    steps = {s.labels["train_job"]: s.value for s in fams["train_step_seconds"].samples}
    assert steps == {"llama": 0.25}
    assert fams["infer_requests"].type == "counter"
    assert _promtool_check(text).returncode == 0
