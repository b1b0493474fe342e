"""A commit inserts its rows in the samples index's order (issue 28: cheaper commits) without changing
what readers see: samples of the same series and time keep the order they were written in."""

from __future__ import annotations


def test_rows_written_out_of_order_read_back_in_time_order_and_equal_times_in_written_order(store):
    a = store.series_id("gpu_power_watts", {"gpu": "0"})
    b = store.series_id("gpu_power_watts", {"gpu": "1"})
    t0 = 1_700_000_000.0
    store.write_many([(b, t0 + 2, 20.0), (a, t0 + 1, 1.0), (b, t0 + 1, 10.0), (a, t0 + 1, 0.25), (a, t0, 0.5)])
    store.flush()
    samples, position = store.window_after(a, t0 - 1, t0 + 5, 0)
    assert [(s.t - t0, s.value) for s in samples] == [(0, 0.5), (1, 1.0), (1, 0.25)]  # as written, not by value
    assert [s.value for s in store.window_after(b, t0 - 1, t0 + 5, 0)[0]] == [10.0, 20.0]
    store.write_many([(a, t0 + 3, 3.0)])
    store.flush()
    assert [s.value for s in store.window_after(a, t0 - 1, t0 + 5, position)[0]] == [3.0]  # only the later commit
