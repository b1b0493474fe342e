"""Range windows kept across evaluations give the same answers as reading the window afresh
(issue 18, point 9: the cost stays flat; the answers must not change)."""

from __future__ import annotations

import bisect
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulens.alerts.evaluate import Evaluator
from gpulens.alerts.expr import parse_expr
from gpulens.alerts.source import StoreSource
from gpulens.alerts.windows import SortedValues
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


@settings(max_examples=30, deadline=None)
@given(
    steps=st.lists(st.tuples(st.floats(min_value=0.05, max_value=9.0), st.floats(min_value=-1e6, max_value=1e6),
                             st.integers(min_value=0, max_value=3)), min_size=1, max_size=80),
    q=st.sampled_from([0.0, 0.01, 0.5, 0.9, 0.95, 0.99, 1.0]),
)
def test_incremental_quantiles_and_event_counts_equal_a_naive_recomputation(steps, q):
    """Issue 27 item 9: the kept sorted window read by rank, and the kept event counts, answer
    exactly what sorting the raw window with gpulens.stats, and counting the raw events, answers."""
    from gpulens import stats

    with tempfile.TemporaryDirectory() as d, Store(Path(d) / "s.db") as store:
        kept = Evaluator(StoreSource(store))
        quant = parse_expr(f"quantile_over_time({q}, g[20s])").root
        events = parse_expr("count_events_over_time(xid[20s])").root
        only_gpu1 = parse_expr('count_events_over_time(xid{gpu="1"}[20s])').root
        t = 1000.0
        for dt, v, n_events in steps:
            t += dt
            store.write("g", {"gpu": "0"}, t, v)
            for k in range(n_events):  # 0..3 events, on one of two GPUs
                store.event("xid", t, {"gpu": str(k % 2), "xid": "79"})
            store.flush()
            kept.source.refresh()
            now = t + 0.05
            raw = [p.value for p in store.window(store.series_id("g", {"gpu": "0"}), now - 20.0, now)]
            got = kept.vector(quant, now)
            want = stats.quantile(raw, q)
            assert list(got.values()) == pytest.approx([want] if want is not None else [], rel=1e-12, abs=1e-9)
            naive: dict = {}
            for e in store.events("xid", start=now - 20.0, end=now, include_start=False):
                key = tuple(sorted(e.labels.items()))
                naive[key] = naive.get(key, 0.0) + 1.0
            assert kept.vector(events, now) == naive
            assert kept.vector(only_gpu1, now) == {k: v for k, v in naive.items() if ("gpu", "1") in k}


def test_a_late_event_inside_the_window_is_counted_once(tmp_path):
    with Store(tmp_path / "s.db") as store:
        ev = Evaluator(StoreSource(store))
        expr = parse_expr("count_events_over_time(xid[60s])").root
        for i in range(5):
            store.event("xid", 100.0 + i, {"gpu": "0"})
        store.flush()
        ev.source.refresh()
        assert ev.vector(expr, 110.0) == {(("gpu", "0"),): 5.0}
        assert ev.vector(expr, 111.0) == {(("gpu", "0"),): 5.0}  # the same events read again are not counted twice
        store.event("xid", 108.0, {"gpu": "0"})  # committed after the evaluation, timed before it
        store.event("xid", 112.0, {"gpu": "0"})
        store.flush()
        assert ev.vector(expr, 113.0) == {(("gpu", "0"),): 7.0}
        assert ev.vector(expr, 161.0) == {(("gpu", "0"),): 5.0}  # 100 and 101 left the window


def test_an_event_timed_ahead_is_counted_when_its_time_comes(tmp_path):
    """Issue 28: an evaluation with nothing committed since the last one reads no events; one read
    earlier but timed after that evaluation (a monitor's clock ahead) still counts when its time comes."""
    with Store(tmp_path / "s.db") as store:
        ev = Evaluator(StoreSource(store))
        expr = parse_expr("count_events_over_time(nan[60s])").root
        store.event("nan", 100.0, {"job": "a"})
        store.event("nan", 105.0, {"job": "a"})  # ahead of the next evaluations
        store.flush()
        answers = []
        for t in (101.0, 102.0, 103.0, 106.0, 161.0, 166.0):
            ev.source.refresh()
            answers.append(ev.vector(expr, t).get((("job", "a"),), 0.0))
        assert answers == [1.0, 1.0, 1.0, 2.0, 1.0, 0.0]
        assert ev.source.events_unchanged()  # the later evaluations read nothing


def test_an_event_another_process_commits_is_seen(tmp_path):
    """The store's change token sees commits made on another connection (SQLite's data_version)."""
    with Store(tmp_path / "s.db") as store, Store(tmp_path / "s.db") as other:
        ev = Evaluator(StoreSource(store))
        expr = parse_expr("count_events_over_time(nan[60s])").root
        for t in (100.0, 101.0):
            ev.source.refresh()
            assert ev.vector(expr, t) == {}
        other.event("nan", 101.5, {"job": "b"})
        other.flush()
        ev.source.refresh()
        assert not ev.source.events_unchanged()
        assert ev.vector(expr, 102.0) == {(("job", "b"),): 1.0}


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(min_value=-20, max_value=20)), max_size=300),
       load=st.sampled_from([1, 2, 4, SortedValues.LOAD]))
def test_sorted_blocks_hold_what_a_sorted_list_holds(ops, load):
    """The quantile windows' sorted blocks (split, emptied, duplicates) against a plain sorted list."""
    blocks = type("Small", (SortedValues,), {"LOAD": load})()
    ref: list[float] = []
    for add, v in ops:
        if add or not ref:
            blocks.add(float(v))
            bisect.insort(ref, float(v))
        else:
            gone = ref.pop(abs(v) % len(ref))
            blocks.remove(gone)
        assert len(blocks) == len(ref) and list(blocks) == ref
        assert [blocks[k] for k in range(len(ref))] == ref
        if ref:
            assert blocks[-1] == ref[-1]
