"""NvmlBackend against the recorded answers of a real H200 (see nvml_standin.py), and against the real
library on this machine (no driver: a clear error). Runs on a real GPU too, marked `gpu`."""

from __future__ import annotations

import logging

import pytest
from nvml_standin import ProbeNvml
from testlib import wait_until

from gpulens import BackendUnavailableError
from gpulens.gpu import nvidia_driver_present
from gpulens.gpu.nvml import NvmlBackend


@pytest.fixture
def nvml(monkeypatch, h200_trace):
    stand_in = ProbeNvml(h200_trace / "nvml_probe.json", gpus=2)
    stand_in.install(monkeypatch)
    return stand_in


def test_readings_in_base_units(nvml):
    be = NvmlBackend(clock=lambda: 100.0)
    try:
        info = be.gpus()[0]
        assert info.name == "NVIDIA H200" and info.temperature_slowdown_celsius == 89 and info.power_limit_watts == 700
        s = be.sample()[0]
        p = nvml.probe
        assert s.t == 100.0 and not s.lost
        assert s.power_watts == pytest.approx(p["power_usage_mw"]["value"] / 1000)
        assert s.energy_joules == pytest.approx(p["total_energy_mj"]["value"] / 1000)
        assert s.utilization_gpu_ratio == pytest.approx(p["utilization"]["value"]["gpu"] / 100)
        assert s.memory_used_bytes == p["memory_info"]["value"]["used"]
        assert s.sm_clock_hz == 1980e6 and s.memory_clock_max_hz == 3201e6
        assert s.pcie_tx_bytes_per_second == p["pcie_tx_kbs"]["value"] * 1024
        assert s.ecc_uncorrected_volatile_total == 0 and s.remapped_rows_failure is False
        assert s.clock_event_mask == 0 and s.performance_state == 0 and s.mig_mode is False
        assert [(q.pid, q.name) for q in s.processes] == [(4242, "python")]
    finally:
        be.close()


def test_dcgm_parity_fields_read_from_nvml(nvml):
    """The fields added for dcgm-exporter parity, from the H200's answers; what it did not answer is None."""
    be = NvmlBackend(watch_xid=False)
    try:
        p = nvml.probe
        info = be.gpus()[0]
        assert info.driver_version == p["driver"]["value"] and info.pci_bus_id == p["pci_info"]["value"]["busId"]
        s = be.sample()[0]
        assert s.utilization_encoder_ratio == p["encoder_util"]["value"][0] / 100
        assert s.utilization_decoder_ratio == p["decoder_util"]["value"][0] / 100
        assert s.memory_free_bytes == p["memory_info"]["value"]["free"]
        assert s.pcie_replay_total == p["pcie_replay_counter"]["value"]
        # not probed on that H200 (field values) or not there (NVLink on a lone GPU): absent, not zero
        assert s.memory_temperature_celsius is None and s.nvlink_bytes_total is None
        assert s.mig_instances is None
        s = be.sample()[0]
        assert s.graphics_active_ratio == pytest.approx(p["gpm_under_load"]["value"]["gpm_graphics_util"] / 100)
    finally:
        be.close()


def test_mig_instances_are_read_per_mig_device(nvml):
    nvml.mig[1] = ["3g.71gb", "1g.18gb"]
    be = NvmlBackend(watch_xid=False)
    try:
        be.sample()
        s0, s1 = be.sample()
        assert s0.mig_instances is None and s0.tensor_active_ratio is not None
        assert s1.mig_mode is True and s1.tensor_active_ratio is None  # in MIG mode: GPM per instance only
        got = [(m.gpu_instance_id, m.profile, m.uuid, m.memory_total_bytes) for m in s1.mig_instances]
        assert got == [(1, "3g.71gb", "MIG-1-0", 71e9), (2, "1g.18gb", "MIG-1-1", 18e9)]
        gpm = nvml.probe["gpm_under_load"]["value"]
        assert s1.mig_instances[1].tensor_active_ratio == pytest.approx(gpm["gpm_any_tensor_util"] / 100)
    finally:
        be.close()


def test_gpm_metrics_arrive_from_the_second_sample(nvml):
    be = NvmlBackend(watch_xid=False)
    try:
        assert be.sample()[0].tensor_active_ratio is None  # GPM is a rate between two samples
        s = be.sample()[0]
        gpm = nvml.probe["gpm_under_load"]["value"]
        assert s.sm_active_ratio == pytest.approx(gpm["gpm_sm_util"] / 100)
        assert s.tensor_active_ratio == pytest.approx(gpm["gpm_any_tensor_util"] / 100)
    finally:
        be.close()


def test_unsupported_field_is_missing_and_logged_once(nvml, caplog):
    nvml.unsupported.add("nvmlDeviceGetPowerUsage")
    be = NvmlBackend(watch_xid=False)
    try:
        with caplog.at_level(logging.INFO, logger="gpulens.gpu.nvml"):
            for _ in range(5):
                samples = be.sample()
        assert all(s.power_watts is None and s.temperature_celsius == 40 for s in samples)
        notes = [r for r in caplog.records if "power unavailable" in r.getMessage()]
        assert len(notes) == 2  # once per GPU, not once per tick
    finally:
        be.close()


def test_a_lost_gpu_is_reported_and_the_others_go_on(nvml, caplog):
    be = NvmlBackend(watch_xid=False)
    try:
        be.sample()
        nvml.lost.add(0)
        calls_before = dict(nvml.calls)
        for _ in range(3):
            a, b = be.sample()
            assert a.lost and not b.lost and b.power_watts is not None
        # once lost, the GPU is not asked again every tick
        assert nvml.calls["nvmlDeviceGetPowerUsage"] - calls_before["nvmlDeviceGetPowerUsage"] == 3
        assert sum("is lost" in r.getMessage() for r in caplog.records) == 1
    finally:
        be.close()


def test_xid_events_come_from_the_event_thread(nvml):
    be = NvmlBackend(clock=lambda: 7.0)
    try:
        nvml.xids.put((1, 79))
        events: list = []
        wait_until(lambda: events.extend(be.drain_xid_events()) or events, 60, "the XID event thread to report")
        assert [(e.gpu, e.xid, e.t) for e in events] == [(1, 79, 7.0)]
        assert events[0].uuid.endswith("1")
    finally:
        be.close()


def test_without_a_driver_the_error_says_what_to_do():
    if nvidia_driver_present():
        pytest.skip("a driver is present")
    with pytest.raises(BackendUnavailableError, match="--backend fake"):
        NvmlBackend()


@pytest.mark.gpu
def test_real_gpu_answers():
    be = NvmlBackend()
    try:
        samples = be.sample()
        assert samples and all(not s.lost for s in samples)
        assert all(s.memory_total_bytes and s.power_watts is not None for s in samples)
    finally:
        be.close()
