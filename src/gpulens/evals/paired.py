"""Paired non-inferiority tests: is the candidate no worse than the baseline by more than a margin?

Each example is scored by both models, so the test works on the per-example differences, which
removes the examples' own difficulty from the noise (a paired test needs far fewer examples than
comparing two means).

- **0-1 metrics** (accuracy, exact match): only the examples that flipped carry information.
  With n01 flips wrong→right and n10 right→wrong among n examples, the difference is
  (n01 − n10) / n; given m = n01 + n10 flips, n01 is binomial(m, p), so an exact (Clopper–Pearson)
  interval for p gives the interval (m / n)(2p − 1) for the difference, and the exact McNemar
  test is the binomial test of p = 1/2.
- **Other metrics** (perplexity, a judge's score): a paired bootstrap of the mean difference
  (resampling examples, both models' values together), percentile interval.

"Better" is oriented by the metric's direction (`gpulens.vocab.directions`): the test runs on
`candidate − baseline` for higher-is-better metrics and `baseline − candidate` for lower-is-better
ones, and passes when the lower end of the two-sided 95 % interval of that improvement is above
−margin. Reported differences stay `candidate − baseline` in the metric's own units.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats

from gpulens.errors import BadInputError
from gpulens.vocab.directions import HIGHER, LOWER, Direction

Method = Literal["exact_mcnemar", "paired_bootstrap"]
CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 10_000


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


def _clopper_pearson(k: int, m: int, confidence: float) -> tuple[float, float]:
    alpha = 1.0 - confidence
    lo = 0.0 if k == 0 else float(stats.beta.ppf(alpha / 2, k, m - k + 1))
    hi = 1.0 if k == m else float(stats.beta.ppf(1 - alpha / 2, k + 1, m - k))
    return lo, hi


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
    p_value: float | None = None
    if is_binary(baseline) and is_binary(candidate):
        n01, n10 = int(np.sum(d > 0)), int(np.sum(d < 0))
        m = n01 + n10
        if m == 0:
            low = high = 0.0
            p_value = 1.0
        else:
            p_lo, p_hi = _clopper_pearson(n01, m, CONFIDENCE)
            low, high = (m / n) * (2 * p_lo - 1), (m / n) * (2 * p_hi - 1)
            p_value = float(stats.binomtest(n01, m, 0.5).pvalue)
        method: Method = "exact_mcnemar"
    else:
        rng = np.random.default_rng(seed)
        means = np.empty(resamples)
        for i in range(0, resamples, 1000):  # in blocks: 10 000 × n indices at once is too much memory for large n
            k = min(1000, resamples - i)
            means[i:i + k] = d[rng.integers(0, n, size=(k, n))].mean(axis=1)
        alpha = 1.0 - CONFIDENCE
        low, high = float(np.quantile(means, alpha / 2)), float(np.quantile(means, 1 - alpha / 2))
        method = "paired_bootstrap"
    better_low = low if direction == HIGHER else -high
    return PairedResult(metric, direction, method, n, float(b.mean()), float(c.mean()), float(d.mean()), low, high,
                        margin, improved, regressed, p_value, passed=better_low > -margin)
