"""Running the user's training command once and reading back what its monitor recorded.

The command runs in its own process group with `GPULENS_STORE` (the tune's store) and
`GPULENS_RUN` (the trial's tag) in its environment; its `TrainingMonitor` writes steps there and
tags its start event with the trial. The tune polls the store while it runs, so a command that
would train for hours is stopped (SIGINT, so the monitor flushes) once it has the steps asked for.
A crash, an out-of-memory error or a NaN loss is read from the exit code, the stderr tail and the
monitor's events, and returned, never raised.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.workload.training.monitor import ENV_RUN, ENV_STORE
from gpulens.workload.training.records import StepRecord, record_from_dict
from gpulens.workload.wire import ENV_AGENT

POLL_SECONDS = 0.25
STOP_GRACE_SECONDS = 10.0
STDERR_TAIL_LINES = 6


@dataclass
class ProcessRun:
    """One run of the command: its steps (oldest first) and how it ended."""

    argv: list[str]
    tag: str
    started: float  # unix seconds
    ended: float
    exit_code: int | None
    stopped: bool  # the tune stopped it after the steps it asked for
    steps: list[StepRecord] = field(default_factory=list)
    job: str | None = None
    oom: dict | None = None  # the monitor's train_oom event data
    nan_loss_step: int | None = None
    stderr_tail: str = ""
    timed_out: bool = False
    start_error: str | None = None  # the command could not be started at all

    @property
    def failure(self) -> str | None:
        """One sentence saying why this run cannot be measured, or None."""
        if self.start_error is not None:
            return self.start_error
        if self.oom is not None:
            return f"out of memory at step {self.oom.get('step', '?')}: {self.oom.get('message', '')}".rstrip(": ")
        if self.nan_loss_step is not None:
            return f"the loss became NaN at step {self.nan_loss_step}"
        if self.timed_out:
            return "the command ran past the time left in the budget and was stopped"
        if self.exit_code not in (0, None) and not self.stopped:
            last = self.stderr_tail.strip().splitlines()[-1:] or [""]
            return f"the command exited with code {self.exit_code}" + (f": {last[0][:300]}" if last[0] else "")
        if not self.steps:
            return ("the command recorded no training steps: its loop needs gpulens's TrainingMonitor (or a gpulens "
                    "callback) created without a store argument, so that it records where tune reads")
        return None


def _read(store: Store, tag: str, t0: float) -> tuple[dict[str, str] | None, int | None, list[StepRecord], dict | None, int | None]:
    """The trial's monitor labels and pid, its steps, its OOM event and its first NaN step."""
    starts = [e for e in store.events(N.EV_TRAIN_START, start=t0 - 1) if e.data.get("run") == tag]
    if not starts:
        return None, None, [], None, None
    labels, pid = dict(starts[0].labels), starts[0].data.get("pid")
    steps = [r for e in store.events(N.EV_TRAIN_STEP, start=t0 - 1, labels=labels)
             if e.data.get("pid") == pid and (r := record_from_dict(e.data)) is not None]
    steps.sort(key=lambda r: r.t_start)
    oom = next((e.data for e in store.events(N.EV_TRAIN_OOM, start=t0 - 1, labels=labels) if e.data.get("pid") in (pid, None)), None)
    nan = next((s.step for s in steps if s.loss is not None and not math.isfinite(s.loss)), None)
    if nan is None:
        nan_ev = store.events(N.EV_TRAIN_NAN, start=t0 - 1, labels=labels)
        nan = int(nan_ev[0].data.get("step", 0)) if nan_ev else None
    return labels, pid, steps, oom, nan


def run_command(
    argv: Sequence[str],
    store: Store,
    tag: str,
    *,
    steps_wanted: int,
    stop_when_done: bool,
    timeout_seconds: float,
    on_poll: Callable[[list[StepRecord]], None] | None = None,
    cwd: Path | None = None,
) -> ProcessRun:
    # the tune reads its own store: a node agent named in the environment must not take the records
    env = dict(os.environ, **{ENV_STORE: str(store.path), ENV_RUN: tag, ENV_AGENT: "off"})
    t0 = time.time()
    deadline = time.monotonic() + timeout_seconds
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(list(argv), env=env, stdout=subprocess.DEVNULL, stderr=err, cwd=cwd, start_new_session=True)
        except OSError as e:
            return ProcessRun(list(argv), tag, t0, time.time(), None, False,
                              start_error=f"cannot start the command {argv[0]!r}: {e.strerror or e}")
        stopped = timed_out = False
        seen = 0
        try:
            while proc.poll() is None:
                time.sleep(POLL_SECONDS)
                _, _, steps, oom, nan = _read(store, tag, t0)
                if on_poll is not None and len(steps) != seen:
                    seen = len(steps)
                    on_poll(steps)
                # After an OOM the command is left to die of it (or recover) on its own; a NaN loss
                # does not heal, so that run is stopped at once.
                if nan is not None or (stop_when_done and oom is None and len(steps) >= steps_wanted):
                    stopped = True
                    _stop(proc)
                elif time.monotonic() > deadline:
                    timed_out = True
                    _stop(proc)
        except KeyboardInterrupt:  # the user stopped the tune: stop the command too (it has its own session)
            _stop(proc)
            raise
        err.seek(0)
        tail = "\n".join(err.read().decode(errors="replace").splitlines()[-STDERR_TAIL_LINES:])
    labels, _, steps, oom, nan = _read(store, tag, t0)
    run = ProcessRun(list(argv), tag, t0, time.time(), proc.returncode, stopped, steps[:steps_wanted] if stopped else steps,
                     (labels or {}).get(N.TRAIN_JOB_LABEL), oom, nan, tail, timed_out)
    if on_poll is not None:
        on_poll(run.steps)
    return run


def _stop(proc: subprocess.Popen) -> None:
    """SIGINT to the command's process group (the monitor's atexit flush runs), then SIGKILL."""
    for sig, wait in ((signal.SIGINT, STOP_GRACE_SECONDS), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
