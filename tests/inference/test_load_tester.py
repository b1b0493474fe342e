"""The load tester against local servers with known behaviour (tests/inference/inference_test_servers.py)."""

from __future__ import annotations

import json
import statistics
import urllib.request

import pytest

from gpulens.bench.serve import LoadSpec, Target, openai_body, parse_slos, run_load, sweep
from gpulens.bench.serve.schedule import intended_times


def test_stall_is_charged_to_every_request_scheduled_during_it(timed_server):
    """Done-when: 10 ms server with a 1 s stall, 200 req/s for 10 s. Open loop: every request
    scheduled during the stall is charged its wait from its intended send; the same server under a
    closed loop hides it at p99. Only bounds that a loaded machine cannot break are asserted here (a
    late client only adds latency); how close p50 comes to the server's 10 ms is benchmarks/bench_serve.py's."""
    res = run_load(LoadSpec(Target(f"{timed_server}/fixed/stall-open?ms=10&at=4&dur=1"), rate=200, duration_seconds=10))
    s = res.summary
    assert s.requests.ok == s.requests.total >= 1990
    assert s.latency.p50 >= 0.010  # never less than the server's own time: the clock starts at the intended send
    # The stall ends 5 s after the first request reached the server, hence at least 5 s after it was
    # due to be sent: a request scheduled at offset o in the stall waits at least 5 - o, however late
    # the client runs. It begins 4 s after that arrival, which came before the first answer did: every
    # request scheduled 4 s after the first answer or later is inside it, however slow that first
    # connection was on a loaded machine (4.3 s on, as before, when the first answer was quick).
    t0 = min(r.intended for r in res.records)
    first_answer = min(r.end for r in res.records if r.end is not None) - t0
    start = max(4.3, first_answer + 4.0)
    in_stall = [r for r in res.records if start <= r.intended - t0 <= 4.95]
    assert len(in_stall) >= 20, (first_answer, len(in_stall))
    short = [(round(r.intended - t0, 3), round(r.latency, 3)) for r in in_stall if r.latency < 5.0 - (r.intended - t0) - 1e-3]
    assert not short, short[:5]
    # ~200 requests fell into the stall, 10 % of 2000: p99 is the stall's hundreds of ms
    assert s.latency.p99 > 0.3
    assert s.latency.max > 0.6

    # a 2 s stall, and "slow" from 1 s: a loaded machine would have to hold a 10 ms request for a
    # whole second to count it among the stalled ones (2 s of run after the stall: hundreds of quick
    # requests, so that p99 lies below the two stalled ones)
    closed = run_load(LoadSpec(Target(f"{timed_server}/fixed/stall-closed?ms=10&at=1&dur=2"), concurrency=2,
                               duration_seconds=5))
    slow = [r for r in closed.records if r.latency is not None and r.latency > 1.0]
    assert 1 <= len(slow) <= 2  # only the two users' requests in flight saw the stall: a closed loop hides it
    assert closed.summary.latency.p99 < min(r.latency for r in slow)


def test_streaming_ttft_and_itl_are_read_from_the_stream(test_server):
    """Done-when: a streaming server with known TTFT (60 ms) and token interval (15 ms). A client can
    only see a token after the server sent it, and how much later depends on how busy the machine
    is (CI's 2 loaded cores once made the 60 ms 135 ms at p50): here what holds on any machine, the
    server's own send times as the floor and the stream's structure; how close the tool comes to
    the server's clock is a benchmark figure (benchmarks/bench_serve.py, "streaming TTFT")."""
    for path in ("/v1/completions", "/v1/chat/completions"):
        kind = "chat" if "chat" in path else "completions"
        target = Target(f"{test_server}{path}?ttft_ms=60&itl_ms=15&log=stream-{kind}", method="POST", kind=kind,
                        body=openai_body(kind, model="m", prompt="hi", max_tokens=12, stream=True),
                        headers={"Content-Type": "application/json"})
        res = run_load(LoadSpec(target, rate=10, duration_seconds=1.5))
        s, recs = res.summary, res.records
        assert s.requests.ok == s.requests.total == 15
        assert s.output_tokens == 15 * 12
        # the chat role chunk and the closing usage chunk carry no token: 12 tokens, 11 gaps, in each request
        assert all(len(r.itls or ()) == 11 for r in recs), [len(r.itls or ()) for r in recs]
        # the gaps lie between the first token and the last, which come before the end
        assert all(0 < sum(r.itls) <= r.end - r.first_token + 1e-9 for r in recs)
        with urllib.request.urlopen(f"{test_server}/log/stream-{kind}", timeout=30) as resp:
            served = json.load(resp)
        assert len(served) == 15
        # Never earlier than the server's own first and last token, counted from its receipt of the
        # request (the tool counts from the intended send, earlier still): request by request, hence
        # at every rank of the sorted lists, whatever the pairing.
        for what, got, sent in (("TTFT", sorted(r.ttft for r in recs), sorted(e["first_token_s"] for e in served)),
                                ("latency", sorted(r.latency for r in recs), sorted(e["last_token_s"] for e in served))):
            early = [(g, t) for g, t in zip(got, sent, strict=True) if g < t]
            assert not early, (kind, what, early)
        assert s.ttft.p50 >= 0.060 and s.latency.p50 >= 0.060 + 11 * 0.015  # the server sleeps until these


def test_sweep_finds_the_known_capacity(timed_server):
    """Done-when: a server that serves one request at a time in 20 ms has a capacity of exactly
    50 req/s; the sweep must land within 10 % of it."""
    # Above capacity the backlog grows for the whole probe: at 54 req/s for 4 s the last request
    # waits (54 − 50) × 4 / 50 s = 320 ms, so the SLO below fails from 7.5 % over capacity. Below
    # capacity a request takes 20 ms: a loaded machine must delay one by 280 ms to fail a probe
    # (a 200 ms SLO over 2.5 s probes left it 180 ms).
    spec = LoadSpec(Target(f"{timed_server}/capacity/sweep?ms=20"), rate=30, duration_seconds=4)
    result = sweep(spec, parse_slos(["p99_latency<=300ms"]), tolerance_ratio=0.08)
    assert result.best == pytest.approx(50, rel=0.10), [(p.value, p.passed) for p in result.probes]
    assert result.lowest_failing is not None and result.lowest_failing > result.best
    passed = [p for p in result.probes if p.passed]
    assert all(p.result.summary.goodput > 0.8 * p.value for p in passed)
    overloaded = max(result.probes, key=lambda p: p.value)
    assert not overloaded.passed and overloaded.result.summary.latency.p99 > 0.2


def test_closed_loop_concurrency_sweep(timed_server):
    """Concurrency sweep: each user adds 200 ms of queueing on a one-at-a-time server, so
    p99 ≤ 1100 ms holds up to 5 users (5 × 200 ms) and fails from 6. At 200 ms a user (it was 20,
    then 100), a loaded machine's delays would have to pass 300 ms to move the answer below 4 users."""
    spec = LoadSpec(Target(f"{timed_server}/capacity/users?ms=200"), concurrency=2, duration_seconds=3)
    result = sweep(spec, parse_slos(["p99_latency<=1100ms"]))
    assert result.best in (4, 5)
    assert result.lowest_failing in (5, 6, 7, 8)


def test_requests_bound_and_closed_loop_count(timed_server):
    s = run_load(LoadSpec(Target(f"{timed_server}/fixed/n?ms=1"), concurrency=3, duration_seconds=None,
                          max_requests=30)).summary
    assert s.requests.total == 30 and s.requests.ok == 30


def test_poisson_and_gamma_schedules_have_the_right_rate_and_spread():
    const = list(intended_times(100, duration=10))
    assert len(const) == 1000 and statistics.pstdev(b - a for a, b in zip(const, const[1:], strict=False)) < 1e-9
    pois = list(intended_times(100, arrival="poisson", duration=100, seed=1))
    gaps = [b - a for a, b in zip(pois, pois[1:], strict=False)]
    assert len(pois) == pytest.approx(10_000, rel=0.03)
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, rel=0.05)  # CV of exponential
    bursty = list(intended_times(100, arrival="gamma", burstiness=0.25, duration=100, seed=1))
    bgaps = [b - a for a, b in zip(bursty, bursty[1:], strict=False)]
    assert len(bursty) == pytest.approx(10_000, rel=0.1)
    assert statistics.pstdev(bgaps) / statistics.mean(bgaps) == pytest.approx(2.0, rel=0.1)  # CV = 1/sqrt(k)


def test_ramp_and_worker_split():
    ramp = list(intended_times(10, ramp_to=30, duration=10))
    assert len(ramp) == pytest.approx(200, abs=1)  # mean rate 20 over 10 s
    first = sum(1 for t in ramp if t < 1)
    last = sum(1 for t in ramp if t >= 9)
    assert first == pytest.approx(11, abs=1) and last == pytest.approx(29, abs=1)
    # two workers at half the rate, offset by half a gap, interleave into the full schedule
    a = list(intended_times(100, duration=1, share=2, phase=0.0))
    b = list(intended_times(100, duration=1, share=2, phase=0.5))
    assert sorted(a + b) == pytest.approx(list(intended_times(100, duration=1)))


def test_multiple_worker_processes_share_the_load(timed_server):
    res = run_load(LoadSpec(Target(f"{timed_server}/fixed/w?ms=2"), rate=100, duration_seconds=1, workers=2))
    s = res.summary
    assert s.requests.total == 100 and s.requests.ok == 100
    assert s.latency.count == 100
    # Each process's own account comes back; they started together, once both were ready (the
    # start is read from one shared value, so only their wake-ups differ: a loaded machine can wake
    # one of two processes a good while late, hence 250 ms, well under a Python process's start-up).
    a, b = sorted(res.workers, key=lambda w: w.worker)
    assert (a.worker, a.ok, b.worker, b.ok) == (0, 50, 1, 50)
    assert a.cpu_seconds > 0 and b.cpu_seconds > 0 and a.wall_seconds >= 0.9 and b.wall_seconds >= 0.9
    assert abs(a.started_perf - b.started_perf) < 0.25
