"""The Prometheus exposition: valid for promtool, right values, both naming schemes."""

from __future__ import annotations

import subprocess
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from testlib import which_or_skip

from gpulens import FakeBackend, Store
from gpulens.exporter.exposition import render_text
from gpulens.exporter.prometheus import LatestReadings, make_registry


def _exposition(metric_names="gpulens", store=None, faults=True) -> tuple[str, list]:
    fake = FakeBackend(gpus=2, clock=lambda: 1000.0)
    fake.add_process(0, 4242, "python train.py", 8 * 2**30)
    if faults:
        fake.throttle(1, "hw_thermal")
        fake.inject_xid(1, 79)
    readings = LatestReadings(host="node-a", gpus=fake.gpus())
    samples = fake.sample()
    readings.update(samples)
    for ev in fake.drain_xid_events():
        readings.add_xid(ev.gpu, ev.xid)
    text = render_text(make_registry(readings, metric_names=metric_names, store=store)).decode()
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
    # ... and that DCGM's counters keep their own names (no `_total`, DCGM_FI_DEV_PCIE_REPLAY_COUNTER):
    # they are typed counter all the same
    lint = ("label names should be written in 'snake_case'", 'counter metrics should have "_total" suffix',
            "metric name should not include type 'counter'")
    # gpu_up and the XID counter carry dcgm's labels too (so on(UUID) joins work): only their camelCase is noted
    own = ("gpu_up ", "gpu_xid_errors_total ")
    assert all((p.startswith("DCGM_") and any(x in p for x in lint)) or (p.startswith(own) and lint[0] in p) for p in problems), problems
    types = {line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE")}
    assert types["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
    assert types["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] == types["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == "counter"
    assert types["gpu_up"] == "gauge" and types["gpu_xid_errors_total"] == "counter"  # gpulens's own, kept


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
    # dcgm-exporter's labels, the host under one spelling (`Hostname`, as its releases write it)
    dcgm = {"gpu": "0", "UUID": samples[0].uuid, "modelName": "NVIDIA H200", "Hostname": "node-a",
            "pci_bus_id": "00000000:01:00.0", "device": "nvidia0", "DCGM_FI_DRIVER_VERSION": "580.159.04"}
    assert fb.labels == dcgm
    # gpu_up and the XID counter keep gpulens's names but carry the same labels, so on(UUID) joins them
    assert next(s for s in fams["gpu_up"].samples if s.labels["gpu"] == "0").labels == dcgm
    xid = next(s for s in fams["gpu_xid_errors"].samples if s.name == "gpu_xid_errors_total")
    assert xid.labels == {**dcgm, "gpu": "1", "UUID": samples[1].uuid, "pci_bus_id": "00000000:02:00.0", "device": "nvidia1",
                          "xid": "79"} and xid.value == 1
    assert {s.labels["gpu"]: s.value for s in fams["DCGM_FI_DEV_XID_ERRORS"].samples} == {"0": 0.0, "1": 79.0}
    assert fams["DCGM_FI_DEV_SM_CLOCK"].samples[0].value == pytest.approx(samples[0].sm_clock_hz / 1e6)


def test_workload_gauges_are_exported_while_fresh(tmp_path):
    with Store(tmp_path / "s.db") as st:
        now = time.time()
        st.write("train_tokens_per_second", {"train_job": "llama", "rank": "0"}, now, 8000.0)
        st.write("train_tokens_per_second", {"train_job": "old", "rank": "0"}, now - 3600, 9.0)
        st.flush()
        text, _ = _exposition(store=st, faults=False)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert {s.labels["train_job"]: s.value for s in fams["train_tokens_per_second"].samples} == {"llama": 8000.0}
    assert _promtool_check(text).returncode == 0


def test_distributions_are_histograms_of_every_sample_and_requests_a_counter(tmp_path):
    """The p99 over Prometheus must describe every request, not the one that was latest at a scrape."""
    steps = [0.05, 0.12, 0.12, 0.3, 2.0, 400.0]  # one past the last bucket: counted in +Inf only
    with Store(tmp_path / "s.db") as st:
        now = time.time()
        for i, v in enumerate(steps):
            st.write("train_step_seconds", {"train_job": "llama", "rank": "0"}, now - 3600 + i, v)  # old samples count too
        for i in range(5):
            st.write("infer_requests_total", {"service": "chat", "status": "ok"}, now + i, float(i + 1))  # one sample per request
        st.write("infer_request_latency_seconds", {"service": "chat", "source": "vllm", "quantile": "0.99"}, now, 9.0)  # an engine's: not ours
        st.flush()
        text, _ = _exposition(store=st, faults=False)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    fam = fams["train_step_seconds"]
    assert fam.type == "histogram"
    buckets = {s.labels["le"]: s.value for s in fam.samples if s.name.endswith("_bucket")}
    assert buckets["0.1"] == 1 and buckets["0.125"] == 3 and buckets["0.3"] == 4 and buckets["2.0"] == 5 and buckets["+Inf"] == 6
    total = {s.name: s.value for s in fam.samples if not s.name.endswith("_bucket")}
    assert total["train_step_seconds_count"] == 6 and total["train_step_seconds_sum"] == pytest.approx(sum(steps))
    assert "infer_request_latency_seconds" not in fams  # scraped percentiles are not re-exported as ours
    assert fams["infer_requests"].type == "counter"
    # every documented status, 0 until it happens, so rate(...{status="error"}) is 0, not empty
    assert {s.labels["status"]: s.value for s in fams["infer_requests"].samples} == {
        "ok": 5.0, "error": 0.0, "timeout": 0.0, "rejected": 0.0, "aborted": 0.0}
    assert _promtool_check(text).returncode == 0


def test_no_exported_label_is_a_scrape_target_label(tmp_path):
    with Store(tmp_path / "s.db") as st:
        st.write("train_tokens_per_second", {"job": "legacy", "instance": "x"}, time.time(), 1.0)
        st.flush()
        text, _ = _exposition(store=st, faults=False)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            assert not {"job", "instance"} & set(s.labels), (fam.name, s.labels)
