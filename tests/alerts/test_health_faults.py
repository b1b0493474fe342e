"""Each GPU health condition, injected through the fake backend, raises its alert within one
evaluation interval after its `for` duration, and resolves once the condition clears."""

from __future__ import annotations

import pytest

from gpulens.gpu.fake import H200_LIKE

TOTAL = H200_LIKE["memory_total_bytes"]

# (id, rule, for seconds, inject(fake), clear(fake) or None for counters, seconds a counter rule stays up)
CASES = [
    ("xid79", "GpuXid", 0, lambda f: f.inject_xid(0, 79), None, 600),
    ("ecc-uncorrected", "GpuEccUncorrectable", 0, lambda f: f.add_ecc(0, uncorrected=1), None, 600),
    ("ecc-corrected-rate", "GpuEccCorrectedRateHigh", 0, lambda f: f.add_ecc(0, corrected=25), None, 600),
    ("remap-pending", "GpuRemappedRowsPending", 0, lambda f: f.fail_remapping(0, pending=True), lambda f: f.clear(0), 0),
    ("remap-failure", "GpuRemappedRowsFailure", 0, lambda f: f.fail_remapping(0), lambda f: f.clear(0), 0),
    ("temperature", "GpuTemperatureNearSlowdown", 60, lambda f: f.set(0, temperature_celsius=86.0), lambda f: f.set(0, temperature_celsius=None), 0),
    # past the fake's 89 °C slowdown: its own rule, and not "within 5 °C of" (the near rule must stay quiet)
    ("temperature-above", "GpuTemperatureAboveSlowdown", 60, lambda f: f.set(0, temperature_celsius=93.0), lambda f: f.set(0, temperature_celsius=None), 0),
    ("hw-thermal", "GpuClockSlowdown", 60, lambda f: f.throttle(0, "hw_thermal"), lambda f: f.clear(0), 0),
    ("power-brake", "GpuClockSlowdown", 60, lambda f: f.throttle(0, "hw_power_brake"), lambda f: f.clear(0), 0),
    ("hw-slowdown", "GpuClockSlowdown", 60, lambda f: f.throttle(0, "hw_slowdown"), lambda f: f.clear(0), 0),
    ("gpu-lost", "GpuLost", 0, lambda f: f.lose(0), lambda f: f.clear(0), 0),
    ("memory", "GpuMemoryAlmostFull", 60, lambda f: f.set(0, memory_used_bytes=0.97 * TOTAL), lambda f: f.set(0, memory_used_bytes=None), 0),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_condition_fires_after_for_and_resolves(rig, case):
    _, rule, for_s, inject, clear, hold_s = case
    # A healthy minute first: nothing may fire on a healthy fake GPU.
    rig.run_until(lambda: False, 60)
    assert not [a for a in rig.log[-1][1] if a.state == "firing"], "alerts on a healthy GPU"

    inject(rig.fake)
    injected_at = rig.t + rig.interval  # the next sample is the first that shows the fault
    fired_at = rig.run_until(lambda: bool(rig.firing(rule)), for_s + 3 * rig.interval)
    assert fired_at is not None, f"{rule} did not fire"
    assert injected_at + for_s <= fired_at <= injected_at + for_s + rig.interval
    others = {a.rule for a in rig.log[-1][1] if a.state == "firing"} - {rule}
    assert not others - {"GpuLost"}, f"unrelated alerts fired: {others}"

    if clear is not None:
        clear(rig.fake)
        cleared_at = rig.t + rig.interval
    else:
        cleared_at = rig.t  # a counter stops rising: the window has to pass
    resolved_at = rig.run_until(lambda: not rig.firing(rule), hold_s + 3 * rig.interval)
    assert resolved_at is not None, f"{rule} did not resolve"
    assert resolved_at <= cleared_at + hold_s + rig.interval
    resolved = [a for a in rig.log[-1][1] if a.rule == rule]
    assert resolved and resolved[0].state == "resolved" and resolved[0].resolved_at == resolved_at


def test_xid_severity_and_action_come_from_the_catalog(rig):
    rig.tick()
    rig.fake.inject_xid(0, 79)
    rig.fake.inject_xid(0, 13)
    rig.tick()
    by_xid = {a.labels["xid"]: a for a in rig.firing("GpuXid")}
    assert set(by_xid) == {"79", "13"}
    assert by_xid["79"].severity == "critical" and "reboot" in by_xid["79"].advice.lower()
    assert by_xid["79"].labels["severity"] == "critical"
    assert by_xid["13"].severity == "warning"
    assert by_xid["79"].annotations["meaning"] == "GPU has fallen off the bus"
    assert by_xid["79"].labels["gpu"] == "0" and by_xid["79"].labels["host"] == "node1"


def test_a_firing_alert_is_not_notified_twice(rig, store, tmp_path):
    from gpulens.alerts.runtime import AlertRuntime

    rig.rt.close()
    out = tmp_path / "alerts.jsonl"
    rig.rt = AlertRuntime(store, learn_seconds=3600, packs=("gpu_health",), notify=[f"file:{out}"])
    rig.tick()
    rig.fake.lose(0)
    for _ in range(5):
        rig.tick()
    lines = out.read_text().splitlines()
    assert len(lines) == 1 and '"GpuLost"' in lines[0]
    # A restarted runtime picks the open alert up from the store: still no second notification.
    rig.rt.close()
    rig.rt = AlertRuntime(store, learn_seconds=3600, packs=("gpu_health",), notify=[f"file:{out}"])
    rig.tick()
    assert rig.firing("GpuLost") and len(out.read_text().splitlines()) == 1
    rig.fake.clear(0)
    rig.tick()
    lines = out.read_text().splitlines()
    assert len(lines) == 2 and '"resolved"' in lines[1]
