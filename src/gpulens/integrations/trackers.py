"""Bridges from a training run's gpulens numbers to the experiment tracker a team already uses:
Weights & Biases, MLflow or TensorBoard (each behind its extra: `gpulens[wandb]`, `gpulens[mlflow]`,
`gpulens[tensorboard]`).

    GpulensCallback(job="llama-ft", store="run.db", trackers="auto")         # Lightning
    GpulensTrainerCallback(job="llama-ft", store="run.db", trackers="auto")  # HF Trainer

What reaches the tracker, under `gpulens/`: each step's breakdown (the same series the store gets:
step time, data wait, compute, communication wait, checkpoint, their ratios, throughput, MFU,
allocator memory), the latest GPU readings of this host when an agent samples them into the same
store (`gpulens/gpu<N>/...`), and at the end of training the diagnosis findings for the job
(a table in W&B, `gpulens/findings.json` in MLflow, a text panel in TensorBoard).

Steps are collected in the monitor's writer thread and handed to the tracker from the training
thread (`TrackerBridge.drain()`, called by the callbacks), because trackers keep per-thread state
(MLflow's active run) and must never slow or break the training loop: a tracker that fails is
logged once and left out.

The findings come through a callback (`FindingsSource`) that whoever builds the bridge passes; the
framework callbacks pass `integrations.findings.job_findings` (the job's diagnosis over the monitor's
store, in this process), so the bridge itself never decides anything.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from gpulens.errors import MonitorUsageError
from gpulens.vocab import gpu as G
from gpulens.workload.training.records import StepRecord, step_series_values

if TYPE_CHECKING:
    from gpulens.workload.training.monitor import TrainingMonitor

log = logging.getLogger(__name__)

PREFIX = "gpulens/"
STEP_KEY = "gpulens_step"  # W&B's x axis for gpulens's rows (outside the `gpulens/*` glob it indexes)
GPU_SERIES = (G.GPU_UTILIZATION_RATIO, G.GPU_MEMORY_USED_BYTES, G.GPU_TEMPERATURE_CELSIUS, G.GPU_POWER_WATTS)
FRESH_SECONDS = 120.0  # GPU readings older than this are not the run's present
FINDING_COLUMNS = ("kind", "severity", "workload", "summary", "advice")

# The job's findings as JSON-ready dicts (`Finding.to_dict()`, as `gpulens diagnose --format json`
# writes them); None or an exception: none to log.
FindingsSource = Callable[["TrainingMonitor"], Sequence[Mapping[str, Any]] | None]


class Tracker(Protocol):
    name: str

    def log_metrics(self, values: dict[str, float], step: int) -> None: ...

    def log_findings(self, findings: list[dict[str, Any]], step: int) -> None: ...

    def close(self) -> None: ...


def _finding_rows(findings: list[dict[str, Any]]) -> list[list[str]]:
    return [[str(f.get("kind", "")), str(f.get("severity", "")), str(f.get("workload", "")), str(f.get("summary", "")),
             " / ".join(f.get("advice") or [])] for f in findings]


class WandbTracker:
    """Logs to a W&B run (the active one, `wandb.run`, unless given): rows of their own, plotted
    against `gpulens_step`, so they do not shift the step axis the user's own logging uses."""

    name = "wandb"

    def __init__(self, run: Any = None):
        import wandb

        self._wandb = wandb
        active = run if run is not None else wandb.run
        if active is None:
            raise MonitorUsageError("There is no active W&B run to log gpulens's numbers to.",
                                    hint="Call wandb.init() before training, or pass WandbTracker(run=...).")
        self.run: Any = active
        self.run.define_metric(STEP_KEY, hidden=True)
        self.run.define_metric(PREFIX + "*", step_metric=STEP_KEY)

    def log_metrics(self, values: dict[str, float], step: int) -> None:
        self.run.log({**values, STEP_KEY: step})

    def log_findings(self, findings: list[dict[str, Any]], step: int) -> None:
        table = self._wandb.Table(columns=list(FINDING_COLUMNS), data=_finding_rows(findings))
        self.run.log({PREFIX + "findings": table, STEP_KEY: step})
        self.run.summary[PREFIX + "findings_count"] = len(findings)

    def close(self) -> None:
        pass  # the run is the user's: they finish it


class MlflowTracker:
    """Logs to an MLflow run: the active one (`mlflow.active_run()`) unless a run id is given.
    The client is bound to the run id, so it works from any thread."""

    name = "mlflow"

    def __init__(self, run_id: str | None = None, client: Any = None):
        import mlflow

        if run_id is None:
            run = mlflow.active_run()
            if run is None:
                raise MonitorUsageError("There is no active MLflow run to log gpulens's numbers to.",
                                        hint="Start one (mlflow.start_run()) before training, or pass MlflowTracker(run_id=...).")
            run_id = run.info.run_id
        self.run_id = run_id
        self.client = client if client is not None else mlflow.tracking.MlflowClient()

    def log_metrics(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        ms = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, ms, step) for k, v in values.items()])

    def log_findings(self, findings: list[dict[str, Any]], step: int) -> None:
        self.client.log_dict(self.run_id, {"findings": findings}, PREFIX + "findings.json")
        self.client.set_tag(self.run_id, PREFIX + "findings_count", str(len(findings)))

    def close(self) -> None:
        pass


class TensorBoardTracker:
    """Writes scalars to a TensorBoard SummaryWriter: the user's (Lightning's TensorBoardLogger
    `.experiment`), or one of its own in `log_dir` (TensorBoard merges the files of one folder)."""

    name = "tensorboard"

    def __init__(self, writer: Any = None, log_dir: str | None = None):
        self._owns = writer is None
        if writer is None:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

            writer = SummaryWriter(log_dir=log_dir)
        self.writer = writer

    def log_metrics(self, values: dict[str, float], step: int) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)

    def log_findings(self, findings: list[dict[str, Any]], step: int) -> None:
        lines = ["| " + " | ".join(FINDING_COLUMNS) + " |", "|" + " --- |" * len(FINDING_COLUMNS)]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in _finding_rows(findings)]
        self.writer.add_text(PREFIX + "findings", "\n".join(lines) if findings else "no findings", step)

    def close(self) -> None:
        self.writer.flush()
        if self._owns:
            self.writer.close()


_BY_NAME = {"wandb": WandbTracker, "mlflow": MlflowTracker, "tensorboard": TensorBoardTracker}


def make_trackers(spec: str | Sequence[str | Tracker] | None, found: Iterable[Tracker] = ()) -> list[Tracker]:
    """`spec`: None (none), "auto" (the trackers `found` in the framework's setup plus an active
    W&B or MLflow run), or a list of names ("wandb", "mlflow", "tensorboard") and Tracker objects."""
    if spec is None:
        return []
    if spec == "auto":
        out = list(found)
        have = {t.name for t in out}
        wandb = sys.modules.get("wandb")  # imported by the user: never import a tracker they do not use
        if "wandb" not in have and wandb is not None and getattr(wandb, "run", None) is not None:
            out.append(WandbTracker())
        mlflow = sys.modules.get("mlflow")
        if "mlflow" not in have and mlflow is not None and mlflow.active_run() is not None:
            out.append(MlflowTracker())
        return out
    if isinstance(spec, str):
        spec = [spec]
    out = []
    for item in spec:
        if isinstance(item, str):
            cls = _BY_NAME.get(item)
            if cls is None:
                raise MonitorUsageError(f"Unknown tracker {item!r}.", hint="Use auto, or any of wandb, mlflow, tensorboard.")
            try:
                out.append(cls())
            except ImportError:
                raise MonitorUsageError(f"The {item} tracker is not installed.", hint=f"pip install 'gpulens[{item}]'.") from None
        else:
            out.append(item)
    return out


def lightning_trackers(trainer: Any) -> list[Tracker]:
    """The trackers behind a Lightning Trainer's loggers (W&B, MLflow, TensorBoard)."""
    out: list[Tracker] = []
    for logger in getattr(trainer, "loggers", None) or []:
        kind = type(logger).__name__
        if kind == "WandbLogger":
            out.append(WandbTracker(run=logger.experiment))
        elif kind == "MLFlowLogger":
            out.append(MlflowTracker(run_id=logger.run_id, client=logger.experiment))
        elif kind == "TensorBoardLogger":
            out.append(TensorBoardTracker(writer=logger.experiment))
    return out


def hf_trackers(args: Any) -> list[Tracker]:
    """The trackers a HF Trainer reports to (`report_to`), once its own callbacks set them up."""
    report_to = getattr(args, "report_to", None) or []
    if isinstance(report_to, str):
        report_to = [report_to]
    out: list[Tracker] = []
    wandb, mlflow = sys.modules.get("wandb"), sys.modules.get("mlflow")
    if "wandb" in report_to and wandb is not None and getattr(wandb, "run", None) is not None:
        out.append(WandbTracker())
    if "mlflow" in report_to and mlflow is not None and mlflow.active_run() is not None:
        out.append(MlflowTracker())
    if "tensorboard" in report_to:
        # transformers 4 names the Trainer's folder (logging_dir); 5 takes TENSORBOARD_LOGGING_DIR or
        # makes a dated one under output_dir/runs: gpulens's run is then output_dir/runs/gpulens beside it
        log_dir = (getattr(args, "logging_dir", None) or os.environ.get("TENSORBOARD_LOGGING_DIR")
                   or os.path.join(args.output_dir, "runs", "gpulens"))
        out.append(TensorBoardTracker(log_dir=log_dir))
    return out


class TrackerBridge:
    """Hands a monitor's steps, this host's GPU readings and the job's findings to trackers.
    `every_n_steps`: log one step in n (the breakdown of the others is still in the store).
    `findings`: where the job's findings come from at the end (None: no findings are logged)."""

    def __init__(self, monitor: TrainingMonitor, trackers: Sequence[Tracker], *, every_n_steps: int = 1,
                 gpu_every_seconds: float = 30.0, findings: FindingsSource | None = None):
        if every_n_steps < 1:
            raise MonitorUsageError(f"every_n_steps must be at least 1, not {every_n_steps}.")
        self.monitor = monitor
        self.trackers = list(trackers)
        self.every_n_steps = every_n_steps
        self.gpu_every_seconds = gpu_every_seconds
        self.findings_source = findings
        self._pending: deque[StepRecord] = deque()
        self._gpu_due = 0.0
        self._last_step = 0
        self._finished = False
        if self.trackers:
            monitor.on_step(self._pending.append)  # the writer thread; deque.append is atomic

    def drain(self) -> int:
        """Log what the writer has produced since the last call; returns the steps logged."""
        n = 0
        while self._pending:
            rec = self._pending.popleft()
            step = rec.step if rec.step is not None else self._last_step + 1
            self._last_step = step
            if step % self.every_n_steps:
                continue
            values = {PREFIX + name: v for name, v in step_series_values(rec)}
            values.update(self._gpu_values())
            self._each(lambda t, v=values, s=step: t.log_metrics(v, s))
            n += 1
        return n

    def finish(self, findings: bool = True) -> None:
        """At the end of training: the last steps, then the job's findings. Idempotent."""
        if self._finished or not self.trackers:
            return
        self._finished = True
        if not self.monitor.closed:
            self.monitor.flush()
        self.drain()
        if findings:
            rows = self._findings()
            if rows is not None:
                self._each(lambda t: t.log_findings(rows, self._last_step))
        self._each(lambda t: t.close())

    # ------------------------------------------------------------ sources
    def _gpu_values(self) -> dict[str, float]:
        now = time.monotonic()
        if now < self._gpu_due:
            return {}
        self._gpu_due = now + self.gpu_every_seconds
        out: dict[str, float] = {}
        wall = time.time()
        if self.monitor.store is None:  # records go to the node's agent: no store here to read GPU series from
            return out
        try:
            for name in GPU_SERIES:
                for v in self.monitor.store.latest(name):
                    if v.key.labels.get("host", self.monitor.host) == self.monitor.host and wall - v.t <= FRESH_SECONDS:
                        out[f"{PREFIX}gpu{v.key.labels.get('gpu', '0')}/{name}"] = v.value
        except Exception as e:  # the store is the monitor's; a failure here must not stop training
            log.debug("gpulens: GPU readings for the tracker: %s", e)
        return out

    def _findings(self) -> list[dict[str, Any]] | None:
        if self.findings_source is None:
            return None
        try:
            found = self.findings_source(self.monitor)
            return None if found is None else [dict(f) for f in found]
        except Exception as e:
            log.warning("gpulens: no findings for the tracker (%s)", e)
            return None

    def _each(self, fn: Any) -> None:
        for t in list(self.trackers):
            try:
                fn(t)
            except Exception as e:  # a tracker must never stop the training
                log.warning("gpulens: the %s tracker failed and is left out: %s", t.name, e)
                self.trackers.remove(t)
