"""The shape of an engine mapping: which source metric becomes which gpulens series.

An engine is a list of rules, each naming its source metrics (the first present wins, so one map
covers an engine's old and new names) and the gpulens series it writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Merge = Literal["sum", "mean"]


@dataclass(frozen=True)
class Gauge:
    """A gauge copied per model. Label sets of one model (ranks, data-parallel engines) are summed
    (counts) or averaged (ratios); `where` keeps only samples with those label values."""

    sources: tuple[str, ...]
    dest: str
    scale: float = 1.0  # source unit -> base unit
    merge: Merge = "sum"
    where: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Histogram:
    """An engine histogram: passed through to /metrics, and kept in the store as per-interval
    quantiles. `scale` turns the bucket bounds and sum into the base unit (Triton counts ms)."""

    sources: tuple[str, ...]
    dest: str
    scale: float = 1.0


@dataclass(frozen=True)
class Counter:
    """A cumulative counter copied as it is (tokens, preemptions): `rate()` works on it."""

    sources: tuple[str, ...]
    dest: str


@dataclass(frozen=True)
class Outcomes:
    """A cumulative request counter -> `infer_requests_total{status}`. With `label`, each value of
    that label is mapped through `statuses` (anything else is `default`)."""

    source: str
    default: str = "ok"
    label: str | None = None
    statuses: tuple[tuple[str, str], ...] = ()

    def status_of(self, labels: dict[str, str]) -> str:
        if self.label is None:
            return self.default
        value = labels.get(self.label, "")
        return dict(self.statuses).get(value.lower(), self.default)


@dataclass(frozen=True)
class Ratio:
    """Δnumerator / Δdenominators between two scrapes, for counters whose ratio is the quantity:
    Triton's mean durations (`as_mean`: written with quantile="mean", like a histogram's mean),
    its batch size (inferences per execution), vLLM's prefix-cache hit ratio (hits per query)."""

    numerator: tuple[str, ...]
    denominators: tuple[str, ...]
    dest: str
    scale: float = 1.0
    as_mean: bool = True


@dataclass(frozen=True)
class EngineMap:
    name: str
    prefix: str  # every metric of the engine starts with this: how it is recognised
    model_label: str | None  # the label that names the model, if the engine has one
    gauges: tuple[Gauge, ...] = ()
    histograms: tuple[Histogram, ...] = ()
    counters: tuple[Counter, ...] = ()
    outcomes: tuple[Outcomes, ...] = ()
    ratios: tuple[Ratio, ...] = ()
