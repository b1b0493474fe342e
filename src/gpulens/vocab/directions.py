"""Which way is better, for every metric gpulens compares or alerts on: the one registry.

`gpulens compare`, the alert packs' learned rules (a test checks that each fires on the bad side)
and reports read the direction and unit of a metric from here, so no caller guesses on its own.

A name is looked up exactly first (series names such as `train_step_seconds` and run-sample names
such as `tokens_per_second`), then by its last word (`accuracy`, `loss`, `perplexity`...), then by
its unit suffix (`_seconds` and `_bytes` are better lower, `_per_second` higher). A name none of
these match is "unknown": `compare` then refuses to call a change a regression or an improvement
until the user says which way is better (`--direction NAME=higher`).

Scores (accuracy, exact match, F1: fractions from 0 to 1) are marked `score`: `compare` tests them
for non-inferiority with an absolute margin instead of a relative change of the median.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from gpulens.errors import BadInputError, shown
from gpulens.vocab import names as N

Direction = Literal["lower_is_better", "higher_is_better", "unknown"]
HIGHER: Direction = "higher_is_better"
LOWER: Direction = "lower_is_better"
UNKNOWN: Direction = "unknown"


@dataclass(frozen=True, slots=True)
class MetricInfo:
    """What is known about one metric name. `unit` is a base unit ("s", "bytes", "1/s", "ratio", "")."""

    name: str
    direction: Direction
    unit: str
    score: bool = False  # a 0-1 score (accuracy-like): compared by non-inferiority, not by ratio
    rule: str = "exact"  # how the direction was found: exact, word, suffix, user or unknown

    @property
    def known(self) -> bool:
        return self.direction != UNKNOWN


# Exact names: series (gpulens.vocab.names, gpu metrics) and run samples (bench train/serve).
_EXACT: dict[str, tuple[Direction, str]] = {
    # training series
    N.TRAIN_STEP_SECONDS: (LOWER, "s"),
    N.TRAIN_DATA_WAIT_SECONDS: (LOWER, "s"),
    N.TRAIN_COMPUTE_SECONDS: (LOWER, "s"),
    N.TRAIN_COMM_WAIT_SECONDS: (LOWER, "s"),
    N.TRAIN_CHECKPOINT_SECONDS: (LOWER, "s"),
    N.TRAIN_EVAL_SECONDS: (LOWER, "s"),
    N.TRAIN_DATA_WAIT_RATIO: (LOWER, "ratio"),
    N.TRAIN_COMM_WAIT_RATIO: (LOWER, "ratio"),
    N.TRAIN_SAMPLES_PER_SECOND: (HIGHER, "1/s"),
    N.TRAIN_TOKENS_PER_SECOND: (HIGHER, "1/s"),
    N.TRAIN_MFU_RATIO: (HIGHER, "ratio"),
    N.TRAIN_LOSS: (LOWER, ""),
    # inference series
    N.INFER_LATENCY_SECONDS: (LOWER, "s"),
    N.INFER_SERVICE_SECONDS: (LOWER, "s"),
    N.INFER_QUEUE_WAIT_SECONDS: (LOWER, "s"),
    N.INFER_TTFT_SECONDS: (LOWER, "s"),
    N.INFER_TPOT_SECONDS: (LOWER, "s"),
    N.INFER_ITL_SECONDS: (LOWER, "s"),
    N.INFER_QUEUE_DEPTH: (LOWER, ""),
    N.INFER_COLD_START_SECONDS: (LOWER, "s"),
    N.INFER_KV_CACHE_USAGE_RATIO: (LOWER, "ratio"),
    N.INFER_PREFILL_SECONDS: (LOWER, "s"),
    N.INFER_DECODE_SECONDS: (LOWER, "s"),
    N.INFER_PREFIX_CACHE_HIT_RATIO: (HIGHER, "ratio"),
    N.INFER_PREEMPTIONS_TOTAL: (LOWER, ""),
    # run samples
    "step_seconds": (LOWER, "s"),
    "tokens_per_second": (HIGHER, "1/s"),
    "samples_per_second": (HIGHER, "1/s"),
    "latency_seconds": (LOWER, "s"),
    "ttft_seconds": (LOWER, "s"),
    "tpot_seconds": (LOWER, "s"),
    "itl_seconds": (LOWER, "s"),
    "goodput": (HIGHER, "1/s"),
    "mfu": (HIGHER, "ratio"),
    "mfu_ratio": (HIGHER, "ratio"),
    "error_ratio": (LOWER, "ratio"),
    "error_rate": (LOWER, "ratio"),
}

# Scores from 0 to 1, better higher. Matched exactly or as the name's last word(s) (`eval_accuracy`);
# `acc` and `acc_norm` are lm-evaluation-harness's names.
_SCORES = ("accuracy", "acc", "acc_norm", "exact_match", "f1", "precision", "recall", "bleu", "rouge", "pass_at_1", "win_rate")
# Better lower, matched as the last word (`eval_loss`, `val_perplexity`).
_LOWER_WORDS = ("loss", "perplexity", "latency", "ttft", "tpot", "itl", "errors", "wer", "cer")
# Better higher, matched as the last word.
_HIGHER_WORDS = ("throughput", "goodput", "mfu", "rps", "qps", "tflops", "hit_ratio", "tokens_s", "samples_s")

# Unit suffixes, longest first: `_per_second` before `_seconds`.
_SUFFIXES: tuple[tuple[str, Direction, str], ...] = (
    ("_per_second", HIGHER, "1/s"),
    ("_per_s", HIGHER, "1/s"),
    ("_seconds", LOWER, "s"),
    ("_bytes", LOWER, "bytes"),
)


def _last_word_match(name: str, words: tuple[str, ...]) -> str | None:
    for w in words:
        if name == w or name.endswith("_" + w):
            return w
    return None


def lookup(name: str, overrides: Mapping[str, Direction] | None = None) -> MetricInfo:
    """Direction and unit of `name`. `overrides` (from `--direction NAME=higher`) win over the rules."""
    n = name.strip().lower()
    base = lookup_rules(n)
    if overrides and name in overrides:
        return MetricInfo(name, overrides[name], base.unit, base.score, "user")
    return MetricInfo(name, base.direction, base.unit, base.score, base.rule)


def lookup_rules(n: str) -> MetricInfo:
    if n in _EXACT:
        d, unit = _EXACT[n]
        return MetricInfo(n, d, unit)
    if _last_word_match(n, _SCORES):
        return MetricInfo(n, HIGHER, "ratio", score=True, rule="word")
    if _last_word_match(n, _LOWER_WORDS):
        return MetricInfo(n, LOWER, "s" if n.endswith(("latency", "ttft", "tpot", "itl")) else "", rule="word")
    if _last_word_match(n, _HIGHER_WORDS):
        return MetricInfo(n, HIGHER, "", rule="word")
    for suffix, d, unit in _SUFFIXES:
        if n.endswith(suffix):
            return MetricInfo(n, d, unit, rule="suffix")
    return MetricInfo(n, UNKNOWN, "", rule="unknown")


def direction_of(name: str) -> Direction:
    return lookup(name).direction


def worse_when(name: str) -> Literal["above", "below"] | None:
    """The side of a band or threshold that is bad for `name`: "above" for lower-is-better metrics,
    "below" for higher-is-better ones, None when unknown."""
    d = direction_of(name)
    return "above" if d == LOWER else "below" if d == HIGHER else None


def parse_direction(text: str) -> tuple[str, Direction]:
    """`NAME=higher` or `NAME=lower` (the `--direction` option) -> (name, direction)."""
    name, sep, side = text.partition("=")
    side = side.strip().lower()
    if not sep or not name.strip() or side not in ("higher", "lower"):
        raise BadInputError(f"Cannot read --direction {shown(text)}.", hint="Write METRIC=higher or METRIC=lower, e.g. --direction my_score=higher.")
    return name.strip(), HIGHER if side == "higher" else LOWER
