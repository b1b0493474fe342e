"""Accuracy gates: is a candidate model (quantized, fine-tuned, re-served) no worse than its
baseline on the same examples? See docs/eval.md."""

from gpulens.evals.compare import DEFAULT_SCORE_MARGIN, EvalComparison, compare_files
from gpulens.evals.paired import PairedResult, compare_paired
from gpulens.evals.samples import ExampleScores, paired, read_scores

__all__ = [
    "DEFAULT_SCORE_MARGIN", "EvalComparison", "ExampleScores", "PairedResult",
    "compare_files", "compare_paired", "paired", "read_scores",
]
