"""Alerts on the recorded H200 session: with the training series learned over their first healthy
seconds, alerts fire during the input-bound and checkpoint phases and none start during healthy
training or idle phases - in the recorded order and in recordings with phases reordered and
stretched. Rules never see the phase labels; the tests use them as ground truth only."""

from __future__ import annotations

import pytest
from recordings import PHASE_ANOMALY, PHASE_IDLE, Segment, build_recording, load_phases

from gpulens.alerts.engine import load_alerts
from gpulens.alerts.runtime import AlertRuntime
from gpulens.pipeline.ingest import import_trace
from gpulens.store import Store

LEARN_SECONDS = 3.0  # the bundled session's healthy training lasts 5.7 s, its first step is a 1.75 s warm-up
EVAL_SECONDS = 1.0
# An alert raised by an anomaly may start firing (and must resolve) within its window + `for` + an
# evaluation interval after the anomaly ends: learned windows and `for` are capped by --learn.
GRACE_SECONDS = LEARN_SECONDS + LEARN_SECONDS / 2 + 2 * EVAL_SECONDS


def replay(trace, store_path):
    with Store(store_path) as st:
        rt = AlertRuntime(st, learn_seconds=LEARN_SECONDS)
        try:
            import_trace(trace, st, evaluators=[rt], evaluate_seconds=EVAL_SECONDS)
        finally:
            rt.close()
        return [a for a in load_alerts(st) if a.fired_at is not None], rt.evaluations


def phase_at(segments: list[Segment], t: float) -> Segment | None:
    return next((s for s in segments if s.start <= t < s.end), None)


def check(alerts, segments):
    fired_in: dict[int, list] = {}
    for a in alerts:
        seg = phase_at(segments, a.fired_at)
        assert seg is not None, f"{a.rule} fired outside the recording at {a.fired_at}"
        fired_in.setdefault(id(seg), []).append(a)
        if seg.phase in PHASE_IDLE or seg.phase == "train_normal":
            # Allowed only as the tail of an anomaly that just ended.
            prev = [s for s in segments if s.end <= seg.start + 1e-6 and s.phase in PHASE_ANOMALY]
            assert prev and a.fired_at - prev[-1].end <= GRACE_SECONDS and seg.start - prev[-1].end < 1e-6, (
                f"{a.rule} {a.labels} fired at {a.fired_at - segments[0].start:.1f} s in healthy phase {seg.phase}"
            )
    for seg in segments:
        if seg.phase in PHASE_ANOMALY:
            rules = {a.rule for a in fired_in.get(id(seg), [])}
            assert rules, f"no alert fired during {seg.phase} ({seg.start - segments[0].start:.1f}-{seg.end - segments[0].start:.1f} s)"
            # Every alert an anomaly raised resolves soon after it ends, once healthy or idle follows.
            nxt = next((s for s in segments if abs(s.start - seg.end) < 1e-6), None)
            if nxt is not None and (nxt.phase in PHASE_IDLE or nxt.phase == "train_normal"):
                for a in alerts:
                    if seg.start <= a.fired_at < seg.end:
                        assert a.resolved_at is not None and a.resolved_at <= seg.end + GRACE_SECONDS, f"{a.rule} outlived {seg.phase}"
    return fired_in


def test_bundled_session(h200_trace, tmp_path):
    alerts, evaluations = replay(h200_trace, tmp_path / "s.db")
    segments = load_phases(h200_trace)
    fired_in = check(alerts, segments)
    stall = next(s for s in segments if s.phase == "train_dataloader_stall")
    ckpt = next(s for s in segments if s.phase == "train_checkpoint")
    assert {"TrainDataWaitHigh", "TrainStepTimeHigh"} <= {a.rule for a in fired_in[id(stall)]}
    assert "TrainCheckpointSlow" in {a.rule for a in fired_in[id(ckpt)]}
    assert not [a for a in alerts if a.rule.startswith("Gpu")], "GPU health alerts on a healthy recording"
    assert evaluations >= 90


PLANS = {
    "checkpoint-first-then-healthy-then-short-stall": [
        ("idle", 1.0), ("cold_start", 1.0), ("train_normal", 1.0), ("train_checkpoint", 1.0), ("train_normal", 1.5),
        ("train_dataloader_stall", 0.6), ("idle_between", 1.0), ("train_small_batch", 1.0), ("idle_end", 1.0),
    ],
    "long-stall-idle-healthy-then-half-checkpoint": [
        ("cold_start", 1.0), ("train_normal", 1.0), ("train_dataloader_stall", 2.0), ("idle_between", 1.0),
        ("train_normal", 2.0), ("train_checkpoint", 0.5), ("idle_end", 1.0),
    ],
}


@pytest.mark.parametrize("plan", list(PLANS), ids=list(PLANS))
def test_reordered_recordings(h200_trace, tmp_path, plan):
    segments = build_recording(h200_trace, tmp_path / "trace", PLANS[plan])
    alerts, _ = replay(tmp_path / "trace", tmp_path / "s.db")
    check(alerts, segments)
