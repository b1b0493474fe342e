"""Compare two runs with statistics rather than eyeballing.

Per metric: the change of the median (B against A) with a bootstrap 95 % confidence interval, a
two-sided Mann-Whitney U test, and a verdict. A verdict of regression (or improvement) needs both
a significant test (p < alpha) and a median change beyond the user's threshold in the bad (good)
direction, so noise alone rarely gives a false verdict; with too few samples the answer is
"not enough data", never a guess. Beside the numbers: what changed in configuration and
environment, and the last known-good run to roll back to.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from gpulens.errors import BadInputError
from gpulens.runs import Change, Run, diff, last_known_good, set_verdict
from gpulens.runs.registry import FINGERPRINT_IGNORE

MetricVerdict = Literal["regression", "improvement", "no change", "not enough data"]
Direction = Literal["lower_is_better", "higher_is_better"]

DEFAULT_THRESHOLD_RATIO = 0.05
DEFAULT_ALPHA = 0.05
# Fewer samples than this per run and a rank test cannot reach p < 0.05 reliably (with 4 vs 4
# the smallest two-sided p is 0.029, with 3 vs 3 it is 0.1).
MIN_SAMPLES = 5
BOOTSTRAP_RESAMPLES = 4000

# Name fragments of metrics where more is better; everything else (times, latencies, memory) is
# better when lower.
_HIGHER_IS_BETTER = (
    "per_second",
    "per_s",
    "throughput",
    "mfu",
    "goodput",
    "tokens_s",
    "samples_s",
    "rps",
    "qps",
    "tflops",
    "hit_ratio",
)


def direction_of(metric: str) -> Direction:
    m = metric.lower()
    return "higher_is_better" if any(f in m for f in _HIGHER_IS_BETTER) else "lower_is_better"


@dataclass
class MetricComparison:
    metric: str
    direction: Direction
    n_a: int
    n_b: int
    median_a: float | None
    median_b: float | None
    change_ratio: float | None  # median_b / median_a - 1
    ci95_low_ratio: float | None
    ci95_high_ratio: float | None
    p_value: float | None  # two-sided Mann-Whitney U
    verdict: MetricVerdict
    reason: str  # one sentence: why this verdict


@dataclass
class RunRef:
    id: int
    kind: str
    name: str
    created: float

    @classmethod
    def of(cls, run: Run) -> RunRef:
        return cls(run.id, run.kind, run.name, run.created)

    @property
    def label(self) -> str:
        return f"#{self.id} {self.kind}/{self.name}"


@dataclass
class Comparison:
    a: RunRef
    b: RunRef
    threshold_ratio: float
    alpha: float
    metrics: list[MetricComparison]
    config_changes: list[Change] = field(default_factory=list)
    fingerprint_changes: list[Change] = field(default_factory=list)
    last_known_good: RunRef | None = None  # where to roll back to when B regressed

    @property
    def regression(self) -> bool:
        return any(m.verdict == "regression" for m in self.metrics)

    @property
    def verdict(self) -> MetricVerdict:
        """The run's verdict: regression if any metric regressed; not enough data if no metric
        could be judged; improvement if one improved and none regressed; else no change."""
        vs = {m.verdict for m in self.metrics}
        if "regression" in vs:
            return "regression"
        if not vs or vs == {"not enough data"}:
            return "not enough data"
        return "improvement" if "improvement" in vs else "no change"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["verdict"] = self.verdict
        d["regression"] = self.regression
        return d


def _bootstrap_ci(a: np.ndarray, b: np.ndarray, rng: np.random.Generator, n: int) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of median(b) / median(a) - 1 (runs resampled independently)."""
    ma = np.median(a[rng.integers(0, len(a), size=(n, len(a)))], axis=1)
    mb = np.median(b[rng.integers(0, len(b), size=(n, len(b)))], axis=1)
    ok = ma != 0
    ratios = mb[ok] / ma[ok] - 1.0
    if ratios.size == 0:
        return (math.nan, math.nan)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


def compare_samples(
    metric: str,
    a: list[float],
    b: list[float],
    *,
    threshold_ratio: float = DEFAULT_THRESHOLD_RATIO,
    alpha: float = DEFAULT_ALPHA,
    direction: Direction | None = None,
    seed: int = 0,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> MetricComparison:
    """One metric's comparison. Deterministic for a given seed."""
    from scipy.stats import mannwhitneyu

    direction = direction or direction_of(metric)
    xa = np.asarray([v for v in a if math.isfinite(v)], dtype=float)
    xb = np.asarray([v for v in b if math.isfinite(v)], dtype=float)
    na, nb = len(xa), len(xb)
    med_a = float(np.median(xa)) if na else None
    med_b = float(np.median(xb)) if nb else None

    def result(verdict: MetricVerdict, reason: str, **kw: Any) -> MetricComparison:
        base: dict[str, Any] = dict(change_ratio=None, ci95_low_ratio=None, ci95_high_ratio=None, p_value=None)
        base.update(kw)
        return MetricComparison(metric, direction, na, nb, med_a, med_b, verdict=verdict, reason=reason, **base)

    if na < MIN_SAMPLES or nb < MIN_SAMPLES:
        which = " and ".join(f"{r} has {n}" for r, n in (("A", na), ("B", nb)) if n < MIN_SAMPLES)
        return result("not enough data", f"{which} sample(s); at least {MIN_SAMPLES} per run are needed for a verdict.")
    if med_a == 0:
        return result("not enough data", "the median of A is 0, so a relative change is undefined.")
    change = med_b / med_a - 1.0  # type: ignore[operator]
    lo, hi = _bootstrap_ci(xa, xb, np.random.default_rng(seed), resamples)
    if np.ptp(np.concatenate([xa, xb])) == 0:
        p = 1.0  # identical constants: scipy would warn; there is no difference to test
    else:
        p = float(mannwhitneyu(xa, xb, alternative="two-sided").pvalue)
    worse = change > 0 if direction == "lower_is_better" else change < 0
    kw = dict(change_ratio=change, ci95_low_ratio=lo, ci95_high_ratio=hi, p_value=p)
    pct = f"{change:+.1%} (95 % CI {lo:+.1%} … {hi:+.1%}, p = {p:.3g})"
    if p < alpha and abs(change) >= threshold_ratio:
        if worse:
            return result("regression", f"median {pct}: worse by more than the {threshold_ratio:.0%} threshold.", **kw)
        return result("improvement", f"median {pct}: better by more than the {threshold_ratio:.0%} threshold.", **kw)
    if p >= alpha:
        return result("no change", f"median {pct}: not significant at p < {alpha:g}.", **kw)
    return result("no change", f"median {pct}: significant but within the {threshold_ratio:.0%} threshold.", **kw)


def compare_runs(
    a: Run,
    b: Run,
    *,
    threshold_ratio: float = DEFAULT_THRESHOLD_RATIO,
    alpha: float = DEFAULT_ALPHA,
    metrics: list[str] | None = None,
    store: Any = None,
    record: bool = False,
) -> Comparison:
    """Compare run B (the new one) against run A (the reference). With `store`, the last
    known-good run is looked up; with `record` too, B is marked good or regression."""
    if a.id == b.id:
        raise BadInputError(f"Both sides are run #{a.id}; a run cannot be compared with itself.", hint="Give two different run ids.")
    if a.kind != b.kind:
        raise BadInputError(
            f"Run #{a.id} is a {a.kind!r} run and #{b.id} is a {b.kind!r} run; only runs of the same kind compare.",
            hint="Pick two runs of one kind from `gpulens runs list`.",
        )
    if not (0 < threshold_ratio < 10):
        raise BadInputError(f"The threshold {threshold_ratio:.1%} is out of range.", hint="Use e.g. --threshold 5%.")
    if not (0 < alpha < 0.5):
        raise BadInputError(f"The significance level {alpha} is out of range.", hint="Use a value such as 0.05.")
    names = metrics or sorted(set(a.samples) | set(b.samples))
    if metrics:
        missing = [m for m in metrics if m not in a.samples and m not in b.samples]
        if missing:
            have = ", ".join(sorted(set(a.samples) | set(b.samples))) or "none"
            raise BadInputError(f"Neither run has samples of {', '.join(missing)}.", hint=f"Metrics they have: {have}.")
    results = []
    for i, m in enumerate(names):
        if m not in a.samples or m not in b.samples:
            side = "A" if m not in a.samples else "B"
            mc = MetricComparison(
                m, direction_of(m), len(a.samples.get(m, [])), len(b.samples.get(m, [])), None, None,
                None, None, None, None, "not enough data", f"run {side} has no samples of this metric.",
            )
            results.append(mc)
            continue
        results.append(compare_samples(m, a.samples[m], b.samples[m], threshold_ratio=threshold_ratio, alpha=alpha, seed=i))
    cmp = Comparison(
        a=RunRef.of(a),
        b=RunRef.of(b),
        threshold_ratio=threshold_ratio,
        alpha=alpha,
        metrics=results,
        config_changes=diff(a.config, b.config),
        fingerprint_changes=diff(a.fingerprint, b.fingerprint, ignore=FINGERPRINT_IGNORE),
    )
    if store is not None:
        if record and cmp.verdict != "not enough data":
            set_verdict(store, b.id, "regression" if cmp.regression else "good")
        good = last_known_good(store, b.kind, b.name, before=b.id)
        if good is None and a.verdict != "regression":
            good = a  # the reference itself is the last setup known to be fine
        cmp.last_known_good = RunRef.of(good) if good is not None else None
    return cmp
