"""A live agent's rules read what the loop just buffered from memory (`store.recent`), so the store
commits every flush interval instead of before every evaluation (issue 28). What they answer must be
what they would answer over a store flushed before each evaluation."""

from __future__ import annotations

import random

from gpulens.alerts.evaluate import Evaluator
from gpulens.alerts.expr import parse_expr
from gpulens.alerts.rules import parse_rules
from gpulens.alerts.runtime import AlertRuntime
from gpulens.alerts.source import StoreSource
from gpulens.gpu.fake import FakeBackend
from gpulens.pipeline.loop import SamplingLoop
from gpulens.pipeline.sinks import EvaluatorSink, SinkBase, StoreSink
from gpulens.store import Store

T0 = 1_800_000_000.0
EXPRS = [
    "temp_c > 50",
    "increase(xid_total[10s])",
    "avg_over_time(temp_c[5s])",
    "max_over_time(temp_c[20s])",
    "quantile_over_time(0.9, temp_c[8s])",
    "last_over_time(temp_c[3s])",
    "count_over_time(temp_c[30s])",
]
RULES = """
metrics: [temp_c, xid_total]
rules:
  - name: Hot
    expr: temp_c > 80
    for: 30s
    severity: warning
    summary: hot
"""


def _answers(evaluator: Evaluator, t: float) -> list[dict]:
    evaluator.source.refresh()
    return [evaluator.vector(parse_expr(e).root, t) for e in EXPRS]


def test_rules_over_the_feed_answer_as_over_a_store_flushed_before_each_evaluation(tmp_path):
    """Two stores get the same rows: one flushed at random moments and read through its feed, one
    flushed before every evaluation and read from SQL only. Includes a clock set back, a series that
    goes quiet, and one that appears late."""
    rng = random.Random(28)
    live, ref = Store(tmp_path / "live.db"), Store(tmp_path / "ref.db")
    feed = live.keep_recent(6.0)
    live_eval, ref_eval = Evaluator(StoreSource(live, feed)), Evaluator(StoreSource(ref))
    t = T0
    xid = 0.0
    for step in range(120):
        t += 1.0 if step != 70 else -15.0  # the wall clock set back once
        temps = {gpu: 40 + rng.random() * 50 for gpu in range(3 if step > 30 else 2) if not (gpu == 1 and 50 < step < 65)}
        xid += step % 17 == 0
        for s in (live, ref):
            # GPU 1 goes quiet for a while, GPU 2 appears late; a frame's rows come in one call, as the agent's
            s.write_many([(s.series_id("temp_c", {"gpu": str(gpu)}), t, v) for gpu, v in temps.items()])
            if step % 17 == 0:
                s.write("xid_total", {"gpu": "0"}, t, xid)
        if rng.random() < 0.15:
            live.flush()
        ref.flush()
        assert _answers(live_eval, t) == _answers(ref_eval, t), f"step {step}"
    assert feed.disordered  # the set-back clock made the feed give the series up to the store


def test_a_rule_fires_on_samples_that_were_never_committed(tmp_path):
    store = Store(tmp_path / "g.db")
    rt = AlertRuntime(store, learn_seconds=3600, rules=parse_rules(RULES), recent_seconds=12.0)
    sid = store.series_id("temp_c", {"gpu": "0"})
    store.write_id(sid, T0, 50.0)
    rt.evaluate(T0)  # the rule's series are watched from here on
    for i in range(1, 4):
        store.write_id(sid, T0 + i, 90.0)
    (state,) = rt.evaluate(T0 + 3)
    assert (state.state, state.value) == ("pending", 90.0)
    assert store.count_samples(sid, T0 + 1, T0 + 3) == 0  # read from memory: nothing of it committed
    rt.close()


class _StopAfter(SinkBase):
    ticks = True
    reads_unflushed = True

    def __init__(self, loop_ref: list[SamplingLoop], evaluations: int):
        self.loop_ref, self.left = loop_ref, evaluations

    def on_tick(self, now: float) -> None:
        self.left -= 1
        if self.left <= 0:
            self.loop_ref[0].stop()


def _commits_during_run(tmp_path, recent_seconds: float | None) -> tuple[int, int]:
    store = Store(tmp_path / f"run{recent_seconds}.db")
    rt = AlertRuntime(store, learn_seconds=3600, rules=parse_rules(RULES), recent_seconds=recent_seconds)
    commits = [0]
    store.commit_hook = lambda conn: commits.__setitem__(0, commits[0] + 1)
    ref: list[SamplingLoop] = []
    loop = SamplingLoop(FakeBackend(1), [StoreSink(store), EvaluatorSink(rt), _StopAfter(ref, 6)], store=store,
                        interval_seconds=0.01, evaluate_seconds=0.01, flush_seconds=3600.0)
    ref.append(loop)
    loop.run(duration_seconds=60)
    run_commits = commits[0] - 1  # less the last, when the run ends
    loop.close()
    rt.close()
    store.close()
    return run_commits, loop.stats.evaluations


def test_a_live_loop_whose_rules_read_the_feed_commits_only_every_flush_interval(tmp_path):
    commits, evaluations = _commits_during_run(tmp_path, recent_seconds=12.0)
    assert evaluations >= 6 and commits == 0
    commits, evaluations = _commits_during_run(tmp_path, recent_seconds=None)  # rules that read SQL only
    assert evaluations >= 6 and commits >= evaluations - 1


def test_a_rule_without_series_waits_for_them_and_then_answers(tmp_path):
    """Rules whose selectors match no series (training rules on a GPU-only node) are not evaluated
    again until one appears; then they answer at once."""
    store = Store(tmp_path / "g.db")
    rt = AlertRuntime(store, learn_seconds=3600, rules=parse_rules(RULES.replace("for: 30s", "for: 0s")), recent_seconds=12.0)
    assert rt.evaluate(T0) == [] and rt.evaluate(T0 + 1) == []
    store.write("temp_c", {"gpu": "3"}, T0 + 2, 95.0)
    (state,) = rt.evaluate(T0 + 2)
    assert (state.state, state.labels["gpu"], state.value) == ("firing", "3", 95.0)
    rt.close()
