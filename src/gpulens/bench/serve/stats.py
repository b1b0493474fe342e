"""Latency distributions in HdrHistogram (microsecond resolution, 3 significant digits) and the
typed summary the load tester reports. Histograms from several worker processes merge exactly."""

from __future__ import annotations

import base64
from dataclasses import asdict, dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram

_LOWEST_US = 1
_HIGHEST_US = 3600 * 1_000_000  # one hour: longer values are clamped (and counted) rather than dropped
_DIGITS = 3


@dataclass(frozen=True, slots=True)
class Percentiles:
    """A distribution in seconds. `count` is the number of values."""

    p50: float
    p90: float
    p95: float
    p99: float
    p99_9: float
    mean: float
    max: float
    count: int

    def get(self, stat: str) -> float:
        return float(getattr(self, stat))

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


class Distribution:
    """Values in seconds recorded into an HdrHistogram."""

    def __init__(self) -> None:
        self._h = HdrHistogram(_LOWEST_US, _HIGHEST_US, _DIGITS)
        self.clamped = 0  # values outside the trackable range
        self._sum_seconds = 0.0  # exact mean; hdrh's get_mean_value walks every bucket (slow in Python)

    def record(self, seconds: float) -> None:
        self._sum_seconds += seconds
        us = int(round(seconds * 1e6))
        if us < _LOWEST_US:
            us = _LOWEST_US
        elif us > _HIGHEST_US:
            us, self.clamped = _HIGHEST_US, self.clamped + 1
        self._h.record_value(us)

    @property
    def count(self) -> int:
        return int(self._h.get_total_count())

    def percentile(self, p: float) -> float | None:
        return self._h.get_value_at_percentile(p) / 1e6 if self.count else None

    def summary(self) -> Percentiles | None:
        if not self.count:
            return None
        h = self._h
        return Percentiles(
            p50=h.get_value_at_percentile(50) / 1e6,
            p90=h.get_value_at_percentile(90) / 1e6,
            p95=h.get_value_at_percentile(95) / 1e6,
            p99=h.get_value_at_percentile(99) / 1e6,
            p99_9=h.get_value_at_percentile(99.9) / 1e6,
            mean=self._sum_seconds / self.count if self._sum_seconds else h.get_mean_value() / 1e6,
            max=h.get_max_value() / 1e6,
            count=self.count,
        )

    def encode(self) -> str:
        """A compact text form (HdrHistogram's compressed encoding, plus the exact sum) for sending
        between processes."""
        return f"{self._sum_seconds!r} " + base64.b64encode(self._h.encode()).decode() if self.count else ""

    def merge_encoded(self, text: str) -> None:
        if text:
            total, _, data = text.partition(" ")
            self._h.decode_and_add(base64.b64decode(data))
            self._sum_seconds += float(total)

    def merge(self, other: Distribution) -> None:
        self._h.add(other._h)
        self.clamped += other.clamped
        self._sum_seconds += other._sum_seconds


STATUSES = ("ok", "error", "timeout", "rejected")


@dataclass
class LoadSummary:
    """What one load run measured. Times in seconds; rates per second."""

    mode: str  # "open" (a rate) or "closed" (a concurrency)
    target_rate: float | None
    target_concurrency: int | None
    arrival: str
    duration_seconds: float  # from the first intended send to the last completion
    requests: dict[str, int]  # counts by status, plus "total" and "not_sent"
    achieved_rate: float  # completed requests per second
    sent_rate: float  # requests sent per second
    latency: Percentiles | None  # from the intended send time (ok responses and timeouts)
    latency_uncorrected: Percentiles | None  # from the actual send time: what a closed-loop tool reports
    send_lag: Percentiles | None  # actual send time minus intended send time
    ttft: Percentiles | None = None
    itl: Percentiles | None = None
    tpot: Percentiles | None = None
    output_tokens: int = 0
    output_tokens_per_second: float | None = None
    goodput: float | None = None  # requests per second meeting every SLO (when SLOs were given)
    slo_results: list[dict[str, Any]] = field(default_factory=list)
    client_bound: bool = False  # the client itself could not keep the schedule
    http_statuses: dict[str, int] = field(default_factory=dict)
    first_error: str | None = None
    interrupted: bool = False
    warnings: list[str] = field(default_factory=list)

    @property
    def slo_met(self) -> bool | None:
        return None if not self.slo_results else all(r["met"] for r in self.slo_results)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["slo_met"] = self.slo_met
        return d
