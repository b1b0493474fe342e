"""Paired non-inferiority tests: is the candidate no worse than the baseline by more than a margin?

Each example is scored by both models, so the test works on the per-example differences, which
removes the examples' own difficulty from the noise (a paired test needs far fewer examples than
comparing two means).

- **0-1 metrics** (accuracy, exact match): only the examples that flipped carry information.
  With n01 flips wrong→right and n10 right→wrong among n examples, the difference is
  (n01 − n10) / n. Its interval is Tango's score interval for a difference of paired proportions
  (Tango 1998; Fagerland, Lydersen & Laake 2014 recommend it): it treats the number of flips as
  random too, so no flips among few examples is a wide interval, not the point 0. The exact McNemar
  test (the binomial test of n01 out of n01 + n10 against 1/2) gives the p-value.
- **Other metrics** (perplexity, a judge's score): a paired bootstrap of the mean difference
  (resampling examples, both models' values together), percentile interval, never narrower than
  Student's t interval of the differences nor than what n examples can resolve (`_resolution`).

"Better" is oriented by the metric's direction (`gpulens.vocab.directions`): the test runs on
`candidate − baseline` for higher-is-better metrics and `baseline − candidate` for lower-is-better
ones, and passes when the lower end of the two-sided 95 % interval of that improvement is above
−margin. Reported differences stay `candidate − baseline` in the metric's own units. A failure is
a regression when the whole interval is worse, else inconclusive, with the number of examples that
would likely decide it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import optimize, stats

from gpulens.errors import BadInputError
from gpulens.vocab.directions import HIGHER, LOWER, Direction

Method = Literal["exact_mcnemar", "paired_bootstrap"]
CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 10_000
# Past this many examples "more examples would tell" is no longer advice anyone can follow.
MAX_EXAMPLES_NEEDED = 10**9


@dataclass(frozen=True)
class PairedResult:
    metric: str
    direction: Direction
    method: Method
    examples: int
    baseline_mean: float
    candidate_mean: float
    difference: float  # candidate − baseline, the metric's units
    difference_low: float  # the 95 % interval of candidate − baseline
    difference_high: float
    margin: float  # how much worse is still acceptable, the metric's units (>= 0)
    improved: int  # examples where the candidate is better
    regressed: int  # examples where it is worse
    p_value: float | None  # exact McNemar (two-sided), 0-1 metrics only
    passed: bool
    # an inconclusive result: about how many examples, at the differences seen, would narrow the
    # interval inside the margin; None when it passed, is a regression, or no number would do
    examples_needed: int | None = None
    reason: str = ""  # one sentence: why this verdict, and for an inconclusive one what would decide it

    @property
    def worst_case_drop(self) -> float:
        """The largest loss the interval allows, in the better-is-positive orientation (> 0 is a drop)."""
        return -(self.difference_low if self.direction == HIGHER else -self.difference_high)

    @property
    def verdict(self) -> str:
        if self.passed:
            return "pass"
        better_high = self.difference_high if self.direction == HIGHER else -self.difference_low
        return "regression" if better_high < 0 else "inconclusive"


def is_binary(values: Sequence[float]) -> bool:
    return all(v in (0.0, 1.0) for v in values)


def _tango_z(better: float, worse: float, n: float, delta: float) -> float:
    """Tango's score statistic for P(better) − P(worse) = delta, given the counts of examples that
    got better and worse among n (the restricted maximum-likelihood P(worse) in closed form)."""
    a = 2 * n
    b = -better - worse + (2 * n - better + worse) * delta
    c = -worse * delta * (1 - delta)
    p_worse = (math.sqrt(max(b * b - 4 * a * c, 0.0)) - b) / (2 * a)
    var = n * (2 * p_worse + delta * (1 - delta))
    num = better - worse - n * delta
    if var <= 0:
        return math.copysign(math.inf, num) if num else 0.0
    return num / math.sqrt(var)


def _tango_interval(better: float, worse: float, n: float, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Tango's score interval of P(better) − P(worse) (counts may be fractional, for projections)."""
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    est, tol = (better - worse) / n, 1e-12
    low = -1.0 if est <= -1 + tol else float(optimize.brentq(lambda d: _tango_z(better, worse, n, d) - z, -1 + tol, est))
    high = 1.0 if est >= 1 - tol else float(optimize.brentq(lambda d: _tango_z(better, worse, n, d) + z, est, 1 - tol))
    return low, high


def _smallest_n(n: int, passes: Callable[[int], bool]) -> int | None:
    """The smallest n' >= n for which `passes(n')` (assumed monotone), or None past MAX_EXAMPLES_NEEDED."""
    hi = n
    while not passes(hi):
        if hi >= MAX_EXAMPLES_NEEDED:
            return None
        hi = min(2 * hi, MAX_EXAMPLES_NEEDED)
    lo = max(hi // 2, n)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if passes(mid) else (mid, hi)
    return hi


def _resolution(values: np.ndarray, n: int, confidence: float = CONFIDENCE) -> float:
    """Half-width that n examples cannot go below, whatever their differences show (all equal, say).
    A behaviour that a share ln(2 / alpha) / n of all examples has is missed by n examples with
    probability alpha / 2 (the rule of three, at 97.5 %); such an example may move by as much as
    the metric varies between examples (its standard deviation, both models' values). For 0-1
    scores Tango's interval already does this (no flips among n: about ±3.84 / n)."""
    alpha = 1.0 - confidence
    spread = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    return math.log(2 / alpha) / n * spread


def compare_paired(metric: str, direction: Direction, baseline: Sequence[float], candidate: Sequence[float], *,
                   margin: float, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES) -> PairedResult:
    """Non-inferiority of `candidate` against `baseline` (same examples, same order)."""
    if direction not in (HIGHER, LOWER):
        raise BadInputError(f"gpulens does not know whether {metric} is better higher or lower.",
                            hint=f"Say which with --direction {metric}=higher (or =lower).")
    if margin < 0:
        raise BadInputError(f"--margin must be zero or more, not {margin}.", hint="It is how much worse the candidate may be, in the metric's units.")
    if len(baseline) != len(candidate):
        raise BadInputError("The baseline and the candidate have different numbers of examples.")
    n = len(baseline)
    if n < 2:
        raise BadInputError(f"{n} paired example(s) is too few for a test.", hint="Evaluate on more examples.")
    b, c = np.asarray(baseline, dtype=float), np.asarray(candidate, dtype=float)
    d = c - b
    sign = 1.0 if direction == HIGHER else -1.0
    improved, regressed = int(np.sum(sign * d > 0)), int(np.sum(sign * d < 0))
    est = sign * float(d.mean())  # the improvement, better-is-positive
    p_value: float | None = None
    undecided = ""  # why the test cannot decide at all, whatever the interval says
    if is_binary(baseline) and is_binary(candidate):
        # In the better-is-positive orientation, so the bound the gate reads is Tango's lower one.
        better_low, better_high = _tango_interval(improved, regressed, n)
        p_value = float(stats.binomtest(improved, improved + regressed, 0.5).pvalue) if improved + regressed else 1.0

        def passes(k: int) -> bool:  # the same flip rates among k examples
            return _tango_interval(improved * k / n, regressed * k / n, k)[0] > -margin
        method: Method = "exact_mcnemar"
    else:
        rng = np.random.default_rng(seed)
        means = np.empty(resamples)
        for i in range(0, resamples, 1000):  # in blocks: 10 000 × n indices at once is too much memory for large n
            k = min(1000, resamples - i)
            means[i:i + k] = sign * d[rng.integers(0, n, size=(k, n))].mean(axis=1)
        alpha = 1.0 - CONFIDENCE
        boot_low, boot_high = float(np.quantile(means, alpha / 2)), float(np.quantile(means, 1 - alpha / 2))
        # The percentile bootstrap never reaches past the differences it has seen, so on few examples
        # it is too narrow; Student's t is the small-sample interval, and on many examples they agree.
        t_half = float(stats.t.ppf(1 - alpha / 2, n - 1)) * float(d.std(ddof=1)) / math.sqrt(n)
        floor = _resolution(np.concatenate([b, c]), n)
        better_low = min(boot_low, est - t_half, est - floor)
        better_high = max(boot_high, est + t_half, est + floor)
        stat_half, gap = max(est - boot_low, t_half), est + margin

        def passes(k: int) -> bool:  # the statistical half-width shrinks as 1/√k, the resolution as 1/k
            return stat_half * math.sqrt(n / k) < gap and floor * n / k < gap
        method = "paired_bootstrap"
        if floor == 0:
            undecided = (f"all {n} examples have the same value under both models, so nothing shows how much an example "
                         "can change: the test cannot decide (evaluate on examples that differ)")
    passed = better_low > -margin and not undecided
    low, high = (better_low, better_high) if direction == HIGHER else (-better_high, -better_low)
    needed = None
    if undecided:
        reason = undecided
    elif passed:
        reason = f"the interval's worse end {low if direction == HIGHER else high:+.4g} is within the margin {margin:g}"
    elif better_high < 0:
        reason = "the whole interval is worse than the baseline"
    elif est <= -margin:
        reason = (f"the difference seen ({float(d.mean()):+.4g}) is not within the margin {margin:g}, so more "
                  "examples at the same differences would not pass")
    else:
        needed = _smallest_n(n, passes)
        reason = (f"{n} examples are too few: at the differences seen, about {needed:,} would narrow the interval inside "
                  f"the margin {margin:g} (evaluate on more, or widen --margin)" if needed is not None else
                  f"the interval reaches past −{margin:g}, and even {MAX_EXAMPLES_NEEDED:,} examples at the differences "
                  "seen would not narrow it enough")
    return PairedResult(metric, direction, method, n, float(b.mean()), float(c.mean()), float(d.mean()), low, high,
                        margin, improved, regressed, p_value, passed=passed, examples_needed=needed, reason=reason)
