"""Evaluates a parsed rule expression at one instant against the store, with PromQL's meaning for
the subset in `expr.py` (comparisons filter, vectors match on identical label sets, ranges are
left-open (t - range, t]). Without extrapolation: `increase` is the plain sum of counter steps,
which is what an alert on "any new XID" wants."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass

from gpulens.alerts.expr import (
    AGGREGATIONS,
    BAND_FUNCTIONS,
    COMPARISONS,
    EVENT_FUNCTIONS,
    Aggregate,
    Binary,
    Call,
    Neg,
    Node,
    Number,
    Selector,
)
from gpulens.alerts.source import LabelKey, SeriesRef, StoreSource

Vector = dict[LabelKey, float]
# (series, now, upper?, quantile or None) -> the learned threshold, or None while still learning
BandFn = Callable[[SeriesRef, float, bool, float | None], float | None]

DEFAULT_LOOKBACK_SECONDS = 300.0  # as Prometheus: an instant selector sees values up to 5 minutes old


@dataclass
class Evaluator:
    source: StoreSource
    lookback_seconds: float = DEFAULT_LOOKBACK_SECONDS

    def vector(self, node: Node, t: float, band: BandFn | None = None) -> Vector:
        """The result of a rule expression as a vector (a scalar result becomes one unlabelled element)."""
        out = self._eval(node, t, band)
        if isinstance(out, float):
            return {} if math.isnan(out) else {(): out}
        return out

    # ------------------------------------------------------------------
    def _eval(self, node: Node, t: float, band: BandFn | None) -> Vector | float:
        if isinstance(node, Number):
            return node.value
        if isinstance(node, Selector):
            return self.source.last_values(node, t, self.lookback_seconds)
        if isinstance(node, Neg):
            inner = self._eval(node.expr, t, band)
            return -inner if isinstance(inner, float) else {k: -v for k, v in inner.items()}
        if isinstance(node, Call):
            return self._call(node, t, band)
        if isinstance(node, Aggregate):
            return self._aggregate(node, t, band)
        if isinstance(node, Binary):
            return self._binary(node, t, band)
        raise TypeError(node)

    def _call(self, node: Call, t: float, band: BandFn | None) -> Vector:
        f = node.func
        if f in BAND_FUNCTIONS:
            sel = node.args[0]
            assert isinstance(sel, Selector)
            q = node.args[1].value if len(node.args) > 1 else None  # type: ignore[union-attr]
            out: Vector = {}
            if band is None:
                return out
            for s in self.source.series(sel):
                v = band(s, t, f == "upper_band", q)
                if v is not None:
                    out[s.key] = v
            return out
        if f in EVENT_FUNCTIONS:
            sel = node.args[0]
            assert isinstance(sel, Selector) and sel.range_seconds is not None
            win = self.source.event_window(sel.name, sel.range_seconds, t)
            return {k: float(n) for k, n in win.counts.items()
                    if all(m.matches(win.labels[k]) for m in sel.matchers)}
        q = None
        rng = node.args[-1]
        if f == "quantile_over_time":
            q = node.args[0].value  # type: ignore[union-attr]
        assert isinstance(rng, Selector) and rng.range_seconds is not None
        w = rng.range_seconds
        if f == "last_over_time":
            # the newest sample in (t - w, t]: an instant selector with the range as its lookback, read
            # as one lookup per series (no window of every sample to keep; GpuSilent reads two ranges)
            return self.source.last_values(rng, t, w)
        out = {}
        for s in self.source.series(rng):
            win = self.source.range_window(s.id, w, t, sorted_values=f == "quantile_over_time")
            if not len(win):
                continue
            if f in ("increase", "rate"):
                # counter steps, a reset counted from zero and a counter first seen inside the window
                # counted from zero too: its first error is news (see RangeWindow)
                out[s.key] = win.step_sum / w if f == "rate" else win.step_sum
            elif f == "avg_over_time":
                out[s.key] = win.sum / len(win)
            elif f == "max_over_time":
                out[s.key] = win.max
            elif f == "min_over_time":
                out[s.key] = win.min
            elif f == "count_over_time":
                out[s.key] = float(len(win))
            elif f == "delta":
                out[s.key] = win.last - win.first
            elif f == "quantile_over_time":
                out[s.key] = win.quantile(q)  # type: ignore[arg-type]  # read by rank off the kept sorted values
        return out

    def _aggregate(self, node: Aggregate, t: float, band: BandFn | None) -> Vector:
        inner = self._eval(node.expr, t, band)
        if isinstance(inner, float):
            inner = {(): inner}
        groups: dict[LabelKey, list[float]] = {}
        for key, v in inner.items():
            if node.by is not None:
                g = tuple((k, val) for k, val in key if k in node.by)
            elif node.without is not None:
                g = tuple((k, val) for k, val in key if k not in node.without)
            else:
                g = ()
            groups.setdefault(g, []).append(v)
        op = node.op
        assert op in AGGREGATIONS
        fn = {"sum": sum, "max": max, "min": min, "count": len, "avg": lambda xs: sum(xs) / len(xs)}[op]
        return {g: float(fn(vs)) for g, vs in groups.items()}

    def _binary(self, node: Binary, t: float, band: BandFn | None) -> Vector | float:
        left = self._eval(node.left, t, band)
        if node.op in ("and", "unless") and isinstance(left, dict) and not left:
            return {}  # nothing to filter: skip the right side's queries
        right = self._eval(node.right, t, band)
        op = node.op
        if op in ("and", "or", "unless"):
            assert isinstance(left, dict) and isinstance(right, dict)
            if op == "and":
                return {k: v for k, v in left.items() if k in right}
            if op == "unless":
                return {k: v for k, v in left.items() if k not in right}
            return {**right, **left}
        if isinstance(left, float) and isinstance(right, float):
            r = _apply(op, left, right)
            if op in COMPARISONS:
                return left if r else math.nan
            return r
        if isinstance(left, float):
            assert isinstance(right, dict)
            return _elementwise(op, right, lambda _k, v: _apply(op, left, v))
        if isinstance(right, float):
            compare = _COMPARE.get(op)
            if compare is not None:  # the common rule shape, `vector > threshold`: a filter, one pass
                return {k: v for k, v in left.items() if compare(v, right)}
            return _elementwise(op, left, lambda _k, v: _apply(op, v, right))
        matched = {k: v for k, v in left.items() if k in right}  # one-to-one on identical label sets
        return _elementwise(op, matched, lambda k, v: _apply(op, v, right[k]))


# Comparisons as filters: NaN compares false, so it drops out as `_elementwise` drops it.
_COMPARE: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, "<": operator.lt, ">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
}


def _apply(op: str, a: float, b: float) -> float:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0:
            return math.nan if a == 0 else math.copysign(math.inf, a)
        return a / b
    if op == ">":
        return float(a > b)
    if op == "<":
        return float(a < b)
    if op == ">=":
        return float(a >= b)
    if op == "<=":
        return float(a <= b)
    if op == "==":
        return float(a == b)
    if op == "!=":
        return float(a != b)
    raise ValueError(op)


def _elementwise(op: str, vector: dict, apply: Callable[[LabelKey, float], float]) -> dict:
    """`op` applied to each element of a vector (against a scalar or the matching element of another
    vector): comparisons filter (keeping the element's value, as PromQL does), arithmetic maps, and
    NaN results drop out."""
    out = {}
    for k, v in vector.items():
        r = apply(k, v)
        if op in COMPARISONS:
            if r:
                out[k] = v
        elif not math.isnan(r):
            out[k] = r
    return out
