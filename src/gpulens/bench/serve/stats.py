"""Latency distributions in HdrHistogram (microsecond resolution, 3 significant digits) and the
typed summary the load tester reports. Histograms from several worker processes merge exactly.

HdrHistogram records; the percentiles reported are `gpulens.stats`' definition (linear
interpolation between closest ranks, the one diagnosis, the dashboard and reports use), computed
over the histogram's buckets with `percentiles_of_counts`. Each bucket stands for its highest
equivalent value, so a reported percentile is at or above `stats.percentile` of the exact values
by at most the histogram's resolution (one part in 10^3 of the value, and 1 µs)."""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

from gpulens.stats import percentiles_of_counts

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

    def record_many(self, seconds: list[float]) -> None:
        """`record` for each value, in one vectorised pass: the load tester's hot path collects a
        batch of values and folds it in here (the counts, total, min, max and clamped count come out
        the same as one `record` per value)."""
        if not seconds:
            return
        values = np.asarray(seconds, dtype=np.float64)
        self._sum_seconds += float(values.sum())
        us = np.rint(values * 1e6)
        self.clamped += int(np.count_nonzero(us > _HIGHEST_US))
        us = np.clip(us, _LOWEST_US, _HIGHEST_US).astype(np.int64)
        h = self._h
        # hdrh's _counts_index_for, vectorised: bucket from the bit length of (value | sub-bucket mask)
        bits = np.frexp((us | h.sub_bucket_mask).astype(np.float64))[1].astype(np.int64)
        bucket = bits - h.unit_magnitude - (h.sub_bucket_half_count_magnitude + 1)
        sub_bucket = us >> (bucket + h.unit_magnitude)
        index = ((bucket + 1) << h.sub_bucket_half_count_magnitude) + sub_bucket - h.sub_bucket_half_count
        counts = np.ctypeslib.as_array(h.counts)[: h.counts_len]
        np.add.at(counts, index, 1)
        h.total_count += len(us)
        h.min_value = min(h.min_value, int(us.min()))
        h.max_value = max(h.max_value, int(us.max()))

    @property
    def count(self) -> int:
        return int(self._h.get_total_count())

    def _buckets_us(self) -> list[tuple[float, int]]:
        """(highest equivalent value in µs, count) of every non-empty bucket, ascending."""
        h = self._h
        counts = np.ctypeslib.as_array(h.counts)[: h.counts_len]
        return [(h.get_highest_equivalent_value(h.get_value_from_index(int(i))), int(counts[i])) for i in np.flatnonzero(counts)]

    def percentiles(self, ps: list[float]) -> list[float | None]:
        """Percentiles in seconds, `gpulens.stats`' definition (see the module docstring)."""
        return [None if v is None else v / 1e6 for v in percentiles_of_counts(self._buckets_us(), ps)]

    def percentile(self, p: float) -> float | None:
        return self.percentiles([p])[0] if self.count else None

    def summary(self) -> Percentiles | None:
        if not self.count:
            return None
        h = self._h
        p50, p90, p95, p99, p99_9 = self.percentiles([50, 90, 95, 99, 99.9])
        return Percentiles(
            p50=p50,  # type: ignore[arg-type]
            p90=p90,  # type: ignore[arg-type]
            p95=p95,  # type: ignore[arg-type]
            p99=p99,  # type: ignore[arg-type]
            p99_9=p99_9,  # type: ignore[arg-type]
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


STATUSES = ("ok", "error", "timeout", "rejected")  # how a load tester's request ends (client.Status)
# A run (or a sweep's probe) with a larger share of errors, timeouts and rejections fails, SLOs
# or not, unless an error_rate SLO sets its own bound. `--max-error-ratio` changes it.
DEFAULT_MAX_ERROR_RATIO = 0.01
_RATIO_METRICS = ("error_rate", "goodput_ratio")


@dataclass(frozen=True, slots=True)
class RequestCounts:
    """Requests of one run by how they ended (`STATUSES`), the `total` sent, and `not_sent`: the
    schedule's requests the run ended before sending. The field order is the JSON's."""

    ok: int = 0
    error: int = 0
    timeout: int = 0
    rejected: int = 0
    total: int = 0
    not_sent: int = 0

    @classmethod
    def of(cls, statuses: Iterable[str], not_sent: int = 0) -> RequestCounts:
        counts = Counter(statuses)
        return cls(**{s: counts.get(s, 0) for s in STATUSES}, total=sum(counts.values()), not_sent=not_sent)

    @property
    def failed(self) -> int:
        """Requests sent that did not succeed: errors, timeouts and rejections."""
        return self.error + self.timeout + self.rejected

    def by_status(self, status: str) -> int:
        if status not in STATUSES:
            raise KeyError(status)
        return int(getattr(self, status))

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class RequestRates:
    """Requests per second of the run window, by how they ended (`STATUSES`)."""

    ok: float = 0.0
    error: float = 0.0
    timeout: float = 0.0
    rejected: float = 0.0

    @classmethod
    def of(cls, counts: RequestCounts, window_seconds: float) -> RequestRates:
        if window_seconds <= 0:
            return cls()
        return cls(**{s: counts.by_status(s) / window_seconds for s in STATUSES})

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Concurrency:
    """Requests in flight over a run, weighted by how long each count lasted (a count, not seconds)."""

    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class SloResult:
    """One gate's verdict: the objective as written, what the run measured, and whether it held.
    `gating` is False for an objective only reported (a `--goodput` run judges per request)."""

    slo: str
    metric: str  # "latency", "ttft", "itl", "tpot", "error_rate" or "goodput_ratio"
    stat: str | None  # "p99", "mean", ...; None for a ratio
    bound: float  # seconds, or a ratio for error_rate and goodput_ratio
    value: float | None  # None: nothing measured
    met: bool
    gating: bool = True

    @property
    def is_ratio(self) -> bool:
        return self.metric in _RATIO_METRICS

    def shown(self, missing: str = "–") -> str:
        """The value as a person reads it: a percentage for a ratio, else milliseconds."""
        if self.value is None:
            return missing
        return f"{self.value:.2%}" if self.is_ratio else f"{self.value * 1e3:.1f} ms"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LoadSummary:
    """What one load run measured. Times in seconds; rates per second."""

    mode: str  # "open" (a rate) or "closed" (a concurrency)
    target_rate: float | None
    target_concurrency: int | None
    arrival: str
    # The run window: from the first intended send to the later of the end of the send window
    # (--duration, or N requests at the rate) and the last completion. Rates divide by it.
    duration_seconds: float
    requests: RequestCounts
    achieved_rate: float  # requests that succeeded (status ok) per second of the run window
    sent_rate: float  # requests sent per second of the send window
    latency: Percentiles | None  # from the intended send time (ok responses and timeouts)
    # From the actual send time. In an open loop this still includes waiting behind a stall (the
    # request was sent on time into it); only a closed loop, which sends fewer requests, hides that.
    latency_uncorrected: Percentiles | None
    send_lag: Percentiles | None  # actual send time minus intended send time
    ttft: Percentiles | None = None
    itl: Percentiles | None = None
    tpot: Percentiles | None = None
    output_tokens: int = 0
    output_tokens_per_second: float | None = None
    # Prompt tokens of the requests that succeeded: the server's usage.prompt_tokens where it
    # reports them, else the workload's own count (`token_basis` says how that was counted).
    input_tokens: int = 0
    input_tokens_per_second: float | None = None
    token_basis: str | None = None  # "tokenizer", "server", "estimate"; None: no shaped workload
    workload: dict[str, Any] | None = None  # what the workload planned (Workload.describe())
    concurrency: Concurrency | None = None  # None: no request both left and ended
    # Requests that got fewer output tokens than they asked for (the server stopped at an EOS).
    output_tokens_short: int = 0
    goodput: float | None = None  # requests per second meeting every SLO (when SLOs were given)
    goodput_ratio: float | None = None  # share of the requests sent that met every SLO
    slo_results: list[SloResult] = field(default_factory=list)
    client_bound: bool = False  # the client itself could not keep the schedule
    http_statuses: dict[str, int] = field(default_factory=dict)
    first_error: str | None = None
    interrupted: bool = False
    warnings: list[str] = field(default_factory=list)
    send_window_seconds: float = 0.0  # from the first intended send to the end of sending
    rates_per_second: RequestRates = field(default_factory=RequestRates)  # by status, over the run window
    error_ratio: float = 0.0  # (errors + timeouts + rejected) / requests, leaving out those cut by a stop
    max_error_ratio: float = DEFAULT_MAX_ERROR_RATIO  # the gate on error_ratio when no error_rate SLO is given
    failures: list[str] = field(default_factory=list)  # one sentence per gate the run failed
    target_ramp_to: float | None = None  # --ramp-to: the rate rose linearly from target_rate to this

    @property
    def slo_met(self) -> bool | None:
        return None if not self.slo_results else all(r.met for r in self.slo_results)

    @property
    def passed(self) -> bool:
        """Every SLO held and failures stayed within the error-ratio gate."""
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)  # the typed parts (counts, rates, verdicts) as their own to_dict()s
        d["slo_met"] = self.slo_met
        d["passed"] = self.passed
        return d
