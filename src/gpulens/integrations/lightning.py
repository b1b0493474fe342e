"""A PyTorch Lightning callback that feeds a TrainingMonitor.

    from gpulens.integrations.lightning import GpulensCallback
    trainer = L.Trainer(callbacks=[GpulensCallback(job="llama-ft", store="run.db", flops_per_token=6 * n)])

Per optimizer batch it records the step (forward, backward, optimizer), the wait for the batch
(the time between one batch's end and the next one's start, which is where Lightning fetches it),
the loss, the time spent saving checkpoints (charged to the step before the save) and each
validation run during fit as its own phase (`train_eval_seconds`), so neither counts as the next
batch's data wait. An out-of-memory error inside a batch is recorded with the allocator's numbers
before Lightning re-raises it.
"""

from __future__ import annotations

from typing import Any

from gpulens.workload.training.batch import batch_counts
from gpulens.workload.training.monitor import TrainingMonitor


def _callback_base() -> type:
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback  # the older package name
        except ImportError:
            raise ImportError("The Lightning callback needs PyTorch Lightning: pip install 'gpulens[lightning]'.") from None
    return Callback


class GpulensCallback(_callback_base()):  # type: ignore[misc]
    """job/store/flops_per_token/peak_flops and any other TrainingMonitor argument; or pass a
    ready `monitor=`. tokens_per_sample: tokens of one sample when batches are not dicts with input_ids.
    trackers: also log to W&B / MLflow / TensorBoard ("auto": the Trainer's loggers and an active
    W&B or MLflow run; or names / Tracker objects; see gpulens.integrations.trackers). Every
    time it measures comes from the monitor's clock (`clock=`, as for TrainingMonitor)."""

    def __init__(self, job: str | None = None, store: Any = None, *, monitor: TrainingMonitor | None = None,
                 tokens_per_sample: int | None = None, trackers: Any = None, tracker_every_n_steps: int = 1,
                 **monitor_args: Any):
        super().__init__()
        if monitor is None and not job:
            from gpulens.errors import MonitorUsageError

            raise MonitorUsageError("GpulensCallback needs a job name or a monitor.", hint="GpulensCallback(job='my-run', store='run.db').")
        self.monitor = monitor
        self._owns = monitor is None
        self._args = dict(job=job, store=store, **monitor_args)
        self._tokens_per_sample = tokens_per_sample
        self._last_end: float | None = None
        self._eval_t0: float | None = None
        self._restore: Any = None
        self._trackers_spec, self._tracker_every = trackers, tracker_every_n_steps
        self.trackers: Any = None  # a TrackerBridge once fit starts, when trackers are asked for

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        if self.monitor is None:
            self.monitor = TrainingMonitor(rank=trainer.global_rank, world_size=trainer.world_size, **self._args)
            self._time_saves(trainer, self.monitor)
        if self._trackers_spec is not None and self.trackers is None and trainer.global_rank == 0:  # loggers log on rank 0
            from gpulens.integrations.findings import job_findings
            from gpulens.integrations.trackers import (
                TrackerBridge,
                lightning_trackers,
                make_trackers,
            )

            found = lightning_trackers(trainer) if self._trackers_spec == "auto" else []
            self.trackers = TrackerBridge(self.monitor, make_trackers(self._trackers_spec, found), every_n_steps=self._tracker_every,
                                          findings=job_findings)

    def _time_saves(self, trainer: Any, mon: TrainingMonitor) -> None:
        original = trainer.save_checkpoint

        def timed_save(*args: Any, **kwargs: Any) -> Any:
            if mon.in_step or mon.closed:  # inside a batch it counts with the step; after fit, not at all
                return original(*args, **kwargs)
            with mon.checkpoint():
                return original(*args, **kwargs)

        trainer.save_checkpoint = timed_save
        self._restore = lambda: setattr(trainer, "save_checkpoint", original)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        mon = self.monitor
        if mon is None:
            return
        now = mon.clock.monotonic()
        if self._last_end is not None:
            mon.record_data_wait(now - self._last_end)
        samples, tokens = batch_counts(batch)
        if tokens is None and samples and self._tokens_per_sample:
            tokens = samples * self._tokens_per_sample
        if mon.in_step:  # the previous batch ended without its end hook: close it rather than fail the job
            mon.end_step()
        mon.begin_step(samples, tokens)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        mon = self.monitor
        if mon is None or mon.current_step is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        mon.current_step.loss = loss
        mon.end_step()
        self._last_end = mon.clock.monotonic()
        if self.trackers is not None:
            self.trackers.drain()  # steps the writer has finished (a step or two behind)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is not None and not trainer.sanity_checking and not self.monitor.closed:
            self._eval_t0 = self.monitor.clock.monotonic()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        mon, t0 = self.monitor, self._eval_t0
        self._eval_t0 = None
        if mon is None or t0 is None or mon.closed:
            return
        now = mon.clock.monotonic()
        mon.record_evaluation(now - t0)
        if self._last_end is not None:
            self._last_end = now  # the next batch's wait starts after the validation

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        mon = self.monitor
        if mon is not None and mon.current_step is not None:
            mon.end_step(exception)  # records an OOM; Lightning re-raises the error
        self._close()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._last_end = None  # the gap to the next epoch is validation and bookkeeping, not data wait

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self._close()

    def _close(self) -> None:
        if self.trackers is not None:
            self.trackers.finish()
        if self._restore is not None:
            self._restore()
            self._restore = None
        if self.monitor is not None and self._owns:
            self.monitor.close()
