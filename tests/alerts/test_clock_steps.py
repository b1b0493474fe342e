"""Issue 27 item 7: alert times are monotonic under wall-clock steps. The store is stamped with wall
time (as the agent's sampler stamps it) and the runtime evaluates at the clock's time (as the agent's
loop does), on a FakeClock whose wall clock is set back and forward while its monotonic clock runs on."""

from __future__ import annotations

import json
import subprocess
import sys

from gpulens.alerts.engine import load_alerts
from gpulens.alerts.rules import load_rules
from gpulens.alerts.runtime import AlertRuntime
from gpulens.clock import FakeClock
from gpulens.store import Store

T0 = 1_800_000_000.0


def _runtime(store, clock, tmp_path, rule: str):  # noqa: ANN001
    path = tmp_path / "rules.yaml"
    path.write_text(f"rules:\n{rule}", encoding="utf-8")
    sent: list[tuple[str, str, float | None, float | None]] = []
    rt = AlertRuntime(store, learn_seconds=3600.0, rules=load_rules(path, packs=()), clock=clock)
    inner = rt.engine.notify
    rt.engine.notify = lambda alerts: (sent.extend((a.rule, a.state, a.fired_at, a.resolved_at) for a in alerts), inner(alerts))
    return rt, sent


XID_RULE = ("  - name: Xid\n    expr: count_events_over_time(xid[5m]) > 0\n    for: 0s\n    severity: critical\n"
            "    summary: XID\n    advice: Reboot.\n")


def test_a_clock_set_back_then_forward_during_an_xid_neither_resolves_it_early_nor_fires_it_twice(tmp_path):
    clock = FakeClock(start=T0)
    with Store(tmp_path / "s.db") as store:
        rt, sent = _runtime(store, clock, tmp_path, XID_RULE)
        times = []
        for second in range(400):
            clock.advance(1.0)
            if second == 10:
                store.event("xid", clock.time(), {"gpu": "0", "xid": "79"})
            if second == 20:
                clock.step_wall(-3600.0)  # NTP sets the clock an hour back...
            if second == 40:
                clock.step_wall(+3600.0)  # ...and forward again
            store.write("gpu_up", {"gpu": "0"}, clock.time(), 1.0)
            store.flush()
            rt.evaluate(clock.time())
            times.append(rt.engine.active and next(iter(rt.engine.active.values())).state)
        rt.close()
        assert [(rule, state) for rule, state, _, _ in sent] == [("Xid", "firing"), ("Xid", "resolved")]
        (_, _, fired_at, _), (_, _, _, resolved_at) = sent
        assert resolved_at >= fired_at
        # five minutes of monotonic time after the XID, not an hour early, not at the second step
        assert 295 <= resolved_at - fired_at <= 305
        history = load_alerts(store)
        assert len(history) == 1 and history[0].resolved_at >= history[0].fired_at >= history[0].active_since


def test_a_clock_set_forward_does_not_cut_a_for_duration_short(tmp_path):
    rule = ("  - name: Hot\n    expr: gpu_temperature_celsius > 80\n    for: 30s\n    severity: warning\n"
            "    summary: hot\n    advice: Cool it.\n")
    clock = FakeClock(start=T0)
    with Store(tmp_path / "s.db") as store:
        rt, sent = _runtime(store, clock, tmp_path, rule)
        fired_after = None
        for second in range(60):
            clock.advance(1.0)
            if second == 5:
                clock.step_wall(+3600.0)  # the clock jumps an hour ahead while the alert is pending
            store.write("gpu_temperature_celsius", {"gpu": "0"}, clock.time(), 90.0)
            store.flush()
            rt.evaluate(clock.time())
            if sent and fired_after is None:
                fired_after = second
        rt.close()
        assert sent and sent[0][1] == "firing"
        assert fired_after == 30  # 30 s of monotonic time after it went pending at second 0


def test_query_since_counts_back_from_now_not_from_a_far_future_sample(tmp_path):
    """One sample dated 2199 used to make `query --since 15m` show only that point."""
    import time

    db = tmp_path / "s.db"
    now = time.time()
    with Store(db) as store:
        for i in range(5):
            store.write("gpu_up", {"gpu": "0"}, now - 60.0 * i, 1.0)
        store.write("gpu_up", {"gpu": "0"}, 7_258_000_000.0, 0.0)  # 2199-12
        store.write("gpu_up", {"gpu": "0"}, now - 3600.0, 1.0)  # older than 15 minutes
        store.flush()
    out = subprocess.run([sys.executable, "-m", "gpulens", "query", "gpu_up", "--store", str(db), "--since", "15m",
                          "--format", "json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    points = json.loads(out.stdout)[0]["points"]
    assert len(points) == 5 and all(now - 900 < t <= now + 1 for t, _ in points)


def test_query_since_of_a_session_recorded_in_the_past_still_answers(tmp_path):
    """A replayed session that ended long ago: --since counts back from its newest sample."""
    db = tmp_path / "s.db"
    with Store(db) as store:
        for i in range(10):
            store.write("gpu_up", {"gpu": "0"}, 1_700_000_000.0 + 60.0 * i, 1.0)
        store.flush()
    out = subprocess.run([sys.executable, "-m", "gpulens", "query", "gpu_up", "--store", str(db), "--since", "5m",
                          "--format", "json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)[0]["points"]) == 6  # [newest - 5m, newest]


def test_a_simulation_ahead_of_the_clock_measures_for_on_its_own_timeline(tmp_path):
    """Evaluations at instants that run ahead of the real clock (a replay, a test) measure `for` on
    those instants, even when they start at the present."""
    import time

    rule = ("  - name: Hot\n    expr: gpu_temperature_celsius > 80\n    for: 30s\n    severity: warning\n"
            "    summary: hot\n    advice: Cool it.\n")
    with Store(tmp_path / "s.db") as store:
        rt, sent = _runtime(store, None, tmp_path, rule)  # the real clock
        t = time.time()
        fired_after = None
        for second in range(1, 60):
            t += 1.0
            store.write("gpu_temperature_celsius", {"gpu": "0"}, t, 90.0)
            store.flush()
            rt.evaluate(t)
            if sent and fired_after is None:
                fired_after = second
        rt.close()
        assert fired_after is not None and 31 <= fired_after <= 34  # pending from second 1; the first ~2 s near the present are real time
