"""A replay's timeline (gpu/replay_pacing.py): outlier frames skipped and counted, lasting jumps kept
and played as the max gap, and waits that a stop ends (the loop's stop event and --duration)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from testlib import wait_until

from gpulens.data import bundled_trace
from gpulens.gpu.replay import ReplayBackend
from gpulens.gpu.replay_pacing import Pacer, RawFrame, guard_frames
from gpulens.gpu.types import GpuSample, XidEvent
from gpulens.pipeline.loop import SamplingLoop

T0 = 1_796_002_115.0
DAY = 86400.0


def _raw(times: list[float], xids_at: dict[int, float] | None = None) -> list[RawFrame]:
    frames = []
    for i, t in enumerate(times):
        xids = [(1000 + i, XidEvent(t=(xids_at or {})[i], gpu=0, uuid="u", xid=79))] if i in (xids_at or {}) else []
        frames.append(RawFrame([(i + 1, GpuSample(t=t, gpu=0, uuid="u", name="g"))], xids))
    return frames


def _guard(times: list[float], max_gap: float = 60.0, xids_at: dict[int, float] | None = None):
    skipped: list[tuple[int, str]] = []
    kept = list(guard_frames(iter(_raw(times, xids_at)), max_gap, lambda n, why: skipped.append((n, why))))
    return kept, skipped


def test_a_frame_far_from_both_neighbours_is_skipped_with_its_line_and_reason():
    kept, skipped = _guard([T0, T0 + 1, 4_090_000_000.0, T0 + 2, T0 + 3])
    assert [f.t for f in kept] == [T0, T0 + 1, T0 + 2, T0 + 3]
    assert skipped == [(3, "t is 4090000000, more than the max gap of 60 s from its neighbours")]


def test_a_far_first_frame_is_skipped_when_the_two_after_it_agree():
    kept, skipped = _guard([4_090_000_000.0, T0, T0 + 1, T0 + 2])
    assert [f.t for f in kept] == [T0, T0 + 1, T0 + 2]
    assert [n for n, _ in skipped] == [1] and "the lines after it" in skipped[0][1]


def test_a_far_last_frame_is_kept_as_nothing_after_it_tells_a_jump_from_an_outlier():
    kept, skipped = _guard([T0, T0 + 1, T0 - 10 * DAY])
    assert [f.t for f in kept] == [T0, T0 + 1, T0 - 10 * DAY] and skipped == []


def test_a_sparse_recording_keeps_every_frame():
    times = [T0 + 300 * i for i in range(6)]  # one sample every five minutes, each gap past the max gap
    kept, skipped = _guard(times)
    assert [f.t for f in kept] == times and skipped == []


def test_a_jump_the_next_frame_continues_from_is_kept():
    times = [T0, T0 + 1, T0 + DAY, T0 + DAY + 1, T0 + 2, T0 + 3]  # resumed a day later, then back
    kept, skipped = _guard(times)
    assert [f.t for f in kept] == times and skipped == []


def test_xids_of_a_skipped_frame_go_out_with_the_next_kept_one():
    kept, _ = _guard([T0, 4_090_000_000.0, T0 + 1], xids_at={1: T0 + 0.5})
    assert [x.t for _, x in kept[1].xids] == [T0 + 0.5]


def test_the_pacer_shortens_a_long_gap_to_the_max_gap():
    waits: list[float] = []
    now = [0.0]

    def wait(s: float) -> bool:
        waits.append(s)
        now[0] += s
        return False

    p = Pacer(1.0, 60.0, clock=lambda: now[0])
    for t in (T0, T0 + 1, T0 + DAY, T0 + DAY + 1):
        p.wait_for(p.timeline(t), wait)
    assert waits == pytest.approx([1.0, 60.0, 1.0])
    assert p.removed_seconds == pytest.approx(DAY - 1 - 60)


def test_the_pacer_never_waits_past_the_max_gap_whatever_the_clock_says():
    waits: list[float] = []
    p = Pacer(1.0, 60.0, clock=iter([0.0, 0.0, -1e6]).__next__)  # a clock that jumped back a long way
    p.wait_for(p.timeline(T0), lambda s: False)
    p.wait_for(p.timeline(T0 + 1), lambda s: waits.append(s) or False)
    assert waits == [60.0]


def gap_trace(tmp: Path, after: int = 200) -> Path:
    with (bundled_trace() / "telemetry.jsonl").open() as f:
        lines = [json.loads(next(f)) for _ in range(5 + after)]
    times = [T0 + 0.1 * i for i in range(5)] + [T0 + DAY + 0.1 * i for i in range(after)]
    path = tmp / "gap.jsonl"
    path.write_text("".join(json.dumps({**d, "t": t}) + "\n" for d, t in zip(lines, times, strict=True)))
    return path


def test_a_stopped_wait_returns_nothing_and_keeps_the_frame_for_the_next_call(tmp_path):
    rb = ReplayBackend(gap_trace(tmp_path), speed=1.0)
    asked: list[float] = []
    stop = [True]
    rb.wait_with(lambda s: asked.append(s) or (stop[0] and s > 1.0))  # a stop comes during any long wait
    for _ in range(5):
        assert rb.sample()  # the first five frames are 0.1 s apart
    assert rb.sample() == [] and 1.0 < asked[-1] <= 60.0  # the gap: at most --max-gap, and the stop ends it
    stop[0] = False
    frame = rb.sample()
    assert frame and rb.last_recorded_t == pytest.approx(T0 + DAY)


def _run_in_thread(loop: SamplingLoop, duration: float | None = None) -> threading.Thread:
    th = threading.Thread(target=loop.run, args=(duration,), daemon=True)
    th.start()
    return th


def test_stop_ends_a_replay_waiting_in_a_day_long_gap(tmp_path):
    loop = SamplingLoop(ReplayBackend(gap_trace(tmp_path), speed=1.0), [])
    th = _run_in_thread(loop)
    wait_until(lambda: loop.stats.ticks == 5, what="the five frames before the gap")
    loop.stop()
    th.join(timeout=30)  # the stop ends the wait at once; uncut, the gap plays as the 60 s max gap
    assert not th.is_alive() and loop.stats.ticks == 5


def test_the_duration_ends_a_replay_waiting_in_a_day_long_gap(tmp_path):
    loop = SamplingLoop(ReplayBackend(gap_trace(tmp_path), speed=1.0), [])
    # 3 s: the five frames before the gap take 0.4 s, and a duration of 0.5 s left a loaded machine
    # 100 ms to play them; the gap itself plays as the 60 s max gap, which the duration must cut
    th = _run_in_thread(loop, 3.0)
    th.join(timeout=40)
    assert not th.is_alive() and loop.stats.ticks == 5
