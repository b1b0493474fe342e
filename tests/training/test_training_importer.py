"""Recorded training steps -> training series: the H200 session, the co-location recording and
gpulens's own records (the monitor's events written out as JSON lines)."""

from __future__ import annotations

import json

import pytest

from gpulens.clock import FakeClock
from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.workload.importers import ImportContext, import_event, load_builtin_importers
from gpulens.workload.training import TrainingMonitor, record_from_dict


def test_h200_steps_become_series(replayed_store, h200_trace) -> None:
    recorded = [json.loads(line) for line in (h200_trace / "events.jsonl").read_text().splitlines()]
    recorded = [r for r in recorded if r["kind"] == "train_step"]
    with Store(replayed_store, readonly=True) as st:
        (step_s,) = st.query(N.TRAIN_STEP_SECONDS, {"train_job": "h200-demo"})
        assert step_s.key.labels == {"train_job": "h200-demo", "rank": "0", "host": "replay"}
        assert step_s.value == pytest.approx([r["step_s"] for r in recorded])
        assert step_s.t == pytest.approx([r["t_end"] for r in recorded])
        (ratio,) = st.query(N.TRAIN_DATA_WAIT_RATIO)
        assert max(ratio.value) == pytest.approx(max(r["data_wait_s"] / r["step_s"] for r in recorded))
        (tps,) = st.query(N.TRAIN_TOKENS_PER_SECOND)
        assert tps.value[5] == pytest.approx(recorded[5]["tokens"] / recorded[5]["step_s"])
        ckpt = st.query(N.TRAIN_CHECKPOINT_SECONDS)[0].value
        assert len(ckpt) == 2 and min(ckpt) > 4  # one sample per checkpoint
        # The phase label is the recorder's bookkeeping; a live monitor has none, so it is not kept.
        assert all("phase" not in e.data for e in st.events(N.EV_TRAIN_STEP))


def test_gpulens_own_records_round_trip(tmp_path) -> None:
    src, dst = Store(tmp_path / "a.db"), Store(tmp_path / "b.db")
    clock = FakeClock()
    with TrainingMonitor(job="own", store=src, host="n7", rank=2, world_size=4, clock=clock) as mon:
        for i in mon.data(range(5)):
            with mon.step(samples=4, tokens=64) as s:
                clock.advance(0.125)
                s.loss = 1.0 / (i + 1)
        with mon.checkpoint():
            clock.advance(0.5)
    lines = [{"kind": e.kind, **e.labels, **e.data, **({"t": e.t} if e.kind != N.EV_TRAIN_STEP else {})} for e in src.events()]
    load_builtin_importers()
    ctx = ImportContext(job="ignored", host="ignored")
    for rec in json.loads(json.dumps(lines)):  # through JSON, as a file would
        assert import_event(rec, dst, ctx)
    dst.flush()
    a, b = src.events(N.EV_TRAIN_STEP), dst.events(N.EV_TRAIN_STEP)
    assert [e.data for e in a] == [e.data for e in b]
    assert [e.data["step_s"] for e in b] == [0.125] * 4 + [0.625]  # the checkpoint is charged to the last step
    assert b[0].labels == {"train_job": "own", "rank": "2", "host": "n7"}
    assert dst.events(N.EV_TRAIN_START)[0].data["world_size"] == 4
    for name in (N.TRAIN_STEP_SECONDS, N.TRAIN_LOSS, N.TRAIN_CHECKPOINT_SECONDS):
        assert src.query(name)[0].value == pytest.approx(dst.query(name)[0].value)
    src.close()
    dst.close()


def test_record_from_dict_keeps_unmeasured_fields_unset() -> None:
    sparse = record_from_dict({"kind": "train_step", "role": "train", "pid": 465, "t_start": 10.0, "t_end": 10.5, "tokens": 8192})
    assert sparse is not None and sparse.step_s == 0.5 and sparse.pid == 465
    assert sparse.data_wait_s is None and sparse.checkpoint_s is None and sparse.busy_seconds == 0.5
    assert "role" not in sparse.to_event_data()
    only_end = record_from_dict({"t_end": 5.0, "step_s": 2.0, "batch": 3})
    assert only_end.t_start == 3.0 and only_end.samples == 3
    assert record_from_dict({"t_start": 1.0}) is None
    assert record_from_dict({"t_end": "soon"}) is None


def test_replayed_steps_carry_an_mfu_from_the_recorded_parameters_and_gpu(replayed_store):
    from gpulens import Store
    from gpulens.plan.catalog import find_gpu

    with Store(replayed_store, readonly=True) as st:
        (mfu,) = st.query("train_mfu_ratio")
        (tps,) = st.query("train_tokens_per_second")
        (load,) = [e.data for e in st.events("cold_start")]
    peak = find_gpu("NVIDIA H200").peak_flops("bf16")
    assert mfu.t == tps.t
    for m, rate in zip(mfu.value, tps.value, strict=True):
        assert m == pytest.approx(rate * 6 * load["params"] / peak)
    assert 0.10 < max(mfu.value) < 0.30  # a 374 M model at ~82 k tokens/s on an H200


def test_a_step_with_an_absurd_duration_or_time_keeps_no_unprintable_time() -> None:
    """A checkpoint_s of 1e30 put the checkpoint stall's start at -1e30, and `gpulens diagnose` and
    `gpulens report` died on it (OverflowError) after `gpulens replay` had imported the line."""
    good = {"t_start": 1796002127.2, "t_end": 1796002129.0, "step_s": 1.8, "checkpoint_s": 0.5}
    for key, bad in (("checkpoint_s", 1e30), ("data_wait_s", float("inf")), ("compute_s", -1.0), ("comm_wait_s", float("nan"))):
        rec = record_from_dict({**good, key: bad})
        assert rec is not None and getattr(rec, key) is None, key  # an absurd part: not measured
    assert record_from_dict({**good, "t_start": -1e300}).t_start == pytest.approx(1796002127.2)  # from t_end - step_s
    assert record_from_dict({**good, "t_end": 1e300}) is None  # no usable end
    assert record_from_dict({"t_end": 1796002129.0, "step_s": 1e30}) is None  # its start would be before 1970


def test_replay_diagnose_and_report_of_a_trace_with_absurd_step_fields(h200_trace, tmp_path, capsys) -> None:
    from testlib import replay_diagnose_and_report

    lines = (h200_trace / "events.jsonl").read_text().splitlines()
    step = next(json.loads(line) for line in lines if '"train_step"' in line)
    bad = [{**step, "checkpoint_s": v} for v in (1e30, 2**70, -5, 1e300)] + [{**step, "step_s": 1e30, "t_start": None}]
    assert "Traceback" not in replay_diagnose_and_report(h200_trace, tmp_path, capsys, bad)
