"""Baselines on real store files: learning gate, robust statistics, bands that tighten with
history, the time-of-day profile from 3 days on, refresh, freeze and reset (also across processes)."""

from __future__ import annotations

import numpy as np
import pytest

from gpulens.alerts.baseline import (
    DAY,
    BandSpec,
    Baseline,
    BaselineConfig,
    Baselines,
    Stats,
    freeze_baselines,
    load_baselines,
    reset_baselines,
)
from gpulens.alerts.expr import Selector
from gpulens.alerts.source import StoreSource
from gpulens.store import Store

T0 = 1_800_000_000.0 - 1_800_000_000.0 % DAY  # midnight UTC, so hours of the day are easy to read
LABELS = {"train_job": "j", "rank": "0", "host": "h"}


def _write(store: Store, name: str, ts: np.ndarray, vs: np.ndarray) -> None:
    sid = store.series_id(name, LABELS)
    store.write_many(zip([sid] * len(ts), ts.tolist(), vs.tolist(), strict=True))
    store.flush()


def _baselines(store: Store, name: str, **cfg) -> tuple[Baselines, StoreSource]:
    src = StoreSource(store)
    src.refresh()
    bl = Baselines(store, src, BaselineConfig(**cfg))
    bl.track(src.series(Selector(name)))
    return bl, src


def test_learning_gate_and_robust_statistics(store):
    rng = np.random.default_rng(1)
    ts = T0 + np.arange(0, 7200, 10.0)
    vs = rng.normal(0.5, 0.01, len(ts))
    vs[::20] = 50.0  # 5 % wild spikes while learning: the median and MAD barely move
    _write(store, "train_step_seconds", ts, vs)
    bl, src = _baselines(store, "train_step_seconds", learn_seconds=3600)
    ref = src.series(Selector("train_step_seconds"))[0]
    bl.update(T0 + 1800)
    assert bl.band(ref, T0 + 1800, True, None, BandSpec()) is None  # still learning: learned rules stay silent
    bl.update(T0 + 3600)
    (b,) = load_baselines(store)
    assert b.state == "ready" and b.window_start == T0 and b.window_end == T0 + 3600
    assert b.stats.median == pytest.approx(0.5, abs=0.005) and b.stats.mad < 0.02
    upper = bl.band(ref, T0 + 3600, True, None, BandSpec())
    assert 0.55 < upper < 1.0  # far below the spikes a mean/stddev band would have absorbed
    assert b.stats.quantiles[0.99] == pytest.approx(50.0)


def test_bands_tighten_with_history():
    stats = Stats(1000, 1.0, 0.1, {0.5: 1.0})
    b = Baseline(1, "m", {}, "ready", T0, DAY, stats=stats)
    spec = BandSpec(k_initial=6, k_final=4, tighten_days=28, min_relative_width=0)
    fresh, week, month, later = (b.band(T0 + d * DAY, True, None, spec) - 1.0 for d in (0, 7, 28, 60))
    assert fresh == pytest.approx(6 * 1.4826 * 0.1) and month == pytest.approx(4 * 1.4826 * 0.1)
    assert fresh > week > month == later
    assert b.band(T0, False, None, spec) == pytest.approx(1.0 - fresh)


@pytest.mark.parametrize("days, profiled", [(2, False), (4, True)])
def test_time_of_day_profile_from_three_days(store, days, profiled):
    # Busy mornings (UTC 0-11 h: about 100), quiet afternoons (about 10), one sample per 5 minutes.
    rng = np.random.default_rng(2)
    ts = T0 + np.arange(0, days * DAY, 300.0)
    hours = (ts % DAY) // 3600
    vs = np.where(hours < 12, 100.0, 10.0) + rng.normal(0, 1, len(ts))
    _write(store, "infer_queue_depth", ts, vs)
    bl, src = _baselines(store, "infer_queue_depth", learn_seconds=days * DAY)
    bl.update(T0 + days * DAY)
    (b,) = load_baselines(store)
    ref = src.series(Selector("infer_queue_depth"))[0]
    spec = BandSpec()
    morning = bl.band(ref, T0 + days * DAY + 3 * 3600, True, None, spec)
    afternoon = bl.band(ref, T0 + days * DAY + 15 * 3600, True, None, spec)
    if profiled:
        assert sorted(b.profile) == list(range(24))
        assert 100 < morning < 150 and 10 < afternoon < 20  # 60 in the afternoon is an anomaly
    else:
        assert b.profile == {} and afternoon > 100  # one band for the whole day: a quiet-hour spike passes


def test_refresh_freeze_and_reset(store):
    ts = T0 + np.arange(0, 600, 1.0)
    _write(store, "train_step_seconds", ts, np.full(len(ts), 1.0))
    bl, src = _baselines(store, "train_step_seconds", learn_seconds=300, refresh_seconds=60, history_seconds=300)
    bl.update(T0 + 300)
    assert load_baselines(store)[0].stats.median == 1.0
    # The job's normal changes (a deliberate upgrade): the trailing window moves the baseline along.
    _write(store, "train_step_seconds", T0 + np.arange(600, 1200, 1.0), np.full(600, 2.0))
    bl.update(T0 + 1200)
    assert load_baselines(store)[0].stats.median == 2.0

    # Frozen (from "another process": the CLI): refreshing stops, a slow drift is not learned.
    assert [b.name for b in freeze_baselines(store, "train_step_seconds")] == ["train_step_seconds"]
    _write(store, "train_step_seconds", T0 + np.arange(1200, 1800, 1.0), np.full(600, 3.0))
    bl.update(T0 + 1800)
    (b,) = load_baselines(store)
    assert b.state == "frozen" and b.stats.median == 2.0
    ref = src.series(Selector("train_step_seconds"))[0]
    assert bl.band(ref, T0 + 1800, True, None, BandSpec()) == pytest.approx(2.5)

    # Reset: learning again from now, older samples no longer count, learned rules silent meanwhile.
    reset_baselines(store, labels={"train_job": "j"}, now=T0 + 1800)
    bl.update(T0 + 1801)
    assert bl.band(ref, T0 + 1801, True, None, BandSpec()) is None
    _write(store, "train_step_seconds", T0 + np.arange(1800, 2200, 1.0), np.full(400, 3.0))
    bl.update(T0 + 2100)
    (b,) = load_baselines(store)
    assert b.state == "ready" and b.learn_start == T0 + 1800 and b.stats.median == 3.0


def test_a_band_of_a_time_never_reaches_below_zero():
    """`baseline show` printed a latency band of -2.907 – 6.112 s: a time, size, rate or share has no
    negative values, so the band's low side stops at zero; a loss (no unit) keeps its arithmetic."""
    from gpulens.alerts.baseline import BandSpec, Baseline, Stats

    wide = Stats(100, 1.6, 1.0, {0.5: 1.6})
    latency = Baseline(1, "infer_request_latency_seconds", {}, "ready", 0.0, 60.0, stats=wide)
    lo, hi = latency.band(120.0, False, None, BandSpec()), latency.band(120.0, True, None, BandSpec())
    assert lo == 0.0 and hi > 1.6
    loss = Baseline(2, "train_loss", {}, "ready", 0.0, 60.0, stats=wide)
    assert loss.band(120.0, False, None, BandSpec()) < 0
