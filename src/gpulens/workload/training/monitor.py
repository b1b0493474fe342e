"""TrainingMonitor: times a user's own training loop and writes one record per step to the store.

The loop's thread only reads the monitor's clock (`time.perf_counter()` unless a `clock=` is
injected: a test's `FakeClock`) and appends a tuple to a queue (about a microsecond per hook); a background thread turns the queue into step records, reads CUDA events
once the GPU has passed them, checks for NaN losses and outlier steps, and writes the store. A
failing store write is logged and retried there, never raised into the loop.

    mon = TrainingMonitor(job="llama-ft", store="run.db", flops_per_token=6 * n_params)
    for batch in mon.data(loader):                      # times the wait for each batch
        with mon.step(samples=len(batch), tokens=n) as s:
            loss = model(batch).loss; loss.backward()
            with mon.comm(): all_reduce(...)             # or ddp_comm_hook / timed_collectives
            opt.step(); s.loss = loss                    # a tensor is read lazily
        if step % 1000 == 0:
            with mon.checkpoint(): save(...)
    mon.close()

With `agent="unix:/run/gpulens/ingest.sock"` (or $GPULENS_AGENT, which the Helm chart sets) the
records go to the node's agent over its socket instead of into a store file; the loop's side is the
same, and the writer thread hands records to a sender thread (`workload.agent_client`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpulens.clock import Clock, as_clock
from gpulens.errors import MonitorUsageError, StoreError
from gpulens.k8s.node import node_host
from gpulens.store import DEFAULT_STORE_PATH, Store
from gpulens.vocab import names as N
from gpulens.workload import exit_flush
from gpulens.workload.agent_client import AgentSender, agent_address_for
from gpulens.workload.training import device as dev
from gpulens.workload.training.distributed import detect_rank
from gpulens.workload.training.outputs import AgentOutput
from gpulens.workload.training.writer import StepWriter

log = logging.getLogger(__name__)

# Set by `gpulens tune` for the training command it runs: the store to write to (when the code
# passes none) and the trial's tag, recorded in the monitor's train_start event.
ENV_STORE = "GPULENS_STORE"
ENV_RUN = "GPULENS_RUN"


class StepContext:
    """What `mon.step()` returns: set `loss` (a float or a tensor, read lazily) and optionally
    `loss_scale` inside the block."""

    __slots__ = ("_mon", "samples", "tokens", "loss", "loss_scale")

    def __init__(self, mon: TrainingMonitor):
        self._mon = mon
        self.samples: int | None = None
        self.tokens: int | None = None
        self.loss: Any = None
        self.loss_scale: Any = None

    def __enter__(self) -> StepContext:
        self._mon._enter_step()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self._mon._exit_step(self, exc)
        return False  # never swallow the loop's own exception (an OOM is recorded, then re-raised)


class TrainingMonitor:
    """Per-step timing of a training loop, written to a gpulens store.

    job: the job's name (label `job`). store: a `Store` or a path (default: $GPULENS_STORE, else
    the default store). flops_per_token: model FLOPs per
    token (≈ 6 × parameters) for MFU. peak_flops: the GPU's peak FLOP/s, overriding the catalog.
    rank/world_size: default from torch.distributed or torchrun's environment. cuda_timing: time
    the step's GPU work with CUDA events read back lazily (default: when CUDA is available).
    sync_every: synchronize the device every N steps so wall-clock step times stay anchored to the
    GPU (0 = never). flush_interval_seconds: how often the background writer commits.
    outlier_factor: a step longer than this × the recent median is flagged. scaler: a GradScaler
    whose scale is recorded with each step. gpu_name: the GPU model whose peak is looked up in the
    planner's catalog (default: torch's name of the current device). agent: the node agent's
    address, "unix:PATH" or "127.0.0.1:PORT", to send records to instead of a store file; default
    $GPULENS_AGENT unless a `Store` is passed; "off" writes the store. clock: where every duration
    (`clock.monotonic()`) and timestamp (`clock.time()`, read once and carried forward by the
    monotonic clock) comes from; default the real clock, a `gpulens.clock.FakeClock` in tests. With
    CUDA timing the step's GPU time still comes from CUDA events.
    """

    def __init__(
        self,
        job: str,
        store: Store | str | os.PathLike[str] | None = None,
        *,
        flops_per_token: float | None = None,
        peak_flops: float | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        host: str | None = None,
        cuda_timing: bool | None = None,
        sync_every: int = 0,
        flush_interval_seconds: float = 1.0,
        outlier_factor: float = 3.0,
        warmup_steps: int = 5,
        scaler: Any = None,
        gpu_name: str | None = None,
        config: dict[str, Any] | None = None,
        clock: Clock | Callable[[], float] | None = None,
        agent: str | None = None,
    ):
        if not job or not isinstance(job, str):
            raise MonitorUsageError(f"The job name must be a non-empty string, not {job!r}.", hint="Pass job='my-run'.")
        if sync_every < 0 or flush_interval_seconds <= 0 or outlier_factor <= 1:
            raise MonitorUsageError(
                "sync_every must be ≥ 0, flush_interval_seconds > 0 and outlier_factor > 1.",
                hint="Use the defaults unless you have a reason: sync_every=0, flush_interval_seconds=1, outlier_factor=3.",
            )
        address = agent_address_for(agent, store)
        self.sender: AgentSender | None = None
        if address is not None:
            self.store = None
            self._owns_store = False
        else:
            if store is None:  # a tuner (`gpulens tune train`) points the user's monitor at its store this way
                store = os.environ.get(ENV_STORE) or None
            self._owns_store = not isinstance(store, Store)
            self.store = store if isinstance(store, Store) else Store(Path(store) if store is not None else DEFAULT_STORE_PATH)
        det_rank, det_world, local_rank = detect_rank()
        self.job = job
        self.rank = det_rank if rank is None else int(rank)
        self.world_size = det_world if world_size is None else int(world_size)
        self.host = node_host(host)
        self.pid = os.getpid()
        self.device = dev.device_index()
        self.gpu_name = gpu_name or dev.device_name(self.device)
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops if peak_flops is not None else dev.catalog_peak_flops(self.gpu_name)
        if flops_per_token and not self.peak_flops:
            log.info("MFU is not recorded: the GPU's peak FLOP/s is unknown; pass peak_flops=.")
        self.labels = {N.TRAIN_JOB_LABEL: job, "rank": str(self.rank), "host": self.host}
        use_cuda = dev.cuda_available() if cuda_timing is None else bool(cuda_timing)
        if use_cuda and not dev.cuda_available():
            raise MonitorUsageError("cuda_timing=True needs CUDA, and torch sees no CUDA device.", hint="Leave cuda_timing unset on a CPU.")
        self._timer = dev.CudaTimer() if use_cuda else None
        self._sync_every = sync_every
        self._scaler = scaler
        # Hot-path state, touched only by the loop's thread.
        self.clock = as_clock(clock)
        self._perf = self.clock.monotonic
        self._wall0 = self.clock.time()
        self._perf0 = self._perf()
        self._in_step = False
        self._closed = False
        self._step_index = 0
        self._wait_t0: float | None = None
        self._wait_s = 0.0
        self._t0 = 0.0
        self._ev0: Any = None
        self._comm_s = 0.0
        self._comm_used = False
        self._comm_lock = threading.Lock()  # comm hooks may run on a communication thread
        self._ctx = StepContext(self)
        self._queue: deque[tuple[Any, ...]] = deque()
        if address is not None:
            self.sender = AgentSender(address, name="gpulens-training-sender")
        self.writer = StepWriter(
            self.store if self.sender is None else AgentOutput(self.sender, self.labels),
            self._queue,
            labels=self.labels,
            timer=self._timer,
            wall_of=self.wall_of,
            device=self.device,
            flops_per_token=flops_per_token,
            peak_flops=self.peak_flops,
            outlier_factor=outlier_factor,
            warmup_steps=warmup_steps,
            flush_interval_seconds=flush_interval_seconds,
            scaler=scaler,
        )
        start = {
            "pid": self.pid,
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": local_rank,
            "gpu": self.device,
            "gpu_name": self.gpu_name,
            "peak_flops": self.peak_flops,
            "flops_per_token": flops_per_token,
            "cuda_timing": self._timer is not None,
            "config": config or {},
        }
        if os.environ.get(ENV_RUN):  # the tune trial this process belongs to (see ENV_RUN)
            start["run"] = os.environ[ENV_RUN]
        self._queue.append(("event", N.EV_TRAIN_START, self._wall0, start))
        self.writer.start()
        # A script that forgets close(), or is ended by SIGTERM, still gets its last steps written.
        exit_flush.register(self, self.close)

    # ------------------------------------------------------------ clock
    def wall_of(self, perf: float) -> float:
        """Unix seconds of a monotonic reading (one clock read per hook instead of two)."""
        return self._wall0 + (perf - self._perf0)

    @property
    def in_step(self) -> bool:
        return self._in_step

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------ hooks
    def data(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Iterate `iterable`, timing how long each batch takes to arrive (the data wait)."""
        if self._closed:
            raise MonitorUsageError("mon.data() was called after mon.close().", hint="Create a new TrainingMonitor for a new run.")
        perf = self._perf
        it = iter(iterable)
        while True:
            t0 = perf()
            try:
                batch = next(it)
            except StopIteration:
                return
            self._wait_t0 = t0
            self._wait_s = perf() - t0
            yield batch

    def step(self, samples: int | None = None, tokens: int | None = None) -> StepContext:
        """A context manager around one training step (forward, backward, optimizer)."""
        ctx = self._ctx
        ctx.samples = samples
        ctx.tokens = tokens
        ctx.loss = None
        ctx.loss_scale = None
        return ctx

    def _enter_step(self) -> None:
        if self._in_step:
            raise MonitorUsageError(
                "mon.step() was entered while another step is still open (a step inside a step).",
                hint="Close each `with mon.step():` block before starting the next one.",
            )
        if self._closed:
            raise MonitorUsageError("mon.step() was used after mon.close().", hint="Create a new TrainingMonitor for a new run.")
        if self.pid != exit_flush.current_pid:
            raise MonitorUsageError(
                f"this TrainingMonitor was made in process {self.pid} and is used in {exit_flush.current_pid}, a fork "
                "of it (a DataLoader or pool worker): a worker has no training steps of its own, and its copy has "
                "no sender or flusher thread.",
                hint="Record steps in the process that trains; create a monitor after the fork only for a process "
                     "that trains on its own.")
        self._in_step = True
        self._comm_s = 0.0
        if self._timer is not None:
            self._ev0 = self._timer.record()
        self._t0 = self._perf()

    def _exit_step(self, ctx: StepContext, exc: BaseException | None) -> None:
        if self._timer is not None:
            ev1 = self._timer.record()
            if self._sync_every and self._step_index % self._sync_every == 0:
                dev.torch_module().cuda.synchronize()  # type: ignore[union-attr]
        else:
            ev1 = None
        t1 = self._perf()
        self._in_step = False
        if exc is not None:
            self._wait_t0 = None
            if dev.is_oom(exc):
                self._record_oom(exc, t1)
            return
        wait_t0, wait_s = self._wait_t0, self._wait_s
        self._wait_t0 = None
        self._queue.append(
            ("step", self._step_index, wait_t0 if wait_t0 is not None else self._t0, wait_s if wait_t0 is not None else None,
             self._t0, t1, self._comm_s if self._comm_used else None, ctx.samples, ctx.tokens, ctx.loss, ctx.loss_scale, self._ev0, ev1)
        )
        self._step_index += 1

    @contextmanager
    def comm(self) -> Iterator[None]:
        """Time a block of communication (a collective, a barrier) inside the current step."""
        if not self._in_step:
            raise MonitorUsageError(
                "mon.comm() was used outside a step.", hint="Put `with mon.comm():` inside `with mon.step():`."
            )
        t0 = self._perf()
        try:
            yield
        finally:
            self.add_comm_wait(self._perf() - t0)

    def add_comm_wait(self, seconds: float) -> None:
        """Charge `seconds` of communication wait to the current step (for hooks and wrappers)."""
        self._comm_used = True  # from now on a step without communication records 0, not "unmeasured"
        with self._comm_lock:
            self._comm_s += seconds

    @contextmanager
    def checkpoint(self) -> Iterator[None]:
        """Time a checkpoint save; it is charged to the step that just ended."""
        if self._closed:
            raise MonitorUsageError("mon.checkpoint() was used after mon.close().", hint="Save checkpoints while the monitor is open.")
        if self._in_step:
            raise MonitorUsageError(
                "mon.checkpoint() was used inside a step.", hint="Save the checkpoint after the `with mon.step():` block."
            )
        self._queue.append(("ckpt_begin",))
        t0 = self._perf()
        try:
            yield
        finally:
            self._queue.append(("ckpt", t0, self._perf()))

    @contextmanager
    def evaluation(self) -> Iterator[None]:
        """Time an evaluation run between steps: its own phase (`train_eval_seconds`), neither part
        of a step nor data wait of the next one."""
        if self._in_step:
            raise MonitorUsageError("mon.evaluation() was used inside a step.", hint="Evaluate after the `with mon.step():` block.")
        t0 = self._perf()
        try:
            yield
        finally:
            self._add_evaluation(t0, self._perf())

    def record_evaluation(self, seconds: float) -> None:
        """An evaluation that just ended after `seconds`, measured by the caller (framework callbacks)."""
        now = self._perf()
        self._add_evaluation(now - max(0.0, seconds), now)

    def _add_evaluation(self, t0: float, t1: float) -> None:
        if self._closed:
            raise MonitorUsageError("An evaluation was recorded after mon.close().", hint="Evaluate while the monitor is open.")
        self._wait_t0 = None  # the wait measured before the evaluation is not the next step's
        self._queue.append(("eval", self._step_index, t0, t1))

    # ------------------------------------------------------------ for framework callbacks
    def begin_step(self, samples: int | None = None, tokens: int | None = None) -> StepContext:
        """Open a step without a `with` block (for callbacks with separate begin/end hooks)."""
        ctx = self.step(samples, tokens)
        ctx.__enter__()
        return ctx

    def end_step(self, exc: BaseException | None = None) -> None:
        """Close the step opened by `begin_step`; pass the exception if the step failed."""
        if not self._in_step:
            raise MonitorUsageError("end_step() was called with no step open.", hint="Call begin_step() first.")
        self._exit_step(self._ctx, exc)

    @property
    def current_step(self) -> StepContext | None:
        return self._ctx if self._in_step else None

    def record_data_wait(self, seconds: float) -> None:
        """The wait for the next batch, measured by the caller (charged to the next step)."""
        now = self._perf()
        self._wait_t0 = now - max(0.0, seconds)
        self._wait_s = max(0.0, seconds)

    def record_checkpoint(self, seconds: float) -> None:
        """A checkpoint that just ended after `seconds`, measured by the caller."""
        if self._closed:
            raise MonitorUsageError("record_checkpoint() was used after mon.close().", hint="Save checkpoints while the monitor is open.")
        now = self._perf()
        self._queue.append(("ckpt_begin",))
        self._queue.append(("ckpt", now - max(0.0, seconds), now))

    def record_loss(self, loss: Any) -> None:
        """A loss reported after its step (e.g. by a logging hook): attached to the last step."""
        self._queue.append(("loss", self._perf(), loss))

    # ------------------------------------------------------------ failures
    def _record_oom(self, exc: BaseException, t1: float) -> None:
        try:
            data = dev.oom_details(exc, self.device)
            data.update(step=self._step_index, pid=self.pid, rank=self.rank)
            self._queue.append(("event", N.EV_TRAIN_OOM, self.wall_of(t1), data))
            # The job may be about to die: get the record to disk now.
            self.flush(timeout_seconds=5.0)
        except Exception:  # recording must never replace the user's error
            log.exception("could not record an out-of-memory error")

    # ------------------------------------------------------------ lifecycle
    def flush(self, timeout_seconds: float = 10.0) -> bool:
        """Write everything measured so far; True when it reached the store (or the agent stored it)."""
        ok = self.writer.flush(timeout_seconds=timeout_seconds, final=False)
        if self.sender is not None:
            ok = self.sender.flush(timeout_seconds) and ok
        return ok

    def close(self) -> None:
        """Write what is left and stop the writer. Idempotent."""
        if self._closed:
            return
        self._closed = True
        exit_flush.unregister(self)
        self.writer.stop()
        if self.sender is not None:
            self.sender.close()
        if self._owns_store:
            try:
                self.store.close()
            except StoreError as e:
                log.warning("gpulens: could not close the store: %s", e)

    def __enter__(self) -> TrainingMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ stats for tests and callbacks
    @property
    def steps_recorded(self) -> int:
        return self._step_index

    def on_step(self, fn: Callable[[Any], None]) -> None:
        """Call `fn(StepRecord)` in the writer thread after each step is written (e.g. live display)."""
        self.writer.listeners.append(fn)
