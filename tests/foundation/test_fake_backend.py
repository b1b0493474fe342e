"""The fake backend: scriptable values and every injectable fault."""

from __future__ import annotations

import pytest

from gpulens import BadInputError, FakeBackend
from gpulens.gpu.fake import parse_fake_spec, schedule_fault
from gpulens.gpu.metrics import sample_values


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_n_gpus_with_plausible_values():
    fake = FakeBackend(gpus=4, clock=Clock())
    samples = fake.sample()
    assert [s.gpu for s in samples] == [0, 1, 2, 3]
    for s in samples:
        assert 0 <= s.utilization_gpu_ratio <= 1
        assert 0 < s.memory_used_bytes < s.memory_total_bytes
        assert s.temperature_celsius < s.temperature_slowdown_celsius
        assert s.power_watts <= s.power_limit_watts
    assert len({s.uuid for s in samples}) == 4


def test_energy_is_cumulative():
    clock = Clock()
    fake = FakeBackend(gpus=1, clock=clock)
    first = fake.sample()[0].energy_joules
    clock.t += 10
    second = fake.sample()[0].energy_joules
    assert second > first
    assert second - first == pytest.approx(10 * fake.sample()[0].power_watts, rel=0.5)


def test_pinned_values_and_unpin():
    fake = FakeBackend(gpus=2, clock=Clock())
    fake.set(1, temperature_celsius=86.0)
    assert fake.sample()[1].temperature_celsius == 86.0
    fake.set(1, temperature_celsius=None)
    assert fake.sample()[1].temperature_celsius != 86.0


def test_xid_injection_is_drained_once():
    fake = FakeBackend(gpus=2, clock=Clock(5.0))
    fake.inject_xid(1, 79)
    events = fake.drain_xid_events()
    assert [(e.gpu, e.xid, e.t) for e in events] == [(1, 79, 5.0)]
    assert fake.drain_xid_events() == []


def test_ecc_and_remapping_faults():
    fake = FakeBackend(gpus=1, clock=Clock())
    fake.add_ecc(0, corrected=3, uncorrected=1)
    fake.fail_remapping(0)
    s = fake.sample()[0]
    assert s.ecc_corrected_volatile_total == 3 and s.ecc_uncorrected_volatile_total == 1
    assert s.remapped_rows_failure is True and s.remapped_rows_uncorrectable == 1
    fake.clear(0)
    assert fake.sample()[0].remapped_rows_failure is False


def test_throttle_sets_reason_and_cuts_clock():
    fake = FakeBackend(gpus=1, clock=Clock())
    normal = fake.sample()[0].sm_clock_hz
    fake.throttle(0, "hw_thermal", "hw_power_brake")
    s = fake.sample()[0]
    assert s.clock_event_mask & 0x40 and s.clock_event_mask & 0x80
    assert s.sm_clock_hz < normal
    active = {e["reason"] for name, e, v in sample_values(s) if name == "gpu_clock_event_active" and v == 1.0}
    assert {"hw_thermal", "hw_power_brake"} <= active


def test_lost_gpu_reports_lost_and_others_continue():
    fake = FakeBackend(gpus=2, clock=Clock())
    fake.lose(0)
    a, b = fake.sample()
    assert a.lost and a.power_watts is None
    assert not b.lost and b.power_watts is not None
    assert list(sample_values(a)) == [("gpu_up", {}, 0.0)]


def test_unsupported_fields_become_missing():
    fake = FakeBackend(gpus=1, clock=Clock())
    fake.unsupported(0, "power_watts", "energy_joules")
    s = fake.sample()[0]
    assert s.power_watts is None and s.energy_joules is None
    assert s.errors["power_watts"] == "NVML_ERROR_NOT_SUPPORTED"
    names = {n for n, _, _ in sample_values(s)}
    assert "gpu_power_watts" not in names and "gpu_temperature_celsius" in names


def test_scheduled_fault_specs():
    clock = Clock(0.0)
    fake = FakeBackend(gpus=2, clock=clock)
    schedule_fault(fake, "xid:79@2s:gpu=1")
    schedule_fault(fake, "throttle:hw_slowdown@1s")
    schedule_fault(fake, "ecc:uncorrected=2@1s")
    schedule_fault(fake, "lost@3s:gpu=0")
    schedule_fault(fake, "throttle:sw_power_cap")  # no "@": at once
    fake.sample()
    assert fake.drain_xid_events() == []
    clock.t = 1.0
    s0 = fake.sample()[0]
    assert s0.clock_event_mask & 0x8 and s0.ecc_uncorrected_volatile_total == 2
    clock.t = 2.0
    fake.sample()
    assert [e.xid for e in fake.drain_xid_events()] == [79]
    clock.t = 3.0
    assert fake.sample()[0].lost


@pytest.mark.parametrize("spec", ["xid:abc@1s", "bogus@1s", "throttle:warp@1s", "xid:79@1s:gpu=7", "xid:79@-1s", "ecc:sideways=1@1s",
                                  "xid:79@", "xid:79@:gpu=1"])
def test_bad_fault_specs_are_clear_errors(spec):
    with pytest.raises(BadInputError):
        schedule_fault(FakeBackend(gpus=2, clock=Clock()), spec)


def test_fake_spec_parsing():
    assert parse_fake_spec("fake") == 1
    assert parse_fake_spec("fake:8") == 8
    with pytest.raises(BadInputError):
        parse_fake_spec("fake:zero")
    with pytest.raises(BadInputError):
        parse_fake_spec("fake:0")
