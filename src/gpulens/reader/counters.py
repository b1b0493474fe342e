"""Counters read back: per-second rates, rises across restarts, and the counters of several
processes (a `pid` label each, `names.PER_PROCESS_SERIES`) added up into one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpulens.store.types import SeriesData
from gpulens.vocab.names import PID_LABEL


def counter_increases(t: Sequence[float], v: Sequence[float], *, born_inside: bool) -> list[tuple[float, float]]:
    """(time, increase) at each sample where a counter rose. A drop is a restart: the new value is
    the increase. A series born inside the read (no sample before it in the lookback) counts its
    first value from zero: the agent creates an XID series at its first XID."""
    out = [(t[0], v[0])] if born_inside and t and v[0] > 0 else []
    for i in range(1, len(t)):
        d = v[i] - v[i - 1]
        if d < 0:
            d = v[i]
        if d > 0:
            out.append((t[i], d))
    return out


def counter_rate(t: list[float], vmax: list[float]) -> tuple[list[float], list[float | None]]:
    """Per-second increase of a counter between consecutive buckets (bucket maxima = last values).
    A drop means the counter restarted: the new value is the increase."""
    out_t, out_v = [], []
    for i in range(1, len(t)):
        dt = t[i] - t[i - 1]
        if dt <= 0:
            continue
        dv = vmax[i] - vmax[i - 1]
        out_t.append(t[i])
        out_v.append((dv if dv >= 0 else vmax[i]) / dt)
    return out_t, out_v


def without_pid(labels: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k != PID_LABEL}


def summed_counter(series: list[SeriesData]) -> tuple[list[float], list[float]]:
    """Counters of several processes (bucket maxima = last values) as one: each one's rises (a drop
    is a restart, its new value the rise), added up in time order from 0. A counter's first point
    has no earlier one to rise from, as in `counter_rate`."""
    rises: list[tuple[float, float]] = []
    for d in series:
        rises += counter_increases(d.t, d.value_max, born_inside=False)
    t0 = min(d.t[0] for d in series)
    times, total, running = [t0], [0.0], 0.0
    for t, rise in sorted(rises):
        running += rise
        if t == times[-1]:
            total[-1] = running
        else:
            times.append(t)
            total.append(running)
    return times, total
