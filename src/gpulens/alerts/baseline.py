"""Baselines: robust statistics of one series over its learning period, stored in the store.

A series is learned from its first sample for `learn_seconds` (and until it has `min_samples`);
then its learned rules may fire. Statistics are the median, the MAD and a set of quantiles, plus a
time-of-day profile (per UTC hour) once three days or more of history exist. After learning, a
baseline is refreshed now and then over the trailing week (robust statistics shrug off the odd
incident, and a series with an active learned alert is not refreshed); `freeze` stops that, `reset`
starts learning again from now (after a deliberate change: a new model, a new batch size).

Bands are computed at evaluation time: centre (median or a quantile) ± k · 1.4826 · MAD, where k
falls from `k_initial` to `k_final` as the series' history grows to `tighten_days` - thresholds
tighten as evidence accumulates - and never narrower than the rule's relative or absolute floor.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Literal

from gpulens.alerts.source import SeriesRef, StoreSource
from gpulens.store import Store
from gpulens.store import baselines as repo
from gpulens.vocab.directions import lookup

QUANTILES = (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)
MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation
PROFILE_MIN_DAYS = 3.0
CHANGED_META_KEY = "alerts.baselines_changed"  # bumped by freeze/reset so a running agent reloads
DAY = 86400.0

BaselineState = Literal["learning", "ready", "frozen"]


@dataclass(frozen=True)
class BandSpec:
    """How wide a learned band is. Set per file (`baseline:`) and per rule (`band:`)."""

    k_initial: float = 6.0
    k_final: float = 4.0
    tighten_days: float = 28.0
    min_relative_width: float = 0.25  # of the centre
    min_width: float = 0.0  # in the series' unit

    def k_at(self, history_seconds: float) -> float:
        frac = min(1.0, max(0.0, history_seconds / (self.tighten_days * DAY))) if self.tighten_days > 0 else 1.0
        return self.k_initial - (self.k_initial - self.k_final) * frac


@dataclass(frozen=True)
class Stats:
    samples: int
    median: float
    mad: float
    quantiles: dict[float, float]

    def centre(self, q: float | None) -> float:
        if q is None or q == 0.5:
            return self.median
        if q in self.quantiles:
            return self.quantiles[q]
        qs = sorted(self.quantiles)
        lo = max((x for x in qs if x <= q), default=qs[0])
        hi = min((x for x in qs if x >= q), default=qs[-1])
        if hi == lo:
            return self.quantiles[lo]
        return self.quantiles[lo] + (self.quantiles[hi] - self.quantiles[lo]) * (q - lo) / (hi - lo)

    def to_json(self) -> dict:
        return {"samples": self.samples, "median": self.median, "mad": self.mad, "quantiles": {str(k): v for k, v in self.quantiles.items()}}

    @staticmethod
    def from_json(d: dict) -> Stats:
        return Stats(int(d["samples"]), float(d["median"]), float(d["mad"]), {float(k): float(v) for k, v in d["quantiles"].items()})


NON_NEGATIVE_UNITS = frozenset({"s", "bytes", "1/s", "ratio"})  # units of vocab.directions


@dataclass
class Baseline:
    series_id: int
    name: str
    labels: dict[str, str]
    state: BaselineState
    learn_start: float
    learn_seconds: float
    computed_at: float | None = None
    window_start: float | None = None
    window_end: float | None = None
    stats: Stats | None = None
    profile: dict[int, Stats] = field(default_factory=dict)  # UTC hour -> stats

    @property
    def ready(self) -> bool:
        return self.state != "learning" and self.stats is not None

    def band(self, t: float, upper: bool, q: float | None, spec: BandSpec) -> float | None:
        if not self.ready:
            return None
        stats = self.profile.get(int(t % DAY // 3600)) or self.stats
        assert stats is not None
        centre = stats.centre(q)
        k = spec.k_at(t - self.learn_start)
        width = max(k * MAD_TO_SIGMA * stats.mad, spec.min_relative_width * abs(centre), spec.min_width)
        if upper:
            return centre + width
        # A time, a size, a rate or a share is never below zero: a band reaching under it says nothing.
        return max(0.0, centre - width) if self.never_negative else centre - width

    @property
    def never_negative(self) -> bool:
        """Whether the series' unit cannot go below zero (seconds, bytes, per second, a share)."""
        return lookup(self.name).unit in NON_NEGATIVE_UNITS


def robust_stats(values: list[float]) -> Stats:
    import numpy as np  # here, not at the top: the agent's start-up does not load numpy

    from gpulens.stats import percentiles

    a = np.asarray(values, dtype=float)
    med = float(np.median(a))
    mad = float(np.median(np.abs(a - med)))
    qv = percentiles(a, [100 * q for q in QUANTILES])
    return Stats(len(a), med, mad, {q: float(v) for q, v in zip(QUANTILES, qv, strict=True)})  # type: ignore[arg-type]


@dataclass
class BaselineConfig:
    learn_seconds: float = 7 * DAY
    min_samples: int = 10
    refresh_seconds: float = 3600.0  # how often a ready baseline is recomputed (never sooner than learn_seconds)
    history_seconds: float = 7 * DAY  # the trailing window a refresh reads (raw samples are kept 8 days)
    band: BandSpec = field(default_factory=BandSpec)


class Baselines:
    """The baselines of the series that learned rules watch, kept in the store's `alert_baselines`."""

    def __init__(self, store: Store, source: StoreSource, config: BaselineConfig):
        self.store = store
        self.source = source
        self.config = config
        self._cache: dict[int, Baseline] = {}
        self._tracked: dict[int, SeriesRef] = {}
        self._refresh_cursor = 0
        self._stamp = store.get_meta(CHANGED_META_KEY)
        self._load()
        repo.set_learning_seconds(store, config.learn_seconds)
        for b in self._cache.values():
            if b.state == "learning":
                b.learn_seconds = config.learn_seconds

    def _load(self) -> None:
        self._cache = {b.series_id: b for b in load_baselines(self.store)}

    def get(self, series_id: int) -> Baseline | None:
        return self._cache.get(series_id)

    def track(self, refs: list[SeriesRef]) -> None:
        for r in refs:
            self._tracked.setdefault(r.id, r)

    def band(self, ref: SeriesRef, t: float, upper: bool, q: float | None, spec: BandSpec) -> float | None:
        b = self._cache.get(ref.id)
        return None if b is None else b.band(t, upper, q, spec)

    def update(self, now: float, hold: set[int] = frozenset()) -> list[Baseline]:  # type: ignore[assignment]
        """Start, finish or refresh learning as time passes. Returns the baselines that changed."""
        changed = []
        if not self.source.store_unchanged:  # (refreshed just before) else no process changed the stamp
            stamp = self.store.get_meta(CHANGED_META_KEY)
            if stamp != self._stamp:  # another process froze or reset baselines
                self._stamp = stamp
                self._load()
        for sid, ref in self._tracked.items():
            b = self._cache.get(sid)
            if b is None:
                first = self.source.first_time(sid)
                if first is None:
                    continue
                b = Baseline(sid, ref.name, ref.labels, "learning", first, self.config.learn_seconds)
                self._cache[sid] = b
                self._save(b)
            if b.state == "learning" and now >= b.learn_start + b.learn_seconds:
                if self._learn(b, now):
                    changed.append(b)
        # Refresh at most one ready baseline per call: spreads the cost of reading a week of samples.
        ready = [b for b in self._cache.values() if b.state == "ready" and b.series_id in self._tracked]
        if ready:
            self._refresh_cursor = (self._refresh_cursor + 1) % len(ready)
            b = ready[self._refresh_cursor]
            every = max(self.config.refresh_seconds, b.learn_seconds)
            if b.series_id not in hold and b.computed_at is not None and now - b.computed_at >= every:
                start = max(b.learn_start, now - self.config.history_seconds)
                if self._compute(b, start, now, now):
                    changed.append(b)
        return changed

    def _learn(self, b: Baseline, now: float) -> bool:
        end = b.learn_start + b.learn_seconds
        n = self.store.count_samples(b.series_id, b.learn_start, end)
        if n < self.config.min_samples:
            end = now  # keep learning until there is enough to be robust
        return self._compute(b, b.learn_start, end, now)

    def _compute(self, b: Baseline, start: float, end: float, now: float) -> bool:
        rows = self.store.window(b.series_id, start, end, include_start=True)
        if len(rows) < self.config.min_samples:
            return False
        b.stats = robust_stats([v for _, v in rows])
        b.profile = {}
        if end - start >= PROFILE_MIN_DAYS * DAY:
            by_hour: dict[int, list[float]] = {}
            for t, v in rows:
                by_hour.setdefault(int(t % DAY // 3600), []).append(v)
            b.profile = {h: robust_stats(vs) for h, vs in by_hour.items() if len(vs) >= self.config.min_samples}
        b.state = "ready" if b.state == "learning" else b.state
        b.computed_at, b.window_start, b.window_end = now, start, end
        self._save(b)
        return True

    def _save(self, b: Baseline) -> None:
        save_baseline(self.store, b)


# ---------------------------------------------------------------- table access (also for the CLI)
def save_baseline(store: Store, b: Baseline) -> None:
    st = b.stats
    repo.save_baseline(store, repo.BaselineRow(
        b.series_id, b.name, b.labels, b.state, b.learn_start, b.learn_seconds, b.computed_at, b.window_start,
        b.window_end, st.samples if st else 0, st.median if st else None, st.mad if st else None,
        dict(st.quantiles) if st else {}, {h: s.to_json() for h, s in b.profile.items()},
    ))


def load_baselines(store: Store, name: str | None = None, labels: dict[str, str] | None = None) -> list[Baseline]:
    out = []
    for r in repo.load_baselines(store):
        if name is not None and r.name != name:
            continue
        if labels and any(r.labels.get(k) != v for k, v in labels.items()):
            continue
        stats = None
        if r.median is not None:
            stats = Stats(r.samples, float(r.median), float(r.mad or 0.0), r.quantiles)
        profile = {h: Stats.from_json(s) for h, s in r.profile.items()}
        out.append(Baseline(r.series_id, r.name, r.labels, r.state, r.learn_start, r.learn_seconds,  # type: ignore[arg-type]
                            r.computed_at, r.window_start, r.window_end, stats, profile))
    return out


def freeze_baselines(store: Store, name: str | None = None, labels: dict[str, str] | None = None) -> list[Baseline]:
    """Stop refreshing the matching ready baselines. Returns those frozen."""
    done = []
    for b in load_baselines(store, name, labels):
        if b.state == "ready":
            b = replace(b, state="frozen")
            save_baseline(store, b)
            done.append(b)
    store.set_meta(CHANGED_META_KEY, repr(time.time()))
    return done


def reset_baselines(
    store: Store, name: str | None = None, labels: dict[str, str] | None = None, *, now: float | None = None
) -> list[Baseline]:
    """Forget the matching baselines and learn them again from `now`: samples before it no longer count."""
    now = time.time() if now is None else now
    done = []
    for b in load_baselines(store, name, labels):
        fresh = Baseline(b.series_id, b.name, b.labels, "learning", now, b.learn_seconds)
        save_baseline(store, fresh)
        done.append(fresh)
    store.set_meta(CHANGED_META_KEY, repr(time.time()))
    return done


def describe_band(b: Baseline, spec: BandSpec, now: float) -> tuple[float, float] | tuple[None, None]:
    lo, hi = b.band(now, False, None, spec), b.band(now, True, None, spec)
    return (lo, hi) if lo is not None and hi is not None and not math.isnan(lo) else (None, None)
