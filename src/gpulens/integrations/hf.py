"""A Hugging Face `Trainer` callback that feeds a TrainingMonitor.

    from gpulens.integrations.hf import GpulensTrainerCallback
    trainer = Trainer(..., callbacks=[GpulensTrainerCallback(job="llama-ft", store="run.db", tokens_per_sample=1024)])

Per optimizer step (all its gradient-accumulation micro-batches) it records the step time, the
wait for the next batches (the Trainer fetches them between steps), and the logged loss. After a
step the Trainer logs, evaluates and saves (`_maybe_log_save_evaluate`, which runs after
`on_step_end`): each evaluation is its own phase (`train_eval_seconds`, from the step's end or the
previous phase to `on_evaluate`, so it includes the logging just before it), each save is charged
to the step as checkpoint time (from the evaluation's end, if one ran), and only what is left
before the next step is data wait. The Trainer has no hook around an exception, so an
out-of-memory error is recorded only with `TrainingMonitor.step()` or the Lightning callback.
"""

from __future__ import annotations

from typing import Any

from gpulens.workload.training.monitor import TrainingMonitor


def _callback_base() -> type:
    try:
        from transformers import TrainerCallback
    except ImportError:
        raise ImportError("The Trainer callback needs transformers: pip install 'gpulens[hf]'.") from None
    return TrainerCallback


class GpulensTrainerCallback(_callback_base()):  # type: ignore[misc]
    """job/store/flops_per_token/peak_flops and any other TrainingMonitor argument, or a ready
    `monitor=`. tokens_per_sample: sequence length, so tokens/s and MFU can be computed.
    trackers: also log to W&B / MLflow / TensorBoard ("auto": those in `report_to`, set up by the
    Trainer's own callbacks; or names / Tracker objects; see gpulens.integrations.trackers).
    Every time it measures comes from the monitor's clock (`clock=`, as for TrainingMonitor)."""

    def __init__(self, job: str | None = None, store: Any = None, *, monitor: TrainingMonitor | None = None,
                 tokens_per_sample: int | None = None, trackers: Any = None, tracker_every_n_steps: int = 1,
                 **monitor_args: Any):
        if monitor is None and not job:
            from gpulens.errors import MonitorUsageError

            raise MonitorUsageError("GpulensTrainerCallback needs a job name or a monitor.", hint="GpulensTrainerCallback(job='my-run', store='run.db').")
        self.monitor = monitor
        self._owns = monitor is None
        self._args = dict(job=job, store=store, **monitor_args)
        self._tokens_per_sample = tokens_per_sample
        self._samples: int | None = None
        self._last_end: float | None = None  # the end of the last step or of the phase after it
        self._trackers_spec, self._tracker_every = trackers, tracker_every_n_steps
        self.trackers: Any = None  # a TrackerBridge once training starts, when trackers are asked for

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is None:
            self.monitor = TrainingMonitor(rank=args.process_index, world_size=args.world_size, **self._args)
        self._samples = args.per_device_train_batch_size * args.gradient_accumulation_steps
        # The Trainer's reporting callbacks come first, so their runs exist by now; they log on the main process only.
        if self._trackers_spec is not None and self.trackers is None and state.is_world_process_zero:
            from gpulens.integrations.findings import job_findings
            from gpulens.integrations.trackers import (
                TrackerBridge,
                hf_trackers,
                make_trackers,
            )

            found = hf_trackers(args) if self._trackers_spec == "auto" else []
            self.trackers = TrackerBridge(self.monitor, make_trackers(self._trackers_spec, found), every_n_steps=self._tracker_every,
                                          findings=job_findings)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        mon = self.monitor
        if mon is None:
            return
        if self._last_end is not None:
            mon.record_data_wait(mon.clock.monotonic() - self._last_end)
        tokens = self._samples * self._tokens_per_sample if self._samples and self._tokens_per_sample else None
        if mon.in_step:  # the previous batch ended without its end hook: close it rather than fail the job
            mon.end_step()
        mon.begin_step(self._samples, tokens)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        mon = self.monitor
        if mon is None or mon.current_step is None:
            return
        mon.end_step()
        self._last_end = mon.clock.monotonic()
        if self.trackers is not None:
            self.trackers.drain()  # steps the writer has finished (a step or two behind)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self.monitor is not None and logs and "loss" in logs:
            self.monitor.record_loss(logs["loss"])

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Called right after the evaluation; it began where the step (or the phase after it) ended.
        # An evaluation outside training (trainer.evaluate()) has no step before it: not recorded.
        mon = self.monitor
        if mon is not None and self._last_end is not None and not mon.closed and not mon.in_step:
            now = mon.clock.monotonic()
            mon.record_evaluation(now - self._last_end)
            self._last_end = now

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Called right after the save, which began after the evaluation (if any) that followed the step.
        if self.monitor is not None and self._last_end is not None:
            now = self.monitor.clock.monotonic()
            self.monitor.record_checkpoint(now - self._last_end)
            self._last_end = now

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._last_end = None  # a later trainer.evaluate() is not a phase of this run
        if self.trackers is not None:
            self.trackers.finish()
        if self.monitor is not None and self._owns:
            self.monitor.close()
