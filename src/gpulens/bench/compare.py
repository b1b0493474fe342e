"""Compare two runs with statistics rather than eyeballing.

Per metric: the change of the median (B against A) with a bootstrap 95 % confidence interval, a
two-sided Mann-Whitney U test, and a verdict. A verdict of regression (or improvement) needs both
a significant test (p < alpha) and a median change beyond the user's threshold in the bad (good)
direction, so noise alone rarely gives a false verdict; with too few samples the answer is
"not enough data", never a guess. Scores from 0 to 1 (accuracy, exact match, F1) are tested for
non-inferiority instead: B regressed when the 95 % interval of mean(B) − mean(A) reaches past an
absolute margin on the bad side. Which side is bad comes from `gpulens.vocab.directions`; a metric it
does not know gets "direction unknown" rather than a guess. A per-step metric (step time) of two runs
whose steps do different work (another batch size or sequence length, `gpulens.runs.work`) is "not
comparable": the verdict then rests on throughput per token or sample. Beside the numbers: what
changed in configuration and environment, and the last known-good run to roll back to.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from gpulens.errors import BadInputError, shown
from gpulens.runs import Change, Note, Run, diff, last_known_good, notes_between, set_verdict
from gpulens.runs.registry import FINGERPRINT_IGNORE
from gpulens.runs.work import describe, is_per_step, step_work_changes
from gpulens.stats import median_ratio_ci95
from gpulens.vocab.directions import HIGHER, UNKNOWN, Direction, MetricInfo, direction_of, lookup

MetricVerdict = Literal["regression", "improvement", "no change", "not enough data", "direction unknown", "not comparable"]
# Verdicts that judge nothing: they never fail a gate and never mark a run.
UNJUDGED: tuple[str, ...] = ("not enough data", "direction unknown", "not comparable")

DEFAULT_THRESHOLD_RATIO = 0.05
DEFAULT_ALPHA = 0.05
DEFAULT_MARGIN = 0.01  # scores: a drop of more than 0.01 (one point of accuracy) is a regression
# Fewer samples than this per run and a rank test cannot reach p < 0.05 reliably (with 4 vs 4
# the smallest two-sided p is 0.029, with 3 vs 3 it is 0.1).
MIN_SAMPLES = 5
MIN_SCORE_SAMPLES = 2  # a variance needs two values per side
BOOTSTRAP_RESAMPLES = 4000
Z95 = 1.959963984540054


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
    test: Literal["median", "non-inferiority"] = "median"
    unit: str = ""
    # non-inferiority (scores): mean(B) - mean(A), its 95 % interval and the margin, in the score's units
    mean_a: float | None = None
    mean_b: float | None = None
    difference: float | None = None
    ci95_low: float | None = None
    ci95_high: float | None = None
    margin: float | None = None


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
    margin: float = DEFAULT_MARGIN
    config_changes: list[Change] = field(default_factory=list)
    fingerprint_changes: list[Change] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)  # `gpulens note`s made between the two runs
    last_known_good: RunRef | None = None  # where to roll back to when B regressed

    @property
    def regression(self) -> bool:
        return any(m.verdict == "regression" for m in self.metrics)

    @property
    def verdict(self) -> MetricVerdict:
        """The run's verdict: regression if any metric regressed; improvement if one improved and
        none regressed; no change if the judged metrics did neither; and when no metric could be
        judged, why (not comparable, direction unknown, not enough data, in that order)."""
        vs = {m.verdict for m in self.metrics}
        if "regression" in vs:
            return "regression"
        if not vs - set(UNJUDGED):
            if "not comparable" in vs:
                return "not comparable"
            return "direction unknown" if "direction unknown" in vs else "not enough data"
        return "improvement" if "improvement" in vs else "no change"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["verdict"] = self.verdict
        d["regression"] = self.regression
        return d


def compare_samples(
    metric: str,
    a: list[float],
    b: list[float],
    *,
    threshold_ratio: float = DEFAULT_THRESHOLD_RATIO,
    alpha: float = DEFAULT_ALPHA,
    direction: Direction | None = None,
    margin: float = DEFAULT_MARGIN,
    seed: int = 0,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> MetricComparison:
    """One metric's comparison. Deterministic for a given seed. Scores (accuracy-like, see
    `gpulens.vocab.directions`) get a non-inferiority test with `margin`; everything else the median test."""
    from scipy.stats import mannwhitneyu

    info = lookup(metric)
    if direction is not None:
        info = MetricInfo(info.name, direction, info.unit, info.score, "user")
    direction = info.direction
    xa = np.asarray([v for v in a if math.isfinite(v)], dtype=float)
    xb = np.asarray([v for v in b if math.isfinite(v)], dtype=float)
    if info.score and direction != UNKNOWN:
        return _non_inferiority(metric, info, xa, xb, margin)
    na, nb = len(xa), len(xb)
    med_a = float(np.median(xa)) if na else None
    med_b = float(np.median(xb)) if nb else None

    def result(verdict: MetricVerdict, reason: str, **kw: Any) -> MetricComparison:
        base: dict[str, Any] = dict(change_ratio=None, ci95_low_ratio=None, ci95_high_ratio=None, p_value=None)
        base.update(kw)
        return MetricComparison(metric, direction, na, nb, med_a, med_b, verdict=verdict, reason=reason,
                                unit=info.unit, **base)

    if na < MIN_SAMPLES or nb < MIN_SAMPLES:
        which = " and ".join(f"{r} has {n}" for r, n in (("A", na), ("B", nb)) if n < MIN_SAMPLES)
        return result("not enough data", f"{which} sample(s); at least {MIN_SAMPLES} per run are needed for a verdict.")
    if med_a == 0:
        return result("not enough data", "the median of A is 0, so a relative change is undefined.")
    change = med_b / med_a - 1.0  # type: ignore[operator]
    lo, hi = median_ratio_ci95(xa, xb, seed=seed, resamples=resamples)
    if np.ptp(np.concatenate([xa, xb])) == 0:
        p = 1.0  # identical constants: scipy would warn; there is no difference to test
    else:
        p = float(mannwhitneyu(xa, xb, alternative="two-sided").pvalue)
    worse = change > 0 if direction == "lower_is_better" else change < 0
    kw = dict(change_ratio=change, ci95_low_ratio=lo, ci95_high_ratio=hi, p_value=p)
    pct = f"{change:+.1%} (95 % CI {lo:+.1%} … {hi:+.1%}, p = {p:.3g})"
    if p < alpha and abs(change) >= threshold_ratio:
        if direction == UNKNOWN:
            return result("direction unknown", f"median {pct}: a significant change, but gpulens does not know whether "
                          f"higher or lower is better for {metric}; give --direction {metric}=higher (or =lower).", **kw)
        if worse:
            return result("regression", f"median {pct}: worse by more than the {threshold_ratio:.0%} threshold.", **kw)
        return result("improvement", f"median {pct}: better by more than the {threshold_ratio:.0%} threshold.", **kw)
    if p >= alpha:
        return result("no change", f"median {pct}: not significant at p < {alpha:g}.", **kw)
    return result("no change", f"median {pct}: significant but within the {threshold_ratio:.0%} threshold.", **kw)


def _diff_interval(xa: np.ndarray, xb: np.ndarray) -> tuple[float, float] | None:
    """95 % interval of mean(B) − mean(A). Per-item 0/1 scores: Agresti-Caffo (one success and one
    failure added to each side, then Wald), which keeps its coverage near 0 and 1 where Wald's
    collapses. Other values (one score per seed, say): Welch's t interval; None when every value on
    both sides is the same, since nothing then shows how much they vary (it was the point d, a pass)."""
    from scipy.stats import t as student_t

    na, nb = len(xa), len(xb)
    if np.isin(xa, (0.0, 1.0)).all() and np.isin(xb, (0.0, 1.0)).all():
        pa, pb = (xa.sum() + 1) / (na + 2), (xb.sum() + 1) / (nb + 2)
        d = pb - pa
        half = Z95 * math.sqrt(pa * (1 - pa) / (na + 2) + pb * (1 - pb) / (nb + 2))
        return float(d - half), float(d + half)
    d = float(xb.mean() - xa.mean())
    va, vb = float(xa.var(ddof=1)) / na, float(xb.var(ddof=1)) / nb
    if va + vb == 0:
        return None
    df = (va + vb) ** 2 / (va * va / (na - 1) + vb * vb / (nb - 1))
    half = float(student_t.ppf(0.975, df)) * math.sqrt(va + vb)
    return d - half, d + half


def _non_inferiority(metric: str, info: MetricInfo, xa: np.ndarray, xb: np.ndarray, margin: float) -> MetricComparison:
    """A score (accuracy, F1...): B regressed when the 95 % interval of mean(B) − mean(A) reaches
    past −margin on the bad side, i.e. when B is not shown to be within `margin` of A."""
    na, nb = len(xa), len(xb)
    mean_a = float(xa.mean()) if na else None
    mean_b = float(xb.mean()) if nb else None

    def result(verdict: MetricVerdict, reason: str, **kw: Any) -> MetricComparison:
        return MetricComparison(
            metric, info.direction, na, nb, float(np.median(xa)) if na else None, float(np.median(xb)) if nb else None,
            None, None, None, None, verdict, reason, test="non-inferiority", unit=info.unit,
            mean_a=mean_a, mean_b=mean_b, margin=margin, **kw)

    if na < MIN_SCORE_SAMPLES or nb < MIN_SCORE_SAMPLES:
        which = " and ".join(f"{r} has {n}" for r, n in (("A", na), ("B", nb)) if n < MIN_SCORE_SAMPLES)
        return result("not enough data", f"{which} sample(s); a score needs at least {MIN_SCORE_SAMPLES} per run "
                      "(store one value per item or per seed, not only the mean).")
    d = mean_b - mean_a  # type: ignore[operator]
    interval = _diff_interval(xa, xb)
    if interval is None:
        return result("not enough data", f"every value is the same within A ({mean_a:.4g}) and within B ({mean_b:.4g}), so "
                      "nothing shows how much a score varies and no interval can be drawn: store one score per item, "
                      "or run seeds that differ.", difference=d)
    lo, hi = interval
    kw = dict(difference=d, ci95_low=lo, ci95_high=hi)
    sign = 1.0 if info.direction == HIGHER else -1.0
    worst = min(sign * lo, sign * hi)  # the interval's bound on the bad side, as a gain
    shown = f"mean {mean_a:.4g} → {mean_b:.4g}, B − A {d:+.4f} (95 % CI {lo:+.4f} … {hi:+.4f}), margin {margin:g}"
    bad_end = lo if info.direction == HIGHER else hi
    if worst < -margin:
        if abs(d) <= margin:
            why = ("B's mean is within the margin, but the interval is too wide to show it: evaluate on more "
                   "items (the interval narrows as 1/√n) or widen --margin")
        else:
            why = "B may be worse than A by more than the margin"
        return result("regression", f"{shown}: the interval's bad end {bad_end:+.4f} is past the margin "
                      f"(non-inferiority not shown); {why}.", **kw)
    if worst > margin:
        return result("improvement", f"{shown}: better by more than the margin across the whole interval.", **kw)
    return result("no change", f"{shown}: within the margin (non-inferior).", **kw)


def compare_runs(
    a: Run,
    b: Run,
    *,
    threshold_ratio: float = DEFAULT_THRESHOLD_RATIO,
    alpha: float = DEFAULT_ALPHA,
    margin: float = DEFAULT_MARGIN,
    directions: dict[str, Direction] | None = None,
    metrics: list[str] | None = None,
    store: Any = None,
    record: bool = False,
) -> Comparison:
    """Compare run B (the new one) against run A (the reference). With `store`, the last
    known-good run is looked up; with `record` too, B is marked good or regression. `directions`
    (metric -> better higher or lower) overrides `gpulens.vocab.directions` for the named metrics."""
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
    if not (0 <= margin < 1):
        raise BadInputError(f"The margin {margin:g} is out of range for a score from 0 to 1.", hint="Use e.g. --margin 0.01.")
    directions = directions or {}
    names = metrics or sorted(set(a.samples) | set(b.samples))
    have = ", ".join(sorted(set(a.samples) | set(b.samples))) or "none"
    if metrics:
        missing = [m for m in metrics if m not in a.samples and m not in b.samples]
        if missing:
            raise BadInputError(f"Neither run has samples of {shown(', '.join(missing), 80, quote=False)}.",
                                hint=f"Metrics they have: {have}.")
    # a mistyped --direction was ignored, and the metric it meant stayed "direction unknown"
    stray = [m for m in directions if m not in a.samples and m not in b.samples]
    if stray:
        raise BadInputError(f"--direction names {shown(stray[0])}, which neither run has samples of.", hint=f"Metrics they have: {have}.")
    # Per-step figures of runs whose steps do different work measure the work, not the speed.
    work = step_work_changes(a.config, b.config)
    results = []
    for i, m in enumerate(names):
        if m not in a.samples or m not in b.samples:
            side = "A" if m not in a.samples else "B"
            mc = MetricComparison(
                m, directions.get(m) or direction_of(m), len(a.samples.get(m, [])), len(b.samples.get(m, [])), None, None,
                None, None, None, None, "not enough data", f"run {side} has no samples of this metric.",
            )
            results.append(mc)
            continue
        mc = compare_samples(m, a.samples[m], b.samples[m], threshold_ratio=threshold_ratio, alpha=alpha,
                             direction=directions.get(m), margin=margin, seed=i)
        if work and is_per_step(m):  # the figures stay shown; they count toward no verdict
            mc.verdict = "not comparable"
            mc.reason = (f"{describe(work)}: a step does different work in A and B, so a per-step figure does not "
                         "compare (throughput per token or sample does).")
        results.append(mc)
    cmp = Comparison(
        a=RunRef.of(a),
        b=RunRef.of(b),
        threshold_ratio=threshold_ratio,
        alpha=alpha,
        metrics=results,
        margin=margin,
        config_changes=diff(a.config, b.config),
        fingerprint_changes=diff(a.fingerprint, b.fingerprint, ignore=FINGERPRINT_IGNORE),
    )
    if store is not None:
        first, second = sorted((a, b), key=lambda r: r.created)
        cmp.notes = notes_between(store, first.ended or first.created, second.started or second.created)
        if record and cmp.verdict not in UNJUDGED:
            set_verdict(store, b.id, "regression" if cmp.regression else "good")
        good = last_known_good(store, b.kind, b.name, before=b.id)
        if good is None and a.verdict != "regression":
            good = a  # the reference itself is the last setup known to be fine
        cmp.last_known_good = RunRef.of(good) if good is not None else None
    return cmp
