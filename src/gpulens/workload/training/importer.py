"""Recorded training events -> training series, as `gpulens replay` imports a trace.

Reads the H200 session's `train_step` lines (data wait, compute, checkpoint, loss, memory), the
co-location recording's sparser ones (`t_start`, `t_end`, `tokens`, `pid`) and gpulens's own
recordings (the monitor's `train_step`, `train_start`, `train_oom`, `train_nan_loss` and
`train_step_outlier` events, and what a live monitor sends its agent: `train_eval` and stray
`train_loss` / `train_checkpoint_seconds` samples). Series carry labels job / rank / host; step
events carry the pid.
"""

from __future__ import annotations

import math
from typing import Any

from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.workload.fields import duration, field, stored_value
from gpulens.workload.importers import ImportContext, event_time, register_importer
from gpulens.workload.training.records import record_from_dict, step_fault, step_series_values, write_step


def _labels(record: dict[str, Any], ctx: ImportContext) -> dict[str, str]:
    rank = record.get("rank", 0)
    return {N.TRAIN_JOB_LABEL: str(record.get(N.TRAIN_JOB_LABEL) or record.get("job") or ctx.job), "rank": str(rank if rank is not None else 0), "host": ctx.host_of(record)}


@register_importer(N.EV_COLD_START)
def _remember_parameters(record: dict[str, Any], store: Store, ctx: ImportContext) -> None:
    """A model load that states its parameter count lets the steps after it carry an MFU."""
    params = record.get("params")
    if isinstance(params, int | float) and params > 0:
        ctx.facts["params"] = float(params)


def _mfu_args(ctx: ImportContext) -> dict[str, float]:
    """MFU of recorded steps that carry none: tokens/s x 6 N / the recorded GPU's dense BF16 peak.
    Only 6 N: a recording gives the parameter count, not the shapes the attention term needs, so
    this slightly understates MFU (docs/training.md)."""
    params = ctx.facts.get("params")
    if not params or not ctx.gpu_model:
        return {}
    if "peak_flops" not in ctx.facts:
        try:
            from gpulens.plan.catalog import find_gpu

            ctx.facts["peak_flops"] = find_gpu(ctx.gpu_model).peak_flops("bf16")
        except Exception:  # an unknown GPU: no MFU rather than a wrong one
            ctx.facts["peak_flops"] = None
    peak = ctx.facts["peak_flops"]
    return {"peak_flops": peak, "flops_per_token": 6.0 * params} if peak else {}


@register_importer(N.EV_TRAIN_STEP)
def import_train_step(record: dict[str, Any], store: Store, ctx: ImportContext) -> None:
    """One step. A record it cannot store as measured raises ValueError (the import skips and counts
    it): no usable times, an end before its start, a value the store cannot keep."""
    fault = step_fault(record)
    if fault:
        raise ValueError(fault)
    rec = record_from_dict(record)
    if rec is None:
        raise ValueError(f"a {N.EV_TRAIN_STEP} record needs t_end and t_start (or step_s)")
    mfu_args = _mfu_args(ctx)
    for name, value in step_series_values(rec, **mfu_args):
        # a finite value past the store's bound is no measurement (a loss of 1e308); NaN and infinite
        # losses are what a diverging run records (train_nan_loss): the step is kept, as a live one is
        if math.isfinite(value) and stored_value(value) is None:
            raise ValueError(f"its {name} is {value!r}, which the store cannot keep")
    labels = _labels(record, ctx)
    write_step(store, labels, rec, ctx.ids_for(labels), **mfu_args)


def _import_labelled(record: dict[str, Any], store: Store, ctx: ImportContext) -> None:
    t = event_time(record)
    if t is not None:
        data = {k: v for k, v in record.items() if k not in ("kind", "phase")}
        store.event(str(record["kind"]), t, _labels(record, ctx), data)


for _kind in (N.EV_TRAIN_START, N.EV_TRAIN_OOM, N.EV_TRAIN_NAN, N.EV_TRAIN_STEP_OUTLIER):
    register_importer(_kind)(_import_labelled)


@register_importer(N.EV_TRAIN_EVAL)
def import_train_eval(record: dict[str, Any], store: Store, ctx: ImportContext) -> None:
    """An evaluation run: its `train_eval_seconds` sample and its event, as the monitor writes them."""
    t, seconds = event_time(record), field(record, "seconds", duration)
    if t is None or seconds is None:
        raise ValueError(f"a {N.EV_TRAIN_EVAL} record needs t and seconds")
    labels = _labels(record, ctx)
    store.write(N.TRAIN_EVAL_SECONDS, labels, t, seconds)
    store.event(N.EV_TRAIN_EVAL, t, labels, {k: v for k, v in record.items() if k not in ("kind", "phase")})


def _import_sample(record: dict[str, Any], store: Store, ctx: ImportContext) -> None:
    """A sample of its own that a live monitor sends (a loss logged after its step was written, a
    checkpoint before the first step): kind is the series, `value` its value at `t`."""
    t, value = event_time(record), field(record, "value")
    if t is None or value is None:
        raise ValueError(f"a {record.get('kind')} record needs t and value")
    store.write(str(record["kind"]), _labels(record, ctx), t, value)


for _kind in (N.TRAIN_LOSS, N.TRAIN_CHECKPOINT_SECONDS):
    register_importer(_kind)(_import_sample)
