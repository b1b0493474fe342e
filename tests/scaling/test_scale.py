"""`gpulens scale`: the HPA rule, its stabilization, and the bundled H200 session's overload."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gpulens.cli.main import main
from gpulens.errors import BadInputError
from gpulens.scaling import ScalePolicy, Stabilizer, Targets, desired_replicas, hpa_recommendation
from gpulens.store import Store
from gpulens.vocab import names as N


def test_the_hpa_rule_with_its_tolerance() -> None:
    assert hpa_recommendation(1, 5.9, 4.0, 0.1) == 2  # ceil(1 × 1.475)
    assert hpa_recommendation(1, 4.3, 4.0, 0.1) == 1  # usage 1.075: within the tolerance, no change
    assert hpa_recommendation(3, 12.2, 4.0, 0.1) == 3  # per replica 4.07
    assert hpa_recommendation(3, 4.0, 4.0, 0.1) == 1  # ceil(3 × 1/3)
    assert hpa_recommendation(2, 16.0, 4.0, 0.1) == 4  # exactly 2× per replica: 4, not 5
    assert hpa_recommendation(2, 0.0, 4.0, 0.1) == 0  # the policy's min_replicas clamps it
    with pytest.raises(BadInputError):
        hpa_recommendation(1, 1.0, 0.0, 0.1)


def test_scale_down_waits_for_the_stabilization_window_and_scale_up_does_not() -> None:
    s = Stabilizer(10.0)
    assert [s.update(t, r) for t, r in ((0, 1), (1, 3), (2, 1), (10, 1), (11, 1), (12, 2))] == [1, 3, 3, 3, 1, 2]


def test_the_stabilizer_is_the_largest_recommendation_of_its_window() -> None:
    """The same answers as the max over every recommendation still in the window, at any window."""
    rng = random.Random(7)
    for window in (0.0, 0.5, 3.0, 10.0, 1e9):
        s, seen, t = Stabilizer(window), [], 0.0
        for _ in range(400):
            t += rng.choice((0.0, 0.1, 1.0, 2.5))
            r = rng.randint(0, 6)
            seen.append((t, r))
            in_window = [x for u, x in seen if u > t - window] or [r]
            assert s.update(t, r) == max(in_window), (window, t)


def test_a_fine_step_under_a_long_stabilization_window_keeps_only_what_can_still_be_the_largest(
        replayed_store: Path, capsys) -> None:
    """--step 1ms over the 100 s session (100,000 evaluations, each inside the default 300 s window) ran
    for minutes: each evaluation took the max over the whole window. Now the window keeps only the
    recommendations that can still be its largest: a steady one is one entry, not 300,000."""
    s = Stabilizer(300.0)
    for i in range(300_000):
        s.update(i * 0.001, 2)
    assert len(s._history) == 1
    assert main(["scale", "--store", str(replayed_store), "--step", "1ms", "--format", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) > 90_000


def test_bad_policies_are_refused() -> None:
    for kw in ({"tolerance_ratio": 1.5}, {"stabilization_seconds": -1}, {"min_replicas": 3, "max_replicas": 2}):
        with pytest.raises(BadInputError):
            ScalePolicy(**kw)


def _phases(store: Store) -> list[tuple[str, float, float]]:
    ev = store.events("phase")
    end = store.time_range()[1]
    return [(e.data["name"], e.t, ev[i + 1].t if i + 1 < len(ev) else end) for i, e in enumerate(ev)]


STABILIZATION = 10.0


def test_the_h200_session_scales_out_in_the_overload_and_back_after_it(replayed_store: Path) -> None:
    with Store(replayed_store, readonly=True) as st:
        phases = _phases(st)
        pts = desired_replicas(st, window_seconds=10.0, step_seconds=1.0, policy=ScalePolicy(stabilization_seconds=STABILIZATION),
                               after_seconds=30.0)
    (overload_start,) = [a for name, a, _ in phases if name == "infer_overload"]
    # Never more than one replica in training, idle, cold start, or online serving at half capacity;
    # in the idle end the signal asks for one (the stabilization window may still hold two).
    before = [p for p in pts if p.t < overload_start]
    assert before and all(p.desired_replicas == 1 for p in before)
    (idle_end,) = [a for name, a, _ in phases if name == "idle_end"]
    assert all(p.recommended_replicas == 1 for p in pts if p.t >= idle_end)
    up = [p for p in pts if p.desired_replicas >= 2]
    assert up, "the overload never asked for a second replica"
    assert overload_start <= up[0].t <= overload_start + 30.0
    assert up[0].driver == "concurrency" and up[0].value > 4.0 * 1.1
    # After the last recommendation of 2, the stabilization window holds 2, then it is 1 again.
    last_two = max(p.t for p in pts if p.recommended_replicas >= 2)
    assert all(p.desired_replicas == 2 for p in pts if last_two <= p.t < last_two + STABILIZATION - 1)
    assert all(p.desired_replicas == 1 for p in pts if p.t >= last_two + STABILIZATION)
    assert pts[-1].desired_replicas == 1


def _store_with_requests(path: Path, per_host: dict[str, list[tuple[float, float]]]) -> Store:
    st = Store(path)
    for host, reqs in per_host.items():
        labels = {"service": "chat", "host": host}
        for arrival, end in reqs:
            st.event(N.EV_REQUEST, end, labels, {"arrival": arrival, "end": end, "status": "ok"})
            st.write(N.INFER_LATENCY_SECONDS, labels, end, end - arrival)
    st.flush()
    return st


def test_two_replicas_and_the_arrival_rate_signal(tmp_path: Path) -> None:
    # Two hosts, each ending 5 requests per second of 0.2 s: concurrency 1 each, 10 req/s in all.
    reqs = [(i / 5 - 0.2 + 0.05, i / 5 + 0.05) for i in range(50)]  # ends off the evaluation grid
    with _store_with_requests(tmp_path / "s.db", {"a": reqs, "b": reqs}) as st:
        by_conc = desired_replicas(st, start=0.0, window_seconds=5.0, step_seconds=1.0, policy=ScalePolicy(stabilization_seconds=0))
        mid = [p for p in by_conc if 6.0 <= p.t <= 9.0]
        assert mid and all(p.current_replicas == 2 and p.desired_replicas == 1 for p in mid)  # 2 in flight < 4 per replica
        by_rate = desired_replicas(st, start=0.0, window_seconds=5.0, step_seconds=1.0, targets=Targets(capacity_rps_per_replica=3.0),
                                   policy=ScalePolicy(stabilization_seconds=0))
        mid = [p for p in by_rate if 6.0 <= p.t <= 9.0]
        assert all(p.driver == "arrival_rate" and p.desired_replicas == 4 for p in mid)  # ceil(10 / 3)
        assert all(p.value == pytest.approx(10.0) for p in mid)


def test_cli_json_and_bad_input(replayed_store: Path, tmp_path: Path, capsys) -> None:
    assert main(["scale", "--store", str(replayed_store), "--format", "json", "--step", "2s", "--window", "10s", "--stabilization", "10s"]) == 0
    pts = json.loads(capsys.readouterr().out)
    assert set(pts[0]) >= {"t", "service", "desired_replicas", "current_replicas", "driver", "value", "target"}
    assert max(p["desired_replicas"] for p in pts) == 2
    assert main(["scale", "--store", str(replayed_store), "--service", "nope"]) == 2
    assert "no requests of service 'nope'" in capsys.readouterr().err
    assert main(["scale", "--store", str(replayed_store), "--target-concurrency", "0"]) == 2
    assert main(["scale", "--store", str(tmp_path / "none.db")]) == 2


def test_a_sweep_run_sets_a_replicas_capacity(tmp_path: Path, capsys) -> None:
    from gpulens.runs.registry import save_run
    from gpulens.scaling.capacity import targets_from_sweep

    reqs = [(i / 5 - 0.2 + 0.05, i / 5 + 0.05) for i in range(50)]
    db = tmp_path / "s.db"
    with _store_with_requests(db, {"a": reqs, "b": reqs}) as st:
        with pytest.raises(BadInputError, match="no `gpulens bench serve --sweep` run"):
            targets_from_sweep(st, "latest", Targets())
        save_run(st, "bench-serve", "h:80/", {}, {"requests": 10}, fingerprint={})  # not a sweep
        failed = save_run(st, "bench-serve", "h:80/", {}, {"sweep": {"mode": "open", "best": None}}, fingerprint={})
        open_id = save_run(st, "bench-serve", "h:80/", {}, {"sweep": {"mode": "open", "best": 3.0}}, fingerprint={})
        t, run = targets_from_sweep(st, "latest", Targets())
        assert run.id == open_id and t.capacity_rps_per_replica == 3.0 and t.concurrency_per_replica == 4.0
        with pytest.raises(BadInputError, match="found no load that met every SLO"):
            targets_from_sweep(st, str(failed), Targets())
        closed_id = save_run(st, "bench-serve", "h:80/", {}, {"sweep": {"mode": "closed", "best": 0.5}}, fingerprint={})
        t, _ = targets_from_sweep(st, str(closed_id), Targets())
        assert t.concurrency_per_replica == 0.5 and t.capacity_rps_per_replica is None
    assert main(["scale", "--store", str(db), "--from-run", str(open_id), "--window", "5s", "--step", "1s",
                 "--stabilization", "0s", "--format", "json"]) == 0
    pts = [p for p in json.loads(capsys.readouterr().out) if 6.0 <= p["t"] <= 9.0]
    assert pts and all(p["driver"] == "arrival_rate" and p["desired_replicas"] == 4 for p in pts)  # ceil(10 / 3)


def _store_with_queued_requests(path: Path) -> Store:
    """One host ending 4 requests a second: each waits 1.5 s in a queue, then is served in 0.5 s
    (its first token 0.3 s after service began). Queue: 6 requests waiting on average; latency 2 s.
    Every fifth request fails fast (0.01 s): percentiles must read the successes only."""
    st = Store(path)
    labels = {"service": "chat", "host": "a"}
    for i in range(200):
        end = i / 4 + 0.05
        if i % 5 == 4:
            st.event(N.EV_REQUEST, end, labels, {"arrival": end - 0.01, "start": end - 0.01, "end": end, "status": "error"})
        else:
            arrival, start = end - 2.0, end - 0.5
            st.event(N.EV_REQUEST, end, labels, {"arrival": arrival, "start": start, "first_token": start + 0.3, "end": end, "status": "ok"})
        st.write(N.INFER_LATENCY_SECONDS, labels, end, 2.0)
    st.flush()
    return st


def test_queue_and_latency_signals(tmp_path: Path) -> None:
    """issue 26: scale follows a queue and a latency (p95 of latency, of TTFT) signal when asked to."""
    policy = ScalePolicy(stabilization_seconds=0)
    with _store_with_queued_requests(tmp_path / "s.db") as st:
        def mid(targets: Targets) -> list:
            pts = desired_replicas(st, start=0.0, window_seconds=10.0, step_seconds=1.0, targets=targets, policy=policy)
            return [p for p in pts if 15.0 <= p.t <= 40.0]

        # without the new targets: concurrency alone (1.5 waiting + 0.5 served, 4/s: ~6.4 in flight / 4 -> 2)
        assert {p.driver for p in mid(Targets())} == {"concurrency"}
        queue = mid(Targets(queue_per_replica=2.0))  # 3.2 requests/s succeed with 1.5 s each in the queue: 4.8 waiting
        assert all(p.driver == "queue" and p.value == pytest.approx(4.8, rel=0.05) and p.desired_replicas == 3 for p in queue)
        lat = mid(Targets(concurrency_per_replica=100.0, p95_latency_seconds=0.5))  # p95 2 s of successes against 0.5 s
        assert all(p.driver == "p95_latency" and p.value == pytest.approx(2.0) and p.desired_replicas == 4 for p in lat)
        ttft = mid(Targets(concurrency_per_replica=100.0, p95_ttft_seconds=0.9))  # TTFT 1.8 s against 0.9 s
        assert all(p.driver == "p95_ttft" and p.value == pytest.approx(1.8) and p.desired_replicas == 2 for p in ttft)
        calm = mid(Targets(concurrency_per_replica=100.0, p95_latency_seconds=4.0))  # met with room: scale in
        assert all(p.desired_replicas == 1 for p in calm)


def test_latency_targets_on_the_cli(tmp_path: Path, capsys) -> None:
    _store_with_queued_requests(tmp_path / "s.db").close()
    assert main(["scale", "--store", str(tmp_path / "s.db"), "--format", "json", "--window", "10s", "--step", "5s",
                 "--stabilization", "0s", "--target-concurrency", "100", "--target-p95-latency", "500ms"]) == 0
    pts = json.loads(capsys.readouterr().out)
    assert {p["driver"] for p in pts if 15 <= p["t"] <= 40} == {"p95_latency"}
    for bad, said in ((["--target-queue", "0"], "--target-queue must be above zero"),
                      (["--target-kv-cache", "2"], "--target-kv-cache is a share of the KV cache, at most 1"),
                      (["--target-p95-latency", "fast"], "--target-p95-latency"),
                      (["--prometheus", "http://127.0.0.1:9", "--target-p95-ttft", "1s"], "only a node's store keeps")):
        assert main(["scale", "--store", str(tmp_path / "s.db"), *bad]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert said in err and "Traceback" not in err, err
