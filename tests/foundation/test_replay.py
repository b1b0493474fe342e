"""Replay of the bundled H200 session and of gpulens's own recordings."""

from __future__ import annotations

import io
import json
import shutil

import pytest

from gpulens import FakeBackend, ReplayBackend, TraceError
from gpulens.gpu.record import Recorder
from gpulens.pipeline.ingest import import_trace


def _trace_lines(h200_trace):
    return [json.loads(line) for line in (h200_trace / "telemetry.jsonl").read_text().splitlines() if line.strip()]


def test_every_sample_arrives_with_recorded_values(h200_trace):
    lines = _trace_lines(h200_trace)
    rb = ReplayBackend(h200_trace)
    got = []
    while not rb.exhausted:
        got.extend(rb.sample())
    assert len(got) == len(lines) == 995
    assert rb.skipped_lines == 0
    for s, d in zip(got, lines, strict=True):
        assert s.t == d["t"]
        assert s.utilization_gpu_ratio == pytest.approx(d["gpu_util"] / 100)
        assert s.memory_used_bytes == d["mem_used"]
        assert s.power_watts == pytest.approx(d["power_mw"] / 1000)
        assert s.temperature_celsius == d["temp_c"]
        assert s.sm_clock_hz == pytest.approx(d["sm_mhz"] * 1e6)
        assert s.clock_event_mask == d["clk_reasons"]
        if d.get("gpm_any_tensor_util") is not None:
            assert s.tensor_active_ratio == pytest.approx(d["gpm_any_tensor_util"] / 100)


def test_static_facts_come_from_the_probe(h200_trace):
    info = ReplayBackend(h200_trace).gpus()[0]
    assert info.name == "NVIDIA H200"
    assert info.uuid.startswith("GPU-5c7ed611")
    assert info.temperature_slowdown_celsius == 89
    assert info.power_limit_watts == 700


def test_malformed_lines_are_skipped_and_counted(tmp_path, h200_trace):
    lines = (h200_trace / "telemetry.jsonl").read_text().splitlines()
    broken = lines[:10] + ["{not json", "[1, 2]", '{"no_time": 1}'] + lines[10:20]
    shutil.copy(h200_trace / "nvml_probe.json", tmp_path / "nvml_probe.json")
    (tmp_path / "telemetry.jsonl").write_text("\n".join(broken) + "\n")
    rb = ReplayBackend(tmp_path)
    n = 0
    while not rb.exhausted:
        n += len(rb.sample())
    assert n == 20
    assert rb.skipped_lines == 3


def test_missing_and_empty_traces_are_clear_errors(tmp_path):
    with pytest.raises(TraceError, match="does not exist"):
        ReplayBackend(tmp_path / "nope")
    with pytest.raises(TraceError, match="telemetry.jsonl"):
        ReplayBackend(tmp_path)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(TraceError, match="empty"):
        ReplayBackend(tmp_path / "empty.jsonl")


def test_paced_replay_waits_for_the_recorded_moments(h200_trace):
    now = [0.0]
    slept = []

    def sleep(s):
        slept.append(s)
        now[0] += s

    rb = ReplayBackend(h200_trace, speed=2.0, clock=lambda: now[0], sleep=sleep, rebase=True)
    first = rb.sample()[0]
    second = rb.sample()[0]
    lines = _trace_lines(h200_trace)
    gap = lines[1]["t"] - lines[0]["t"]
    assert sum(slept) == pytest.approx(gap / 2)
    assert first.t == 0.0 and second.t == pytest.approx(gap / 2)
    assert rb.last_recorded_t == lines[1]["t"]


def test_loop_starts_over_with_a_continuous_timeline(tmp_path, h200_trace):
    (tmp_path / "telemetry.jsonl").write_text("\n".join((h200_trace / "telemetry.jsonl").read_text().splitlines()[:5]) + "\n")
    rb = ReplayBackend(tmp_path, loop=True)
    ts = [rb.sample()[0].t for _ in range(12)]
    assert all(b > a for a, b in zip(ts, ts[1:], strict=False))


def test_record_then_replay_round_trip(tmp_path):
    fake = FakeBackend(gpus=3, clock=iter(range(100, 200)).__next__)
    buf = io.StringIO()
    rec = Recorder(buf, fake)
    originals = []
    for _ in range(5):
        frame = fake.sample()
        originals.append(frame)
        rec.write_samples(frame)
    fake.inject_xid(2, 48)
    for ev in fake.drain_xid_events():
        rec.write_xid(ev)
    path = tmp_path / "rec.jsonl"
    path.write_text(buf.getvalue())
    rb = ReplayBackend(path)
    assert [g.index for g in rb.gpus()] == [0, 1, 2]
    replayed = []
    while not rb.exhausted:
        replayed.append(rb.sample())
    assert len(replayed) == 5
    for a, b in zip(originals, replayed, strict=True):
        assert [(s.gpu, s.t, s.power_watts, s.memory_used_bytes) for s in a] == [(s.gpu, s.t, s.power_watts, s.memory_used_bytes) for s in b]
    assert [e.xid for e in rb.drain_xid_events()] == [48]


def test_a_recording_keeps_mig_instances_and_the_dcgm_labels(tmp_path):
    fake = FakeBackend(gpus=2, clock=iter(range(100, 200)).__next__)
    fake.enable_mig(1, ["3g.71gb", "1g.18gb"])
    buf = io.StringIO()
    rec = Recorder(buf, fake)
    frame = fake.sample()
    rec.write_samples(frame)
    path = tmp_path / "rec.jsonl"
    path.write_text(buf.getvalue())
    rb = ReplayBackend(path)
    assert [(g.pci_bus_id, g.minor_number, g.driver_version) for g in rb.gpus()] == \
        [(g.pci_bus_id, g.minor_number, g.driver_version) for g in fake.gpus()]
    back = rb.sample()
    assert back[0].mig_instances is None
    assert back[1].mig_instances == frame[1].mig_instances and len(back[1].mig_instances) == 2


def test_import_trace_stores_every_value_once(store, h200_trace):
    summary = import_trace(h200_trace, store)
    assert summary.gpu_frames == 995
    power = store.query("gpu_power_watts")
    assert len(power) == 1 and len(power[0]) == 995
    lines = _trace_lines(h200_trace)
    assert power[0].value == pytest.approx([d["power_mw"] / 1000 for d in lines])
    assert power[0].key.labels["model"] == "NVIDIA H200"
    assert len(store.events("phase")) == 11
    again = import_trace(h200_trace, store)
    assert again.already_imported
    assert len(store.query("gpu_power_watts")[0]) == 995
