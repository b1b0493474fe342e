"""Range windows kept across evaluations give the same answers as reading the window afresh
(issue 18, point 9: the cost stays flat; the answers must not change)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.alerts.evaluate import Evaluator
from gpulens.alerts.expr import parse_expr
from gpulens.alerts.source import StoreSource
from gpulens.store import Store

EXPRS = [
    "increase(c[30s])", "rate(c[30s])", "avg_over_time(g[20s])", "max_over_time(g[20s])", "min_over_time(g[20s])",
    "count_over_time(g[20s])", "last_over_time(g[20s])", "delta(g[20s])", "quantile_over_time(0.9, g[20s])",
]


@settings(max_examples=25, deadline=None)
@given(
    steps=st.lists(st.tuples(st.floats(min_value=0.1, max_value=7.0), st.floats(min_value=-50, max_value=50)), min_size=1, max_size=60),
    evals_every=st.integers(min_value=1, max_value=5),
)
def test_kept_windows_answer_as_fresh_ones(steps, evals_every):
    with tempfile.TemporaryDirectory() as d, Store(Path(d) / "s.db") as store:
        kept = Evaluator(StoreSource(store))
        t, counter = 1000.0, 0.0
        for i, (dt, v) in enumerate(steps):
            t += dt
            counter = counter + abs(v) if v >= -40 else 0.0  # a reset now and then
            store.write("c", {"gpu": "0"}, t, counter)
            store.write("g", {"gpu": "0"}, t, v)
            store.flush()
            if i % evals_every:
                continue
            kept.source.refresh()
            fresh = Evaluator(StoreSource(store))
            fresh.source.refresh()
            for text in EXPRS:
                a = kept.vector(parse_expr(text).root, t + 0.05)
                b = fresh.vector(parse_expr(text).root, t + 0.05)
                assert a.keys() == b.keys(), text
                for k in a:
                    assert a[k] == pytest.approx(b[k], rel=1e-9, abs=1e-9), text


def test_a_late_sample_inside_the_window_is_seen(tmp_path):
    with Store(tmp_path / "s.db") as store:
        ev = Evaluator(StoreSource(store))
        for i in range(10):
            store.write("g", None, 100.0 + i, 1.0)
        store.flush()
        expr = parse_expr("count_over_time(g[60s])").root
        ev.source.refresh()
        assert ev.vector(expr, 110.0) == {(): 10.0}
        store.write("g", None, 105.5, 1.0)  # committed after the evaluation, timed before it
        store.write("g", None, 111.0, 1.0)
        store.flush()
        assert ev.vector(expr, 112.0) == {(): 12.0}
