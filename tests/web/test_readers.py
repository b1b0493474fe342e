"""The store reader's arithmetic against numpy over the same samples: roll-up sums, quantile buckets,
counter rates, event rates, and the learned baseline band."""

from __future__ import annotations

import numpy as np
import pytest

from gpulens.reader.store import (
    LONG_WINDOW_SECONDS,
    SAMPLES_PER_QUANTILE_BUCKET,
    StoreReader,
    counter_rate,
    quantile_buckets,
)
from gpulens.store import Store
from gpulens.views.data import Selection, Window, build_panel
from gpulens.views.readers import store_reader

T0 = 1_700_000_000.0
LABELS = {"gpu": "0", "host": "h"}


@pytest.fixture(scope="module")
def three_hours(tmp_path_factory):
    """3 h of 1 s samples on two GPUs (random values), so aggregates cross the roll-up path."""
    db = tmp_path_factory.mktemp("reader") / "s.db"
    rng = np.random.default_rng(7)
    t = T0 + np.arange(3 * 3600, dtype=float)
    values = {g: rng.normal(300, 50, len(t)) for g in ("0", "1")}
    with Store(db, batch_size=20_000) as s:
        for g, v in values.items():
            sid = s.series_id("gpu_power_watts", {**LABELS, "gpu": g})
            s.write_many((sid, float(a), float(b)) for a, b in zip(t, v, strict=True))
    reader = StoreReader(db)
    yield reader, t, values
    reader.close()


@pytest.mark.parametrize(("start_off", "end_off"), [(30.5, 3 * 3600 - 17.2), (0.0, 600.0), (59.0, 2 * 3600 + 61.0)])
def test_aggregates_equal_numpy_on_both_paths(three_hours, start_off, end_off):
    reader, t, values = three_hours
    start, end = T0 + start_off, T0 + end_off
    sel = (t >= start) & (t <= end)
    both = np.concatenate([values["0"][sel], values["1"][sel]])
    assert (end - start > LONG_WINDOW_SECONDS) == (end_off - start_off > 7200)
    assert reader.aggregate("gpu_power_watts", {}, "count", start, end) == len(both)
    assert reader.aggregate("gpu_power_watts", {}, "mean", start, end) == pytest.approx(both.mean(), rel=1e-12)
    assert reader.aggregate("gpu_power_watts", {}, "max", start, end) == both.max()
    assert reader.aggregate("gpu_power_watts", {}, "min", start, end) == both.min()
    assert reader.aggregate("gpu_power_watts", {"gpu": "1"}, "max", start, end) == values["1"][sel].max()
    assert reader.aggregate("gpu_power_watts", {}, "p95", start, end) == pytest.approx(np.percentile(both, 95))


def test_downsampled_lines_keep_the_extremes(three_hours):
    reader, t, values = three_hours
    lines = reader.line("gpu_power_watts", {"gpu": "0"}, T0, T0 + 3 * 3600, 100)
    assert len(lines) == 1 and 50 <= len(lines[0].t) <= 100
    assert max(lines[0].value_max) == values["0"].max()
    assert min(lines[0].value_min) == values["0"].min()


def test_quantile_buckets_hold_enough_samples():
    rng = np.random.default_rng(1)
    t = np.sort(rng.uniform(0, 100, 400))
    v = rng.exponential(1.0, 400)
    mids, groups, width = quantile_buckets(t, v, 0, 100, points=400)
    assert sum(len(g) for g in groups) == 400  # every sample in exactly one bucket
    assert len(groups) <= 400 // SAMPLES_PER_QUANTILE_BUCKET
    assert np.mean([len(g) for g in groups]) >= SAMPLES_PER_QUANTILE_BUCKET * 0.9
    assert all(t.min() <= m <= t.max() for m in mids) and width > 0


def test_counter_rate_survives_a_restart():
    t = [0.0, 10.0, 20.0, 30.0]
    v = [100.0, 150.0, 5.0, 25.0]  # restarted between 10 s and 20 s
    ts, rates = counter_rate(t, v)
    assert ts == [10.0, 20.0, 30.0]
    assert rates == [5.0, 0.5, 2.0]


def test_events_per_second_counts_events(tmp_path):
    db = tmp_path / "e.db"
    with Store(db) as s:
        for i in range(600):  # 2 requests per second for 300 s
            s.write("infer_request_latency_seconds", {"service": "s"}, T0 + i * 0.5, 0.1)
    with StoreReader(db) as r:
        (line,) = r.events_per_second("infer_request_latency_seconds", {}, T0, T0 + 300, 600)
        assert np.median([v for v in line.value if v is not None]) == pytest.approx(2.0, rel=0.1)


def test_learned_baseline_band_is_drawn(tmp_path):
    baseline = pytest.importorskip("gpulens.alerts.baseline")
    db = tmp_path / "b.db"
    with Store(db) as s:
        for i in range(120):
            s.write("gpu_temperature_celsius", LABELS, T0 + i, 50.0 + (i % 5))
        s.flush()  # the baselines table exists in every store (a schema migration)
        sid = s.series_id("gpu_temperature_celsius", LABELS)
        stats = baseline.robust_stats([50.0 + (i % 5) for i in range(120)])
        baseline.save_baseline(s, baseline.Baseline(sid, "gpu_temperature_celsius", LABELS, "ready", T0 - 86400, 86400, stats=stats))
    with store_reader(db) as r:  # the views' store reader: bands from gpulens.alerts
        panel = build_panel(r, "gpu", Window(T0, T0 + 120), Selection(), 100)
    temp = next(c for c in panel.charts if c.id == "gpu_temperature")
    assert temp.band is not None and temp.band["low"] < 52 < temp.band["high"]
    power = next(c for c in panel.charts if c.id == "gpu_power")
    assert power.band is None  # no baseline learned for it
