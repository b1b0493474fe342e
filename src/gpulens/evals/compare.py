"""`gpulens eval compare`: one call from two result files to a non-inferiority verdict."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulens.errors import BadInputError
from gpulens.evals.paired import PairedResult, compare_paired
from gpulens.evals.samples import ExampleScores, paired, read_scores
from gpulens.vocab.directions import Direction, lookup

# For 0-1 scores (accuracy, exact match) a drop of one point is the usual "noticeable" line.
DEFAULT_SCORE_MARGIN = 0.01


@dataclass(frozen=True)
class EvalComparison:
    baseline: ExampleScores
    candidate: ExampleScores
    result: PairedResult

    def to_json(self) -> dict[str, Any]:
        r = self.result
        return {
            "metric": r.metric, "direction": r.direction, "method": r.method, "examples": r.examples,
            "baseline": {"path": str(self.baseline.path), "format": self.baseline.format, "mean": r.baseline_mean},
            "candidate": {"path": str(self.candidate.path), "format": self.candidate.format, "mean": r.candidate_mean},
            "difference": r.difference, "difference_ci95": [r.difference_low, r.difference_high],
            "margin": r.margin, "improved": r.improved, "regressed": r.regressed, "p_value": r.p_value,
            "verdict": r.verdict, "passed": r.passed, "reason": r.reason, "examples_needed": r.examples_needed,
        }


def compare_files(baseline: Path, candidate: Path, metric: str, *, margin: float | None = None,
                  overrides: Mapping[str, Direction] | None = None, task: str | None = None,
                  filter_name: str | None = None, seed: int = 0) -> EvalComparison:
    """Read both files, pair their examples by id and test the candidate for non-inferiority."""
    info = lookup(metric, overrides)
    # the files first: a metric they do not hold is the error to say, not the margin it would need
    a = read_scores(baseline, metric, task=task, filter_name=filter_name)
    b = read_scores(candidate, metric, task=task, filter_name=filter_name)
    if info.score:
        check_unit_scores(a)
        check_unit_scores(b)
    if margin is None:
        if not info.score:
            raise BadInputError(f"{metric} is not a 0-1 score, so gpulens has no default margin for it.",
                                hint=f"Say how much worse is still acceptable, in {metric}'s units, with --margin (e.g. --margin 0.5).")
        margin = DEFAULT_SCORE_MARGIN
    _, va, vb = paired(a, b)
    return EvalComparison(a, b, compare_paired(metric, info.direction, va, vb, margin=margin, seed=seed))


def check_unit_scores(scores: ExampleScores) -> None:
    """A 0-1 metric (accuracy, exact match) with a value outside 0..1 is not what its name says: the
    exact test of flipped examples would be answering a question the file does not ask."""
    bad = next(((k, v) for k, v in scores.values.items() if not 0.0 <= v <= 1.0), None)
    if bad is not None:
        raise BadInputError(f"{scores.metric} is a 0-1 score, but example {bad[0]!r} of {scores.path} has {bad[1]:g}.",
                            hint="Check the file: an accuracy-like metric is 1 for a right answer, 0 for a wrong "
                                 "one, or a share in between.")
