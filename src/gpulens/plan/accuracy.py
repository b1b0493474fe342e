"""How far the planner's predictions land from measurements it was never fitted to: the published
figures (src/gpulens/plan/data/published_figures.jsonl, `python -m gpulens.plan.published`),
summarised by kind, so that every plan can say how much to trust its own numbers.

The summary is kept here as figures, not recomputed per plan (that would plan 288 configurations on
every `gpulens plan`). tests/plan/test_published_figures.py recomputes it and fails when the two
differ, so a change that moves the planner's accuracy must restate it here on purpose.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

# below this many figures a 90th percentile says nothing the worst does not
PERCENTILE_MIN_FIGURES = 20


class _ErrorOf(Protocol):
    kind: str
    error: float | None


@dataclass(frozen=True)
class PublishedAccuracy:
    """One kind of prediction against the published figures: absolute relative errors."""

    kind: str
    what: str  # what is predicted, in the words a plan prints
    figures: int
    median_error_ratio: float
    p90_error_ratio: float | None  # None below PERCENTILE_MIN_FIGURES figures
    worst_error_ratio: float
    worst_figure: str

    def sentence(self) -> str:
        p90 = f", 9 in 10 within {self.p90_error_ratio:.0%}" if self.p90_error_ratio is not None else ""
        return (f"Accuracy: {self.what} against {self.figures} published measurements, none fitted: median error "
                f"{self.median_error_ratio:.1%}{p90}, worst {self.worst_error_ratio:.1%} ({self.worst_figure}); "
                "docs/plan.md, 'Published figures'.")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_WHAT = {
    "training_time": "training throughput",
    "serving_speed": "serving speed",
    "serving_memory": "serving memory (the peak, or a paged engine's KV blocks)",
    "lora_memory": "LoRA / QLoRA memory",
    "moe": "MoE serving speed",
}

# `python -m gpulens.plan.published`, 2026-12-07 (tests/plan/test_published_figures.py checks it)
PUBLISHED_ACCURACY: dict[str, PublishedAccuracy] = {
    "training_time": PublishedAccuracy("training_time", _WHAT["training_time"], 222, 0.041, 0.130, 0.428,
                                       "llmfoundry-a100_40gb-mpt70b-s2048-g64-mb2"),
    "serving_speed": PublishedAccuracy("serving_speed", _WHAT["serving_speed"], 39, 0.051, 0.192, 0.553,
                                       "torchao-llama31-8b-fp8dq-tensor-h100"),
    "serving_memory": PublishedAccuracy("serving_memory", _WHAT["serving_memory"], 5, 0.004, None, 0.045,
                                        "vllm-pr2031-llama2-70b-tp4"),
    "lora_memory": PublishedAccuracy("lora_memory", _WHAT["lora_memory"], 7, 0.021, None, 0.022,
                                     "litgpt-qlora-llama2-7b-nf4dq"),
    "moe": PublishedAccuracy("moe", _WHAT["moe"], 7, 0.085, None, 0.122, "gptfast-mixtral-8x7b-int8-tp8"),
}


def measure_accuracy(outcomes: Iterable[_ErrorOf]) -> dict[str, PublishedAccuracy]:
    """The summary of evaluated published figures (gpulens.plan.published.evaluate), by kind, rounded
    as PUBLISHED_ACCURACY keeps it (to 0.1 %)."""
    by_kind: dict[str, list[tuple[float, str]]] = {}
    for o in outcomes:
        if o.kind in _WHAT and o.error is not None:
            by_kind.setdefault(o.kind, []).append((abs(o.error), getattr(o, "id", "")))
    out = {}
    for kind, rows in by_kind.items():
        errs = sorted(e for e, _ in rows)
        p90 = (statistics.quantiles(errs, n=10, method="inclusive")[-1]
               if len(errs) >= PERCENTILE_MIN_FIGURES else None)
        worst_error, worst_id = max(rows)
        out[kind] = PublishedAccuracy(kind, _WHAT[kind], len(errs), round(statistics.median(errs), 3),
                                      None if p90 is None else round(p90, 3), round(worst_error, 3), worst_id)
    return out
