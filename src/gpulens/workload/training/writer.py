"""The monitor's background writer: queue of raw timings -> step records -> an output (the store,
or the node's agent: `training.outputs`).

It runs off the training thread so that the loop pays only for a tuple append. A store write that
fails (locked, disk full) is logged and retried with backoff; the samples stay buffered in the
store and are committed on the next success. Nothing here raises into the training loop.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from gpulens.errors import StoreError
from gpulens.store import Store
from gpulens.vocab import names as N
from gpulens.workload.training import device as dev
from gpulens.workload.training.outputs import StepOutput, StoreOutput
from gpulens.workload.training.records import StepRecord

log = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 30.0
HOLD_SECONDS = 10.0  # longest a finished step waits for a checkpoint or loss that belongs to it
MAX_RETRY_STEPS = 100_000  # steps held while the store refuses even new series; beyond, the oldest go (counted)


class StepWriter:
    def __init__(
        self,
        store: Store | StepOutput,
        queue: deque[tuple[Any, ...]],
        *,
        labels: dict[str, str],
        timer: dev.CudaTimer | None,
        wall_of: Callable[[float], float],
        device: int | None,
        flops_per_token: float | None,
        peak_flops: float | None,
        outlier_factor: float,
        warmup_steps: int,
        flush_interval_seconds: float,
        scaler: Any = None,
    ):
        self.out: StepOutput = StoreOutput(store, labels) if isinstance(store, Store) else store
        self.store = store if isinstance(store, Store) else None  # None: records go to the agent
        self.labels = labels
        self._q = queue
        self._timer = timer
        self._wall_of = wall_of
        self._device = device
        self._fpt = flops_per_token
        self._peak = peak_flops
        self._outlier_factor = outlier_factor
        self._warmup = warmup_steps
        self._interval = flush_interval_seconds
        self._scaler = scaler
        self._recent: deque[float] = deque(maxlen=64)
        self._retry: deque[StepRecord] = deque()  # steps not yet buffered (store locked), oldest first
        self._held: StepRecord | None = None  # the last step, kept open for a checkpoint that may follow
        self._ckpt_open = False
        self._held_since = 0.0
        self._force_emit = False
        self._wake = threading.Event()
        self._cond = threading.Condition()
        self._requested = 0
        self._done = 0
        self._last_ok = True
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="gpulens-training-writer", daemon=True)
        self.listeners: list[Callable[[StepRecord], None]] = []
        self.steps_written = 0
        self.write_failures = 0
        self.steps_dropped = 0  # steps dropped from a full retry queue (see MAX_RETRY_STEPS)
        self.outliers = 0
        self.nan_losses = 0

    # ------------------------------------------------------------ thread control
    def start(self) -> None:
        self._thread.start()

    def flush(self, timeout_seconds: float = 10.0, final: bool = False) -> bool:
        """Ask the thread for a full cycle (drain + commit) and wait for it. True if it committed."""
        if not self._thread.is_alive():
            return self._cycle(final=True)
        with self._cond:
            self._requested += 1
            want = self._requested
            self._force_emit = True
        self._wake.set()
        deadline = time.monotonic() + timeout_seconds
        with self._cond:
            while self._done < want:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return self._last_ok

    def stop(self, timeout_seconds: float = 30.0) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout_seconds)
        if self._thread.is_alive():
            log.warning("gpulens: the training writer did not finish within %.0f s; some steps may be lost.", timeout_seconds)

    def _run(self) -> None:
        backoff = self._interval
        while True:
            self._wake.wait(backoff)
            self._wake.clear()
            stopping = self._stopping
            with self._cond:
                want = self._requested
                force, self._force_emit = self._force_emit, False
            ok = self._cycle(final=stopping, emit_held=force)
            backoff = self._interval if ok else min(MAX_BACKOFF_SECONDS, max(backoff, self._interval) * 2)
            with self._cond:
                self._last_ok = ok
                self._done = want
                self._cond.notify_all()
            if stopping:
                if ok:
                    return
                # Closing with a failing store: a few more tries, then give up rather than hang.
                for _ in range(3):
                    time.sleep(min(backoff, 2.0))
                    if self._commit():
                        return
                log.error("gpulens: %s.", self.out.describe_pending())
                return

    def _cycle(self, final: bool, emit_held: bool = False) -> bool:
        try:
            self._drain(final, emit_held)
        except Exception:  # a bug here must not stop the recording of later steps
            log.exception("gpulens: could not process training steps")
        return self._commit()

    def _commit(self) -> bool:
        if self._retry:
            self._retry_unwritten()
            if self._retry:
                self._note_failure(StoreError(f"{len(self._retry)} step(s) wait for the store to accept writes."))
                return False
        try:
            self.out.commit()
        except StoreError as e:
            self._note_failure(e)
            return False
        except Exception:
            self.write_failures += 1
            log.exception("gpulens: writing training steps failed")
            return False
        if not self._last_ok:
            log.info("gpulens: the store accepts writes again.")
        return True

    def _note_failure(self, e: Exception) -> None:
        self.write_failures += 1
        if self._last_ok or self.write_failures % 10 == 0:
            log.warning("gpulens: writing training steps failed (%s); retrying, the training continues.", e)

    # ------------------------------------------------------------ queue -> records
    def _drain(self, final: bool, emit_held: bool = False) -> None:
        self._retry_unwritten()
        q = self._q
        while q:
            item = q[0]
            kind = item[0]
            if kind == "step":
                ev1 = item[12]
                if ev1 is not None and not final and not self._timer.ready(ev1):  # type: ignore[union-attr]
                    break  # the GPU has not got there yet; read it next time
                q.popleft()
                self._add_step(item, final)
            elif kind == "ckpt_begin":
                q.popleft()
                self._ckpt_open = True
            elif kind == "ckpt":
                q.popleft()
                self._add_checkpoint(item[1], item[2])
            elif kind == "loss":
                q.popleft()
                self._add_loss(item[1], item[2])
            elif kind == "eval":
                q.popleft()
                self._add_evaluation(item[1], item[2], item[3])
            else:  # ("event", kind, t, data)
                q.popleft()
                self._guard(lambda it=item: self.out.event(it[1], it[2], it[3]))
        if self._held is not None:
            # The last step stays open until the next one ends (or for HOLD_SECONDS), so that a
            # checkpoint saved after it, or a loss logged after it, is charged to it.
            held_for = time.monotonic() - self._held_since
            if final or (not self._ckpt_open and (emit_held or held_for > HOLD_SECONDS)):
                self._emit(self._held)
                self._held = None

    def _add_step(self, item: tuple[Any, ...], final: bool) -> None:
        _, index, t_begin, wait_s, t0, t1, comm_s, samples, tokens, loss, loss_scale, ev0, ev1 = item
        busy_s = t1 - t0
        if ev1 is not None:
            if final:
                ev1.synchronize()
            busy_s = self._timer.elapsed_seconds(ev0, ev1)  # type: ignore[union-attr]
        compute_s = max(0.0, busy_s - (comm_s or 0.0))
        wall = (t1 - t0) + (wait_s or 0.0)  # comm wait happens inside the step block
        rec = StepRecord(
            t_start=self._wall_of(t_begin),
            t_end=self._wall_of(t1),
            step=index,
            step_s=wall,
            data_wait_s=wait_s,
            compute_s=compute_s,
            comm_wait_s=comm_s,
            checkpoint_s=0.0,
            samples=samples,
            tokens=tokens,
            loss=_to_float(loss),
            loss_scale=_to_float(loss_scale) if loss_scale is not None else self._scale(),
            pid=None,
            rank=int(self.labels.get("rank", 0)),
        )
        reading = dev.read_allocator(self._device)
        rec.mem_alloc, rec.mem_peak, rec.mem_reserved = reading.allocated_bytes, reading.peak_bytes, reading.reserved_bytes
        if self._held is not None:
            self._emit(self._held)
        self._held = rec
        self._held_since = time.monotonic()

    def _add_checkpoint(self, t0: float, t1: float) -> None:
        self._ckpt_open = False
        seconds = t1 - t0
        rec = self._held
        if rec is None:  # a checkpoint before the first step: its own sample
            self._guard(lambda: self.out.sample(N.TRAIN_CHECKPOINT_SECONDS, self._wall_of(t1), seconds))
            return
        rec.checkpoint_s = (rec.checkpoint_s or 0.0) + seconds
        rec.step_s = (rec.step_s or 0.0) + seconds
        rec.t_end = self._wall_of(t1)

    def _add_evaluation(self, steps_before: int, t0: float, t1: float) -> None:
        """An evaluation run: a sample of its own and an event; the steps around it are untouched."""
        seconds, t = t1 - t0, self._wall_of(t1)
        data = {"seconds": seconds, "t_start": self._wall_of(t0), "after_step": steps_before - 1 if steps_before else None,
                "pid": os.getpid(), "rank": int(self.labels.get("rank", 0))}
        self._guard(lambda: self.out.evaluation(t, seconds, data))

    def _add_loss(self, t: float, loss: Any) -> None:
        value = _to_float(loss)
        if value is None:
            return
        if self._held is not None and self._held.loss is None:
            self._held.loss = value
            return
        # The step is already written: a sample of its own (and the NaN check).
        self._guard(lambda: self.out.sample(N.TRAIN_LOSS, self._wall_of(t), value))
        if not math.isfinite(value):
            self.nan_losses += 1
            self._guard(lambda: self.out.event(N.EV_TRAIN_NAN, self._wall_of(t), {"loss": repr(value), "pid": os.getpid(), "rank": int(self.labels.get("rank", 0))}))

    def _scale(self) -> float | None:
        if self._scaler is None:
            return None
        try:
            return float(self._scaler.get_scale())
        except Exception:
            return None

    def _emit(self, rec: StepRecord) -> None:
        rec.pid = os.getpid()
        dur = rec.duration_seconds
        if rec.tokens and self._fpt and self._peak and dur > 0:
            rec.mfu = rec.tokens / dur * self._fpt / self._peak
        self._check_outlier(rec)
        if rec.loss is not None and not math.isfinite(rec.loss):
            self.nan_losses += 1
            self._guard(lambda: self.out.event(N.EV_TRAIN_NAN, rec.t_end, {"step": rec.step, "loss": repr(rec.loss), "pid": rec.pid, "rank": rec.rank}))
        if self._retry or not self._write(rec):
            self._retry.append(rec)
            if len(self._retry) > MAX_RETRY_STEPS:  # a store gone for good must not eat the job's memory
                self._retry.popleft()
                self.steps_dropped += 1
                if self.steps_dropped == 1:
                    log.error("gpulens: the store refuses writes and %d steps wait: the oldest are dropped from "
                              "now on (StepWriter.steps_dropped)", MAX_RETRY_STEPS)
        else:
            self.steps_written += 1
        for fn in self.listeners:
            try:
                fn(rec)
            except Exception:
                log.exception("gpulens: a step listener failed")

    def _write(self, rec: StepRecord) -> bool:
        """Hand one step to the output. False (nothing taken) if a new series cannot be created
        now; the step is then retried on the next cycle, in order."""
        try:
            if self.out.step(rec):
                return True
        except StoreError as e:
            log.debug("gpulens: step %s deferred: %s", rec.step, e)
        self.write_failures += 1
        return False

    def _retry_unwritten(self) -> None:
        while self._retry:
            if not self._write(self._retry[0]):
                return
            self._retry.popleft()
            self.steps_written += 1

    def _check_outlier(self, rec: StepRecord) -> None:
        """Flag a step far outside the recent baseline (median of the last 64 steps after warm-up)."""
        dur = rec.duration_seconds
        if rec.step is not None and rec.step < self._warmup:
            return
        if len(self._recent) >= 8:
            base = statistics.median(self._recent)
            if base > 0 and dur > self._outlier_factor * base:
                self.outliers += 1
                parts = {"data_wait": rec.data_wait_s or 0.0, "checkpoint": rec.checkpoint_s or 0.0, "comm_wait": rec.comm_wait_s or 0.0, "compute": rec.compute_s or 0.0}
                data = {"step": rec.step, "step_s": dur, "baseline_s": base, "ratio": dur / base, "cause": max(parts, key=parts.__getitem__), "pid": os.getpid(), "rank": rec.rank}
                self._guard(lambda: self.out.event(N.EV_TRAIN_STEP_OUTLIER, rec.t_end, data))
        self._recent.append(dur)

    def _guard(self, fn: Callable[[], None]) -> None:
        """Run a store call; a failing commit keeps its rows buffered in the store for the next one."""
        try:
            fn()
        except StoreError as e:
            self.write_failures += 1
            log.debug("gpulens: store write deferred: %s", e)


def _to_float(v: Any) -> float | None:
    if v is None:
        return None
    try:
        if hasattr(v, "item"):
            v = v.detach().item() if hasattr(v, "detach") else v.item()
        return float(v)
    except Exception:
        return None
