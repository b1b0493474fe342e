"""Latency objectives: `p99_latency<=500ms`, `p95_ttft<=200ms`, `mean_tpot<=50ms`, `error_rate<=1%`.

An SLO holds for a run when the run's statistic is within the bound. For goodput (DistServe: requests
per second that meet every SLO) each request is checked against the same bounds on its own values.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from gpulens.errors import BadInputError, shown

Metric = Literal["latency", "ttft", "itl", "tpot", "error_rate"]
LATENCY_METRICS: tuple[str, ...] = ("latency", "ttft", "itl", "tpot")
STATS: tuple[str, ...] = ("p50", "p90", "p95", "p99", "p99_9", "mean", "max")

_SLO = re.compile(
    r"^\s*(?:(?P<stat>p\d+(?:[._]\d+)?|mean|max)_)?(?P<metric>[a-z_]+?)\s*(?P<op><=|<)\s*"
    r"(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>us|µs|ms|s|%)?\s*$"
)
_UNIT_SECONDS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, None: 1.0}
GRAMMAR_HINT = (
    "Write STAT_METRIC<=VALUE, e.g. p99_latency<=500ms, p95_ttft<=200ms, mean_tpot<=50ms or error_rate<=1%; "
    "STAT is p50, p90, p95, p99, p99.9, mean or max, METRIC is latency, ttft, itl or tpot."
)


@dataclass(frozen=True, slots=True)
class Slo:
    """One objective. `stat` is one of STATS (None for error_rate); `bound` is seconds, or a ratio."""

    text: str
    metric: Metric
    stat: str | None
    bound: float
    strict: bool = False  # `<` rather than `<=`

    def holds(self, value: float | None) -> bool:
        if value is None:  # nothing measured (e.g. no streamed tokens): the objective cannot be met
            return False
        return value < self.bound if self.strict else value <= self.bound

    @property
    def percentile(self) -> float | None:
        """The percentile (e.g. 99.9) when the statistic is one, else None."""
        if self.stat and self.stat.startswith("p"):
            return float(self.stat[1:].replace("_", "."))
        return None

    @property
    def name(self) -> str:
        """The objective's statistic as a sentence says it: `p99 latency`, `p99.9 TTFT`, `error rate`."""
        words = _METRIC_WORDS[self.metric]
        return f"{self.stat.replace('_', '.')} {words}" if self.stat else words

    def measured_and_bound(self, value: float) -> tuple[str, str]:
        """A measured `value` and the bound as text in the objective's unit, e.g. ("2.84 s", "≤ 2 s"),
        with the digits it takes to tell them apart (a value just over its bound never reads as equal)."""
        show = _percent if self.metric == "error_rate" else _seconds
        for digits in (3, 4, 6):
            measured, bound = show(value, digits), show(self.bound, digits)
            if measured != bound:
                break
        return measured, f"{'<' if self.strict else '≤'} {bound}"


_METRIC_WORDS = {"latency": "latency", "ttft": "TTFT", "itl": "ITL", "tpot": "TPOT", "error_rate": "error rate"}


def _seconds(s: float, digits: int) -> str:
    """Seconds in the units an objective is written in (s, ms, µs), to `digits` significant digits."""
    if s >= 100:  # fixed decimals: %g would turn 999.6 into 1e+03
        return f"{s:,.{digits - 3}f} s"
    scale, unit = (1.0, "s") if s >= 1 else (1e-3, "ms") if s >= 1e-3 else (1e-6, "µs")
    return f"{s / scale:.{digits}g} {unit}"


def _percent(ratio: float, digits: int) -> str:
    return f"{ratio * 100:.{digits}g}%"


def parse_slo(text: str) -> Slo:
    """Parse one SLO expression; a malformed one raises BadInputError naming the grammar."""
    m = _SLO.match(str(text).strip().lower())
    if not m:
        raise BadInputError(f"Cannot read the SLO {shown(text)}.", hint=GRAMMAR_HINT)
    metric, stat, unit = m.group("metric"), m.group("stat"), m.group("unit")
    value = float(m.group("num"))
    if not math.isfinite(value):  # 400 digits read as a float are infinity: a bound that always holds
        raise BadInputError(f"The bound in the SLO {_shown(text)} is too large to be a number.", hint=GRAMMAR_HINT)
    if metric == "error_rate":
        if stat is not None:
            raise BadInputError(f"The SLO {shown(text)} puts a statistic on error_rate.", hint="Write error_rate<=1% (no p99_).")
        bound = value / 100 if unit == "%" else value
        if unit not in ("%", None) or not 0 <= bound <= 1:
            raise BadInputError(f"The error-rate bound in {shown(text)} must be a percentage from 0% to 100%.", hint=GRAMMAR_HINT)
        return Slo(text.strip(), "error_rate", None, bound, m.group("op") == "<")
    if metric not in LATENCY_METRICS:
        raise BadInputError(f"Unknown metric {shown(metric)} in the SLO {shown(text)}.", hint=GRAMMAR_HINT)
    stat = (stat or "p99").replace(".", "_")
    if stat not in STATS:
        raise BadInputError(f"Unknown statistic {shown(stat)} in the SLO {shown(text)}.", hint=GRAMMAR_HINT)
    if unit == "%":
        raise BadInputError(f"The SLO {shown(text)} gives a latency in percent.", hint="Give a time such as 500ms or 1s.")
    bound = value * _UNIT_SECONDS[unit]
    if bound <= 0:
        raise BadInputError(f"The bound in the SLO {shown(text)} must be above zero.", hint=GRAMMAR_HINT)
    return Slo(text.strip(), metric, stat, bound, m.group("op") == "<")  # type: ignore[arg-type]


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:60] + "…")


def parse_slos(texts: list[str] | tuple[str, ...]) -> list[Slo]:
    return [parse_slo(t) for t in texts]
