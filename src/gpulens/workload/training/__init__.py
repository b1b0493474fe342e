"""Training instrumentation: `TrainingMonitor` for a user's own loop, framework callbacks
(`gpulens.integrations.lightning`, `.hf`), communication timing (`.distributed`) and the
importer of recorded `train_step` records (`.importer`)."""

from gpulens.workload.training.distributed import ddp_comm_hook, timed_collectives
from gpulens.workload.training.monitor import StepContext, TrainingMonitor
from gpulens.workload.training.records import StepRecord, record_from_dict

__all__ = ["StepContext", "StepRecord", "TrainingMonitor", "ddp_comm_hook", "record_from_dict", "timed_collectives"]
