"""The work in one step: which settings of a run set it, and which metrics are per step.

Halving the batch halves the work a step does, so its step time falls without anything getting
faster: a per-step figure (step time, steps per second) compares only between runs that do the
same work in a step. Throughput per token or per sample stays comparable, and is what a change of
batch size or sequence length should be judged by. `compare` reads these to call per-step metrics
"not comparable", and the automatic baseline (`baseline_for`) prefers a run with the same work.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpulens.runs.diff import Change, diff

# Configuration keys (the last part of a dotted key, so `knobs.batch_size` counts too) that set how
# much one step computes: the sequences and tokens in it, and the model that processes them.
STEP_WORK_SETTINGS = frozenset({
    # sequences per step
    "batch", "batch_size", "micro_batch", "micro_batch_size", "mbs", "global_batch_size", "train_batch_size",
    "per_device_train_batch_size", "gradient_accumulation_steps", "grad_accum_steps", "accumulation_steps",
    # tokens per sequence
    "seq_len", "seq_length", "sequence_length", "max_seq_len", "max_seq_length", "block_size", "context_length",
    # the model (bench train's shape; heads alone split the same hidden size and change no work)
    "layers", "hidden", "ffn_mult",
})

# A metric whose name has one of these words is a figure of one step or one batch.
_PER_STEP_WORDS = frozenset({"step", "steps", "batch", "batches", "iteration", "iterations"})


def is_per_step(metric: str) -> bool:
    """`step_seconds`, `train_step_seconds`, `steps_per_second`, `batch_seconds`: yes; `tokens_per_second`: no."""
    return bool(_PER_STEP_WORDS & set(metric.lower().split("_")))


def step_work_changes(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[Change]:
    """The changes from `old` to `new` configuration that change the work in one step."""
    return [c for c in diff(old, new) if c.key.rsplit(".", 1)[-1].lower() in STEP_WORK_SETTINGS]


def describe(changes: list[Change]) -> str:
    """"batch_size differs: 16 → 8" (and the others, joined)."""
    def value(v: Any) -> str:
        return "(none)" if v is None else str(v)

    return " and ".join(f"{c.key} differs: {value(c.old)} → {value(c.new)}" for c in changes)
