"""Samples and tokens of a batch, for callbacks that see the batch but not the user's counts."""

from __future__ import annotations

from typing import Any


def batch_counts(batch: Any) -> tuple[int | None, int | None]:
    """(samples, tokens) of a tensor, a (inputs, targets) pair or a dict with input_ids."""
    if isinstance(batch, dict):
        ids = batch.get("input_ids")
        if ids is not None and hasattr(ids, "shape"):
            mask = batch.get("attention_mask")
            tokens = int(mask.sum()) if mask is not None and hasattr(mask, "sum") else int(ids.numel())
            return int(ids.shape[0]), tokens
        for v in batch.values():
            if hasattr(v, "shape") and len(v.shape):
                return int(v.shape[0]), None
        return None, None
    if isinstance(batch, list | tuple) and batch:
        return batch_counts(batch[0])[0], None
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape):
        return int(shape[0]), None
    return None, None
